"""Low-communication strategies beside the per-step compressors: rows ``sidco compare`` ranks together.

The model is :mod:`simulator.lowcomm` (DiLoCo, Streaming DiLoCo; time per inner step amortised,
the WAN's exposed time, compute utilization, the smallest H that hides the link); here a
:class:`pipeline.project.Projection` whose request names ``strategies`` becomes one row per
strategy, on the same cluster, workload, calibration and compression-cost policy as the
per-step rows, and every per-step row gains the same columns (``sync_every`` 1). The verdict
sentence on them weighs the loss penalty of syncing every H steps where the store measured it (a
DiLoCo convergence run of the projection's trace with the same H and outer compressor, against
its synchronous run at equal tokens: :func:`pipeline.penalty.loss_penalties`), and says it is
unmeasured otherwise: projected time alone cannot weigh it. Units: seconds, bytes, nats.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import simulator
from pipeline import project as projections
from pipeline import quality
from pipeline.costs import compression_profile
from pipeline.memory import STRATEGY_UNMODELLED, unmodelled
from pipeline.penalty import loss_penalties
from pipeline.request import DEFAULT_FRAGMENTS, Request, pair
from pipeline.verdict import BASELINES
from results.store import Store
from simulator import lowcomm
from units import Pair

LOSS_UNMEASURED = ("loss penalty against synchronous training at equal tokens unmeasured (it is measured for a trace "
                   "whose store holds a DiLoCo run of its configuration at this H and outer compressor: sidco "
                   "converge --sync-every): ranked by time alone")
"""What the verdict says of a strategy's loss where nothing measured it (DiLoCo is not synchronous SGD)."""


def fragments(request: Request, layers: int) -> int:
    """The fragments Streaming DiLoCo syncs in: the request's, else :data:`DEFAULT_FRAGMENTS` or
    the ``layers`` when fewer."""
    chosen = request.lowcomm.fragments
    return min(DEFAULT_FRAGMENTS, layers) if chosen is None else chosen


def strategies(projection: projections.Projection) -> list[lowcomm.Strategy]:
    """The strategies the projection's request names, checked against its workload (ValueError,
    one line: ``--fragments`` more than the layers) before any store is opened."""
    request = projection.request
    if not isinstance(request, Request):
        return []
    layers = len(projection.workload.layers)
    asked = request.lowcomm
    if asked.fragments is not None:
        lowcomm.check_fragments(projection.workload, asked.fragments)
    return [lowcomm.Strategy(name, asked.sync_every, fragments(request, layers) if name == "streaming" else 1,
                             asked.outer_compressor, asked.outer_density) for name in request.strategies]


def measured_penalty(store: Store, projection: projections.Projection,
                     strategy: lowcomm.Strategy) -> dict[str, Any] | None:
    """The stored loss penalty of ``strategy`` (its H, outer compressor and density) on the
    projection's trace: the last shared evaluation (:func:`pipeline.penalty.loss_penalties`'
    ``final``: ``tokens``, ``penalty`` in nats, its ``spread`` over the seeds, ``penalty_fraction``)
    with ``convergence_ids`` and ``seeds``; ``None`` for a layout or where no such run is stored."""
    source = projection.source
    if source.kind != "trace" or source.trace_id is None:
        return None
    run = next((c for c in store.convergences() if c["trace_id"] == source.trace_id), None)
    if run is None:
        return None
    found = loss_penalties(store, {**run, "config": json.loads(run["config_json"])})
    wanted = Pair(strategy.outer_compressor, strategy.outer_density)
    for variant in (found or {}).get("variants", []):
        outer = pair(variant["outer_compressor"] or "none", variant["outer_density"])
        if variant["sync_every"] == strategy.sync_every and outer == wanted and variant.get("final"):
            return {**variant["final"], "convergence_ids": variant["convergence_ids"], "seeds": variant["seeds"]}
    return None


