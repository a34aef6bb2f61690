"""Projections held against published sharded-training throughput: ``profiles/sharded-throughput.json``.

The table holds published training throughput (tokens/s per GPU) of decoder-only transformers
trained with sharded data parallelism (FSDP / ZeRO-3, HSDP, FSDP's SHARD_GRAD_OP = ZeRO-2) or with
tensor and pipeline parallelism inside data parallelism, on the modelled GPUs, each row naming its
*harness* (the code base that trained it) and citing where it was published (docs/devices.md,
"Sharded training: published throughput"). Rows of torchtitan and IBM's fms-fsdp are ``held_out``:
kept out of the band, an independent check.

This module imports no torch and no simulator: a projection is given to it as a function
``project(row) -> tokens/s per GPU`` (or a string saying why the row cannot be projected), built
where the model is (:mod:`pipeline.published_sharded`). :func:`check` computes every row's ratio
projected ÷ published tokens/s (= published ÷ projected step time); :func:`band` sizes the band
over the rows not held out exactly as the compute band is sized
(:func:`costs.throughput.harness_band`: the trim is the largest for which at least
:data:`~costs.throughput.COVERAGE` of the rows fall inside the band sized from the other harnesses'
ratios alone). None of these rows enters any fit: the projection's constants come from the
DDP-era table of :mod:`costs.throughput`, so every ratio here is already out of sample, and the
leave-one-harness-out sizing measures how far an unseen harness strays. :func:`independent`
holds the held-out rows against that band. Units: tokens/s per GPU, tokens, sequences.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costs.throughput import harness_band, trimmed
from units import check_count

PARALLEL = ("dp", "zero1", "zero2", "fsdp", "hsdp", "tp-pp")
"""How a row's training is parallel: ``dp`` (data parallel, DDP or a distributed optimizer, not
stated), ``zero1``/``zero2`` (DeepSpeed stages; FSDP's SHARD_GRAD_OP is ``zero2``), ``fsdp``
(ZeRO-3, FSDP FULL_SHARD, FSDP2), ``hsdp`` (sharded in a group, replicated across), ``tp-pp``
(tensor, pipeline or context parallel inside data parallelism)."""

PRECISIONS = ("amp", "fp8")
"""``amp``: bf16 mixed precision; ``fp8``: FP8 linear layers (Transformer Engine, torchao)."""

HELD_OUT = ("torchtitan", "fms-fsdp")
"""The harnesses kept out of the band: an independent check."""


def table_path() -> Path:
    """The shipped table, ``profiles/sharded-throughput.json``."""
    import profiles

    return profiles.SHARDED_THROUGHPUT


@dataclass(frozen=True)
class Row:
    """One published measurement: ``tokens_per_s_per_gpu`` of ``model`` (``parameters`` as
    published; ``config`` its shapes for the testbed: a shipped model's name, a Hugging Face-style
    config mapping, or ``None`` when not stated) trained on ``gpus`` ``device`` GPUs, ``parallel``
    (:data:`PARALLEL`) with ``tensor_parallel`` × ``pipeline_parallel`` × ``context_parallel`` GPUs
    per model replica, ``global_batch_sequences`` of ``tokens`` tokens per optimizer step, in
    ``micro_batch`` sequences per GPU per pass and ``grad_accum`` passes (``None``: not stated),
    ``precision`` (:data:`PRECISIONS`), activation checkpointing on or not (``None``: not stated),
    over ``network``; by ``harness`` (run by ``run_by``, ``software``), published at ``source``,
    ``where`` in it; ``held_out`` from the band."""

    device: str
    model: str
    parameters: int | None
    config: str | Mapping[str, Any] | None
    parallel: str
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    gpus: int
    micro_batch: int | None
    grad_accum: int | None
    global_batch_sequences: int
    tokens: int
    precision: str
    activation_checkpointing: bool | str | None
    network: str | None
    tokens_per_s_per_gpu: float
    mfu: float | None
    harness: str
    run_by: str
    software: str
    source: str
    where: str
    held_out: bool

    @property
    def data_parallel(self) -> int:
        """Model replicas: GPUs ÷ (tensor × pipeline × context parallel GPUs)."""
        return self.gpus // (self.tensor_parallel * self.pipeline_parallel * self.context_parallel)

    @property
    def batch(self) -> float:
        """Sequences per model replica per optimizer step."""
        return self.global_batch_sequences / self.data_parallel


def _positive_int(raw: Mapping[str, Any], name: str, optional: bool = False) -> int | None:
    value = raw.get(name)
    return None if value is None and optional else check_count(value, name)


def _row(raw: Mapping[str, Any], known_gpus: Sequence[str]) -> Row:
    for name in ("source", "where", "harness", "model"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            raise ValueError(f"{name} must be given")
    if not raw["source"].startswith("https://"):
        raise ValueError(f"source must be an https:// address, got {raw['source']!r}")
    if raw.get("device") not in known_gpus:
        raise ValueError(f"device {raw.get('device')!r} is not in profiles/devices ({', '.join(known_gpus)})")
    if raw.get("parallel") not in PARALLEL:
        raise ValueError(f"parallel {raw.get('parallel')!r}; choose from {', '.join(PARALLEL)}")
    if raw.get("precision") not in PRECISIONS:
        raise ValueError(f"precision {raw.get('precision')!r}; choose from {', '.join(PRECISIONS)}")
    tps = raw.get("tokens_per_s_per_gpu")
    if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not tps > 0:
        raise ValueError(f"tokens_per_s_per_gpu must be a number > 0, got {tps!r}")
    config = raw.get("config")
    if config is not None and not isinstance(config, (str, dict)):
        raise ValueError(f"config must be a shipped model's name, a config object or null, got {config!r}")
    if raw.get("held_out") is not (raw["harness"] in HELD_OUT):
        raise ValueError(f"held_out must be true exactly for the harnesses {', '.join(HELD_OUT)}")
    row = Row(device=raw["device"], model=raw["model"], parameters=_positive_int(raw, "parameters", True),
              config=config, parallel=raw["parallel"], tensor_parallel=_positive_int(raw, "tensor_parallel"),
              pipeline_parallel=_positive_int(raw, "pipeline_parallel"),
              context_parallel=_positive_int(raw, "context_parallel"), gpus=_positive_int(raw, "gpus"),
              micro_batch=_positive_int(raw, "micro_batch", True), grad_accum=_positive_int(raw, "grad_accum", True),
              global_batch_sequences=_positive_int(raw, "global_batch_sequences"), tokens=_positive_int(raw, "tokens"),
              precision=raw["precision"], activation_checkpointing=raw.get("activation_checkpointing"),
              network=raw.get("network"), tokens_per_s_per_gpu=float(tps), mfu=raw.get("mfu"),
              harness=raw["harness"], run_by=str(raw.get("run_by", "")), software=str(raw.get("software", "")),
              source=raw["source"], where=raw["where"], held_out=raw["held_out"])
    if row.gpus % (row.tensor_parallel * row.pipeline_parallel * row.context_parallel):
        raise ValueError("gpus must be a multiple of tensor × pipeline × context parallel")
    if raw.get("global_batch_tokens") != row.global_batch_sequences * row.tokens:
        raise ValueError("global_batch_tokens must be global_batch_sequences × tokens")
    return row


@functools.lru_cache(maxsize=4)
def load(path: str | None = None) -> tuple[Row, ...]:
    """The rows of the table at ``path`` (default :func:`table_path`); ValueError naming the file
    and the row on a malformed one."""
    from costs import devices

    where = Path(path) if path else table_path()
    names = devices.names()
    rows = []
    for i, raw in enumerate(json.loads(where.read_text())["rows"]):
        try:
            rows.append(_row(raw, names))
        except ValueError as exc:
            raise ValueError(f"{where}: row {i}: {exc}") from None
    return tuple(rows)


Projection = Callable[[Row], "float | str"]
"""A projection of a row: its tokens/s per GPU, or a string saying why the row is not projected."""


@dataclass(frozen=True)
class Checked:
    """A row held against a projection: ``projected`` tokens/s per GPU (``None``: not projected,
    ``why`` says why) and ``ratio`` = projected ÷ published (= published ÷ projected step time)."""

    row: Row
    projected: float | None
    why: str

    @property
    def ratio(self) -> float | None:
        return None if self.projected is None else self.projected / self.row.tokens_per_s_per_gpu


def check(project: Projection, rows: Sequence[Row] | None = None) -> list[Checked]:
    """Every row of ``rows`` (default: the shipped table) against ``project``."""
    out = []
    for row in rows if rows is not None else load():
        got = project(row)
        if isinstance(got, str):
            out.append(Checked(row, None, got))
        elif not got > 0:
            raise ValueError(f"the projection gave {got!r} tokens/s for {row.model} ({row.harness})")
        else:
            out.append(Checked(row, float(got), ""))
    return out


def band(checked: Sequence[Checked]) -> dict[str, float] | None:
    """The band over the projected rows not held out (:func:`costs.throughput.harness_band`:
    ``low``, ``high``, ``trim``, ``k``, ``rows``, ``harnesses``, ``inside``, ``out_of_harness``);
    ``None`` when fewer than two harnesses have projected rows (nothing to leave out)."""
    fitted = [c for c in checked if c.ratio is not None and not c.row.held_out]
    if len({c.row.harness for c in fitted}) < 2:
        return None
    return harness_band([c.ratio for c in fitted], [c.row.harness for c in fitted])


def own_out(checked: Sequence[Checked], trim: float) -> dict[str, tuple[float, float]]:
    """Per harness of the band's rows, the band sized with ``trim`` from the other harnesses' ratios."""
    fitted = [c for c in checked if c.ratio is not None and not c.row.held_out]
    return {h: trimmed([c.ratio for c in fitted if c.row.harness != h], trim)
            for h in sorted({c.row.harness for c in fitted})}


def independent(checked: Sequence[Checked], sized: Mapping[str, float] | None) -> list[tuple[Checked, bool | None]]:
    """The held-out rows that were projected, each with whether its ratio lies in the band
    (``None`` without a band)."""
    return [(c, None if sized is None else sized["low"] <= c.ratio <= sized["high"])
            for c in checked if c.row.held_out and c.ratio is not None]


def _batch(row: Row) -> str:
    per = f"{row.micro_batch}x{row.grad_accum}" if row.micro_batch and row.grad_accum else "—"
    return f"{row.global_batch_sequences * row.tokens / 2**20:.3g} Mi ({per})"


def report(checked: Sequence[Checked]) -> str:
    """The table in Markdown (docs/devices.md): every row with its source, the projection and
    its ratio, the band and how it was sized, and the held-out rows against it."""
    sized = band(checked)
    own = own_out(checked, sized["trim"]) if sized else {}
    lines = []
    if sized:
        lines.append(f"Band ×{sized['low']:.2f}–{sized['high']:.2f} (projected ÷ published over {sized['rows']} projected"
                     f" rows of {sized['harnesses']} harnesses, the {sized['k']} most extreme left out at each end):"
                     f" it holds {sized['inside']:.0%} of them, {sized['out_of_harness']:.0%} when sized without their"
                     " own harness.")
    else:
        harnesses = sorted({c.row.harness for c in checked if c.ratio is not None and not c.row.held_out})
        lines.append(f"No band: projected rows come from {len(harnesses)} harness(es) ({', '.join(harnesses) or 'none'});"
                     " leaving one out needs two.")
    held = independent(checked, sized)
    if held:
        inside = sum(bool(x) for _, x in held)
        ratios = [c.ratio for c, _ in held]
        lines.append(f"Held out ({', '.join(HELD_OUT)}): {len(held)} rows projected, ratios {min(ratios):.2f}–"
                     f"{max(ratios):.2f}" + (f", {inside} inside the band." if sized else "."))
    lines += ["", "| device | model | parallel | GPUs | tokens | batch, tokens (micro x accum) | precision | AC "
              "| harness | published tokens/s/GPU | projected | projected/published | in band (own out) | source |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in checked:
        r = c.row
        par = r.parallel if r.parallel != "tp-pp" else (
            f"TP{r.tensor_parallel} PP{r.pipeline_parallel}" + (f" CP{r.context_parallel}" if r.context_parallel > 1 else ""))
        if r.parallel == "dp" and r.context_parallel > 1:
            par = f"dp CP{r.context_parallel}"
        ac = {True: "yes", False: "no", None: "—"}.get(r.activation_checkpointing, str(r.activation_checkpointing))
        if c.ratio is None:
            projected, ratio, inside = "—", c.why, ""
        else:
            projected, ratio = f"{c.projected:.4g}", f"{c.ratio:.2f}"
            if r.held_out:
                inside = "held out" + ("" if not sized else (": in band" if sized["low"] <= c.ratio <= sized["high"]
                                                               else ": outside"))
            elif r.harness in own:
                lo, hi = own[r.harness]
                inside = "yes" if lo <= c.ratio <= hi else "no"
            else:
                inside = ""
        lines.append(f"| {r.device} | {r.model} | {par} | {r.gpus} | {r.tokens} | {_batch(r)} | {r.precision} | {ac} "
                     f"| {r.harness} | {r.tokens_per_s_per_gpu:.5g} | {projected} | {ratio} | {inside} "
                     f"| [{r.run_by}]({r.source}) |")
    return "\n".join(lines)
