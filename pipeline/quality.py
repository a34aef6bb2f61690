"""Quality beside speed: what each compared configuration sends of the gradient, and the rule
the verdict weighs it by.

For every (compressor, density) that ``sidco compare`` and the dashboard's What-if page rank,
:func:`measure` gives the quality columns (:data:`COLUMNS`):

- ``achieved_density``: elements sent ÷ elements, the mean over the replayed calls, and
  ``achieved_over_target``: that ÷ the target density (``None`` for compressors that take none);
- ``energy_vs_topk``: the squared norm of what the compressor sends ÷ that of exact Top-k at
  the same target density, on the same input (the mean over the calls; 1.0 = as good as
  Top-k). Compressors that take no density get the quantity that fits them: 1.0 for ``none``
  and the fp16/bf16 casts (every coordinate is sent), PowerSGD the share of the gradient's
  squared norm its rank captures; ``energy``: the share of the input's squared norm sent;
- ``quality_source``: where these come from, by the one rule :data:`QUALITY_RULE`.

:func:`called` is the one quality rule of the verdict (:data:`CALL_RULE`) and :func:`sends_little`
the flag on a dense baseline that sends little; :func:`pipeline.verdict.judge` weighs them.

The shipped table (:data:`profiles.QUALITY`, ``profiles/quality.json``) is written by
:func:`build_table` (``sidco quality-table``): real training of built-in workloads, each
trace replayed through every compressor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import profiles
from pipeline.request import pair as pair_of, takes_density
from results.store import Store
from units import NO_DENSITY_STORED, Pair

if TYPE_CHECKING:
    from pipeline.project import Source

DENSITY_FACTOR = 2.0
"""A sparsifier is called only if its achieved density is within this factor of its target."""

ENERGY_FLOOR = 0.5
"""A sparsifier is called only if it sends at least this share of the energy exact Top-k sends
at the same target density (``energy_vs_topk >= ENERGY_FLOOR``)."""

UNMEASURED = "unmeasured"
"""The ``quality_source`` of a row no replay measured."""

TABLE_DENSITIES: tuple[float, ...] = (0.1, 0.05, 0.01, 0.005, 0.001)
"""The densities the shipped table holds (a layout's row at another density is unmeasured)."""

TABLE_WORKLOADS: tuple[str, ...] = ("resnet20", "vgg16", "transformer")
"""The built-in workloads the shipped table captures: two CNNs and a GPT-style decoder."""

TABLE_RANK = 1
"""PowerSGD's rank in the shipped table (``sidco compare``'s default ``--rank``)."""

QUALITY_RULE = (
    "quality (achieved density, energy vs Top-k) comes from, in order: with --trace, that trace's stored "
    "replays with error feedback (replayed now on the CPU where missing); with --layout, the shipped table "
    "(profiles/quality.json, built by `sidco quality-table`) for the captured workload of the layout's family "
    "(cnn or transformer) nearest to it by name; otherwise unmeasured"
)
"""Where a row's quality comes from, as ``--help`` and the docs state it (the one home of the rule)."""

CALL_RULE = (
    f"a sparsifier is called only if its achieved density is within {DENSITY_FACTOR:g}x of its target and it "
    f"sends at least {ENERGY_FLOOR:g}x the squared norm exact Top-k sends at that density; the dense "
    "baselines (none, fp16, bf16, powersgd) are judged by speed, their energy shown"
)
"""The verdict's quality rule, as ``--help``, the docs and the verdict state it."""

COLUMNS = ("achieved_density", "achieved_over_target", "energy", "energy_vs_topk", "quality_source")
"""The quality keys every compared row carries."""

def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def columns(summary: Mapping[str, Any], compressor: str, density: float | None, source: str) -> dict[str, Any]:
    """The quality columns of one pair from a replay summary (:meth:`results.store.Store.replay_quality`
    or a row of the shipped table): ``energy_vs_topk`` by the compressor's kind (module docstring)."""
    from compressors import message_kind

    energy = summary.get("energy")
    if takes_density(compressor):
        versus = summary.get("energy_vs_topk")
    elif message_kind(compressor) == "lowrank":
        versus = energy
    else:
        versus = 1.0
    return {"achieved_density": summary.get("achieved_density"),
            "achieved_over_target": summary.get("achieved_over_target") if density is not None else None,
            "energy": energy, "energy_vs_topk": versus, "quality_source": source}


def unmeasured(why: str | None = None) -> dict[str, Any]:
    """The quality columns of a pair nothing measured (``quality_source`` :data:`UNMEASURED`,
    followed by ``why`` when given)."""
    return {**dict.fromkeys(COLUMNS[:-1]), "quality_source": UNMEASURED if why is None else f"{UNMEASURED}: {why}"}


def is_unmeasured(row: Mapping[str, Any]) -> bool:
    """Whether ``row``'s quality was measured by nothing."""
    return str(row.get("quality_source") or UNMEASURED).startswith(UNMEASURED)


def _replay_rank(config: Mapping[str, Any]) -> int:
    return int(config.get("options", {}).get("powersgd", {}).get("rank", 1))


def _summaries(store: Store, trace_id: int, pairs: Sequence[Pair],
               rank: int = 1) -> dict[Pair, tuple[int, dict[str, Any]]]:
    """Per pair, the newest replay of trace ``trace_id`` that measured it with error feedback in
    every call (PowerSGD only at ``rank``): ``(replay id, its replay_quality summary)``."""
    found: dict[Pair, tuple[int, dict[str, Any]]] = {}
    for replay in store.replays_of_trace(trace_id):
        config = json.loads(replay.get("config_json") or "{}")
        if not config.get("error_feedback", True):
            continue
        for pair in map(Pair._make, pairs):
            if pair in found or (pair[0] == "powersgd" and _replay_rank(config) != rank):
                continue
            summary = store.replay_quality(replay["id"], pair.compressor, pair.stored_density)
            if summary is not None and summary["measured"] == summary["calls"]:
                found[pair] = (int(replay["id"]), summary)
    return found


def from_replays(store: Store, trace_id: int, pairs: Sequence[Pair], rank: int = 1) -> dict[Pair, dict[str, Any]]:
    """The quality of each pair that a stored replay of trace ``trace_id`` measured with error
    feedback in every call (the newest replay that holds a pair wins; PowerSGD only at ``rank``)."""
    return {pair: columns(summary, pair[0], pair[1], f"replay #{replay_id} of trace #{trace_id} "
                                                     f"({summary['calls']} calls)")
            for pair, (replay_id, summary) in _summaries(store, trace_id, pairs, rank).items()}


def replay_missing(store: Store, trace_path: str | Path, trace_id: int, pairs: Sequence[Pair], rank: int = 1,
                   progress: Callable[[str, int, int], None] | None = None) -> None:
    """Replay (on the CPU, whole model, error feedback on: ``sidco replay``'s defaults) the pairs
    of ``pairs`` that no stored replay of the trace measured; stored like any replay.
    ``progress(what, calls_done, calls_total)`` after every call."""
    from pipeline import replay

    have = _summaries(store, trace_id, pairs, rank)
    missing = [p for p in pairs if p not in have]
    options = {"powersgd": {"rank": rank}} if rank != 1 else None
    sparse = [n for n, d in missing if d is not None]
    groups = [(list(dict.fromkeys(sparse)), list(dict.fromkeys(d for _, d in missing if d is not None))),
              ([n for n, d in missing if d is None], [NO_DENSITY_STORED])]
    for names, densities in groups:
        if not names:
            continue
        what = f"replay {','.join(names)}"
        replay.run(store, trace_path, names, densities, options=options,
                   progress=None if progress is None else lambda done, total, what=what: progress(what, done, total))


def read_table(path: str | Path | None = None) -> dict[str, Any] | None:
    """The shipped quality table (``profiles/quality.json``), or ``None`` when there is none."""
    path = Path(path or profiles.QUALITY)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def nearest(layout: str, table: Mapping[str, Any]) -> dict[str, Any] | None:
    """The table's workload nearest to ``layout``: of the same family (:func:`costs.throughput.layout_kind`,
    ``cnn`` or ``transformer``; the table's entries were classified by the same rule), the one
    whose name shares the longest beginning with the layout's (``resnet50`` → ``resnet20``,
    ``vgg19`` → ``vgg16``), the first in the table on a tie; ``None`` when the family has none."""
    from costs.throughput import layout_kind

    family = layout_kind(layout)

    def shared(name: str) -> int:
        count = 0
        for a, b in zip(name, layout):
            if a != b:
                break
            count += 1
        return count

    candidates = [w for w in table.get("workloads", []) if w.get("family") == family]
    return max(candidates, key=lambda w: shared(w["name"]), default=None)


def from_table(layout: str, pairs: Sequence[Pair], rank: int = 1,
               table: Mapping[str, Any] | None = None) -> dict[Pair, dict[str, Any]]:
    """The quality of each pair for ``layout`` from the shipped table's nearest workload
    (:func:`nearest`); pairs the table does not hold are left out."""
    table = read_table() if table is None else table
    entry = None if table is None else nearest(layout, table)
    if entry is None:
        return {}
    names = entry["columns"]
    rows = {pair_of(r["compressor"], r["density"]): r for r in (dict(zip(names, values)) for values in entry["rows"])}
    found: dict[Pair, dict[str, Any]] = {}
    for pair in pairs:
        row = rows.get(pair)
        if row is None or (pair[0] == "powersgd" and rank != int(table.get("powersgd_rank", TABLE_RANK))):
            continue
        source = f"shipped table: {entry['name']} (nearest {entry['family']}), {row['calls']} calls"
        found[pair] = columns(row, pair[0], pair[1], source)
    return found


def measure(store: Store, kind: str, ref: str, trace_id: int | None, pairs: Sequence[Pair], *, rank: int = 1,
            run_missing: bool = True,
            progress: Callable[[str, int, int], None] | None = None) -> dict[Pair, dict[str, Any]]:
    """The quality columns of every pair of a projection's workload (``kind`` ``trace`` with its
    directory ``ref`` and id ``trace_id``, or ``layout`` with its name ``ref``) by :data:`QUALITY_RULE`:
    a trace's stored replays (replayed now where missing when ``run_missing``, with
    ``progress(what, calls_done, calls_total)``; a dashboard request passes ``False``: nothing is
    run inside a web request), a layout's shipped table, otherwise :func:`unmeasured` with the reason."""
    pairs = list(dict.fromkeys(Pair(*p) for p in pairs))
    if kind == "trace" and trace_id is not None:
        if run_missing:
            replay_missing(store, ref, trace_id, pairs, rank, progress)
        found = from_replays(store, trace_id, pairs, rank)
        why = f"no replay of trace #{trace_id} holds it (sidco replay {ref})"
    elif kind == "layout":
        found = from_table(ref, pairs, rank)
        why = (f"the shipped table holds no {ref}-like workload at this density"
               + (f" or PowerSGD rank {rank}" if rank != TABLE_RANK else ""))
    else:
        found, why = {}, None
    return {p: found.get(p) or (whole(p[0]) if sends_everything(p[0]) else unmeasured(why)) for p in pairs}


def sends_everything(compressor: str) -> bool:
    """Whether ``compressor`` sends every coordinate (``none`` and the dense casts): its quality
    columns hold by definition (:func:`whole`) where no replay measured them."""
    from compressors import message_kind

    return compressor == "none" or message_kind(compressor) == "dense"


def whole(compressor: str) -> dict[str, Any]:
    """The quality columns of a compressor that sends every coordinate, by definition."""
    return columns({"achieved_density": 1.0, "energy": 1.0}, compressor, None,
                   "by definition: every coordinate sent")


def for_source(store: Store, source: Source, pairs: Sequence[Pair], *, rank: int = 1, run_missing: bool = True,
               progress: Callable[[str, int, int], None] | None = None) -> dict[Pair, dict[str, Any]]:
    """:func:`measure` for a projection's :class:`pipeline.project.Source` (registered: a trace has its id)."""
    return measure(store, source.kind, source.ref, source.trace_id, pairs, rank=rank, run_missing=run_missing,
                   progress=progress)


def attach(rows: Sequence[Mapping[str, Any]], quality: Mapping[Pair, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (projected, keys ``compressor`` and ``density``) each with its quality columns
    (:data:`COLUMNS`; unmeasured where ``quality`` lacks the pair)."""
    return [{**row, **(quality.get((row["compressor"], row.get("density"))) or unmeasured())} for row in rows]


def called(row: Mapping[str, Any]) -> bool | None:
    """The one quality rule (:data:`CALL_RULE`): ``True`` when ``row`` may be called, ``False``
    when it is a sparsifier that sends too far from its target density or too little of the
    gradient next to Top-k, ``None`` for a sparsifier whose quality is unmeasured."""
    if not takes_density(row["compressor"]):
        return True
    ratio, versus = row.get("achieved_over_target"), row.get("energy_vs_topk")
    if is_unmeasured(row) or ratio is None or versus is None:
        return None
    return 1.0 / DENSITY_FACTOR <= float(ratio) <= DENSITY_FACTOR and float(versus) >= ENERGY_FLOOR


def why(row: Mapping[str, Any]) -> str:
    """Why ``row`` (a sparsifier the rule does not call, :func:`called`) fails the rule, in a few
    words with its numbers."""
    ratio, versus = float(row["achieved_over_target"]), float(row["energy_vs_topk"])
    parts = []
    if versus < ENERGY_FLOOR:
        parts.append(f"energy {versus:.2g}x Top-k")
    if not 1.0 / DENSITY_FACTOR <= ratio <= DENSITY_FACTOR:
        parts.append(f"sends {ratio:.2g}x its target density")
    return f"{row['label']} ({', '.join(parts)})"


def sends_little(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is a dense baseline the rule does not gate (it takes no density) that still
    sends less of the gradient's squared norm than the rule asks of a sparsifier (PowerSGD at a
    low rank): the verdict flags it where it wins."""
    versus = row.get("energy_vs_topk")
    return (not takes_density(row["compressor"]) and not sends_everything(row["compressor"])
            and versus is not None and float(versus) < ENERGY_FLOOR)


def little_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The flag on ``rows`` (:func:`sends_little`), with their numbers and the rule's floor."""
    each = ", ".join(f"{r['label']} sends {float(r['energy_vs_topk']):.2g}x of the gradient's squared norm"
                     for r in rows)
    return f"{each} (a sparsifier is called only from {ENERGY_FLOOR:g}x of Top-k's)"


def build_table(store: Store, work: str | Path, *, workers: int = 4, iterations: int = 100, every: int = 20,
                image_data: str | None = None, progress: Callable[[str, int, int], None] | None = None
                ) -> dict[str, Any]:
    """The shipped quality table: each of :data:`TABLE_WORKLOADS` captured by real training
    (``workers`` simulated data-parallel workers, ``iterations`` steps, every ``every``-th
    recorded; images: the built-in class-template images, or CIFAR-10 from ``image_data``; text:
    the CPython documentation) into ``work``/NAME, replayed through every compressor at
    :data:`TABLE_DENSITIES` (whole model, error feedback, CPU; PowerSGD at :data:`TABLE_RANK`),
    and summarised per pair (:func:`columns` of :meth:`results.store.Store.replay_quality`).
    ``progress(what, done, total)`` as the work goes."""
    import torch

    import compressors
    from costs.throughput import kind_of
    from machine import device_identity
    from pipeline import capture
    from traces import workloads

    names = compressors.names()
    sparse = [n for n in names if takes_density(n)]
    dense = [n for n in names if not takes_density(n)]
    entries = []
    for workload in TABLE_WORKLOADS:
        image = workloads.SPECS[workload].kind == "image"
        data = image_data if image else None
        out = Path(work) / workload
        tick = None if progress is None else (lambda i, loss, w=workload: progress(f"capture {w}", i + 1, iterations))
        trace_id, trace = capture.run(store, workload, out, workers=workers, iterations=iterations, every=every,
                                      data=data, overwrite=True, progress=tick)
        pairs = [Pair(n, d) for d in TABLE_DENSITIES for n in sparse] + [Pair(n) for n in dense]
        replay_missing(store, trace.path, trace_id, pairs, TABLE_RANK, progress)
        found = _summaries(store, trace_id, pairs, TABLE_RANK)
        rows = []
        for measured in pairs:
            summary = found[measured][1]
            q = columns(summary, *measured, "")
            rows.append([measured.compressor, measured.stored_density, summary["calls"], _round(q["achieved_density"]),
                         _round(q["achieved_over_target"]), _round(q["energy"]), _round(q["energy_vs_topk"])])
        shapes = [tuple(shape) for _, shape in trace.layers]
        spec = workloads.SPECS[workload]
        data_name = ("CIFAR-10 (" + str(image_data) + ")" if data else "built-in class-template images") if image \
            else "CPython documentation (pydoc_data.topics)"
        entries.append({
            "name": workload, "family": kind_of(shapes, trace.forward_flops or [1.0] * len(shapes)),
            "data": data_name, "parameters": trace.numel, "width": spec.width, "batch_size": spec.batch_size,
            "workers": workers, "iterations": iterations, "recorded": list(trace.iterations),
            "columns": ["compressor", "density", "calls", "achieved_density", "achieved_over_target", "energy",
                        "energy_vs_topk"],
            "rows": rows,
        })
        del trace
    return {
        "what": ("Quality of every compressor on gradients of real training (simulated data parallelism), per "
                 "workload and density: mean achieved density and its ratio to the target, energy (share of "
                 "the compressor input's squared norm sent) and energy_vs_topk (that / exact Top-k's at the same "
                 "density; none, fp16, bf16: 1; powersgd: its captured energy at rank "
                 f"{TABLE_RANK}). Whole model as one bucket, error feedback on, replayed on the CPU. "
                 "sidco compare and the What-if page read it for layouts (the nearest workload of the "
                 "layout's family). Built by: sidco quality-table"),
        "command": "sidco quality-table",
        "created": time.strftime("%Y-%m-%d", time.gmtime()),
        "torch": torch.__version__,
        "machine": device_identity("cpu"),
        "powersgd_rank": TABLE_RANK,
        "densities": list(TABLE_DENSITIES),
        "workloads": entries,
    }