def penalty_text(found: Mapping[str, Any] | None, name: str = "diloco") -> str:
    """A strategy's loss penalty in words: measured (nats ± the seeds' spread, share of the
    synchronous loss, at how many tokens, which runs), or :data:`LOSS_UNMEASURED`. For
    ``streaming`` the stored runs are DiLoCo's (no fragments): said so."""
    if found is None:
        return LOSS_UNMEASURED
    text = f"measured loss penalty {found['penalty']:+.4f}" if name == "diloco" else \
        f"loss penalty of its fragments unmeasured; DiLoCo's at this H measured {found['penalty']:+.4f}"
    if found.get("spread") is not None:
        text += f" ± {found['spread']:.4f}"
    text += " nats"
    if found.get("penalty_fraction") is not None:
        text += f" ({found['penalty_fraction']:+.1%} of the synchronous loss)"
    runs = ", ".join(str(i) for i in found["convergence_ids"])
    seeds = len(found["seeds"])
    return (f"{text} against synchronous training at {found['tokens']:,} tokens ({seeds} seed{'s' * (seeds > 1)}, "
            f"convergence {runs})")


def label(strategy: lowcomm.Strategy) -> str:
    """A strategy's row label: ``diloco H=50``, ``streaming H=50 F=4``, then the outer compressor
    when it is not ``none`` (``diloco H=50 topk@0.01``)."""
    text = f"{strategy.name} H={strategy.sync_every}" + (f" F={strategy.fragments}" if strategy.name == "streaming"
                                                          else "")
    if strategy.outer_compressor != "none":
        text += f" {Pair(strategy.outer_compressor, strategy.outer_density).label}"
    return text


def _base(store: Store, projection: projections.Projection):
    """The ``none`` scenario of the projection's cluster (its calibration and options)."""
    return projections.scenarios(store, projection, ["none"], None)[0]


def per_step(store: Store, projection: projections.Projection,
             rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (the per-step rows of ``projection``) each with the strategy columns
    (:func:`simulator.lowcomm.per_step_fields`: ``sync_every`` 1, ``utilization``, ``wan_exposed_s``)."""
    base = _base(store, projection)
    out = []
    for row in rows:
        name = row["compressor"]
        sc = base if name == "none" else projections.scenarios(store, projection, [name], row.get("density") or 1.0)[0]
        out.append({**row, **lowcomm.per_step_fields(sc, row)})
    return out


def strategy_rows(store: Store, projection: projections.Projection,
                  chosen: Sequence[lowcomm.Strategy] | None = None) -> list[dict[str, Any]]:
    """One row per strategy of ``projection`` (:func:`simulator.lowcomm.project`; ``chosen``: these
    strategies instead of those its request names, as ``sidco tta`` projects each stored DiLoCo
    variant), with ``label``,
    ``compressor`` (the strategy's name), ``density`` ``None``, ``cost_source`` (the outer
    compressor's), ``speedup`` (``none``'s per-step iteration ÷ this row's), the quality columns
    unmeasured, the memory keys unmodelled (:data:`pipeline.memory.STRATEGY_UNMODELLED`), the compute and
    cost sources of the per-step rows and ``loss_penalty``
    (:func:`measured_penalty`: DiLoCo's at the strategy's H and outer compressor, for ``streaming``
    too, whose fragments no stored run trains; ``None`` where unmeasured)."""
    chosen = strategies(projection) if chosen is None else list(chosen)
    if not chosen:
        return []
    base = _base(store, projection)
    none_s = simulator.simulate(base)["iteration_s"]
    source, request = projection.source, projection.request
    rows = []
    for strategy in chosen:
        outer, density = strategy.outer_compressor, strategy.outer_density
        profile = None
        if outer != "none":
            profile = compression_profile(store, trace_id=source.trace_id, device=source.device,
                                          pairs=[(outer, density or 1.0)], profile_file=request.profile_file,
                                          profile_id=request.profile_id,
                                          numel=projection.workload.nbytes // projection.workload.itemsize)
        result = lowcomm.project(base, strategy, profile)
        cost = None if profile is None else profile.cost(outer, density or 1.0)
        found = measured_penalty(store, projection, strategy)
        rows.append({**result, "compressor": strategy.name, "density": None, "label": label(strategy),
                     "device": source.device.name, "precision": source.precision, "compute_source": source.compute,
                     "cost_source": None if cost is None else cost.source, **projections.workload_facts(source),
                     "speedup": none_s / result["iteration_s"], "baseline_iteration_s": none_s,
                     "iteration_s_low": None, "iteration_s_high": None, "loss_penalty": found,
                     **quality.unmeasured("a strategy: its loss is weighed in the verdict"),
                     **unmodelled(STRATEGY_UNMODELLED)})
    return rows


def ranked(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-step and strategy ``rows`` together, fastest (per inner step) first, ``rank`` renumbered
    and ``speedup_over_baseline`` (the best dense baseline's iteration time ÷ this row's) set."""
    ordered = sorted(rows, key=lambda r: (float(r["iteration_s"]), r["label"]))
    baselines = [r for r in ordered if r["compressor"] in BASELINES]
    best = float(baselines[0]["iteration_s"]) if baselines else None
    return [{**row, "rank": i + 1, "speedup_over_baseline": None if best is None else best / float(row["iteration_s"])}
            for i, row in enumerate(ordered)]


def verdict_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The sentence on the strategies among ``rows`` (ranked): each one's time per inner step,
    utilization and the smallest H that hides the link, against the fastest per-step row, and its
    loss penalty where measured (:func:`penalty_text`), then those unmeasured with
    :data:`LOSS_UNMEASURED`; empty without strategy rows."""
    chosen = [r for r in rows if r["compressor"] in lowcomm.STRATEGIES]
    if not chosen:
        return ""
    step = [r for r in rows if r["compressor"] not in lowcomm.STRATEGIES]
    fastest = min(step, key=lambda r: float(r["iteration_s"])) if step else None
    parts = []
    for r in chosen:
        hides = f"H={r['hiding_sync_every']}"
        part = (f"{r['label']} {r['iteration_s'] * 1e3:.1f} ms per inner step, utilization {r['utilization']:.0%}, "
                f"WAN exposed {r['wan_exposed_s'] * 1e3:.1f} ms, "
                + (f"hides the link from {hides}" if r["compressor"] == "streaming" else
                   f"waits {r['outer_exchange_s']:.3g} s at every sync (overlapped, it would hide from {hides})"))
        if fastest is not None:
            part += f" ({float(fastest['iteration_s']) / float(r['iteration_s']):.2f}x the fastest per-step " \
                    f"{fastest['label']})"
        found = r.get("loss_penalty")
        parts.append(part if found is None else f"{part}; {penalty_text(found, r['compressor'])}")
    unmeasured = [r["label"] for r in chosen if r.get("loss_penalty") is None]
    if unmeasured:
        parts.append(f"{', '.join(unmeasured)}: {LOSS_UNMEASURED}")
    return "low-communication: " + "; ".join(parts)


def with_strategies(store: Store, projection: projections.Projection, rows: Sequence[Mapping[str, Any]],
                    result: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-step ``rows`` and their verdict ``result`` with the strategies of ``projection``:
    every row with the strategy columns, the strategy rows ranked among them, the verdict's
    ``text`` (on the per-step rows) followed by :func:`verdict_text` and its ``lowcomm`` (the strategy rows' labels,
    ``None`` without any). Without strategies and with one site, ``rows`` and ``result`` as they are."""
    extra = strategy_rows(store, projection)
    sites = int(projection.cluster.options.get("sites", 1))
    if not extra and sites < 2:
        return list(rows), dict(result)
    together = ranked([*per_step(store, projection, rows), *extra])
    sentence = verdict_text(together)
    out = {**result, "lowcomm": [r["label"] for r in together if r["compressor"] in lowcomm.STRATEGIES] or None}
    if sentence:
        out["text"] = f"per-step: {result['text']}. {sentence}"
    return together, out
