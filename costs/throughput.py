"""Compute on a GPU from published training throughput: the rule fitted to ``profiles/throughput.json``.

The table holds published single-GPU (or per-GPU, data parallel on one node) training throughput
(samples/s) of full-size models on the modelled GPUs in each precision, from several independent
*harnesses*: a harness is the code base that trained the model (NVIDIA's DeepLearningExamples in
PyTorch, TensorFlow or MXNet, Hugging Face transformers, DeepSpeed, Megatron-LM, llm.c, MLPerf's
ResNet-50, ...), whoever ran it; each row names its harness and cites where it was published
(docs/devices.md). The rule that turns a sample's training FLOPs ``F`` (3 × its forward FLOPs) into
seconds has three constants:

    seconds per sample = F / (η · peak(device, precision))

with ``peak`` the device's dense peak in the format the precision runs in
(:meth:`~costs.devices.Device.peak_flops`: ``amp`` on fp16 tensor cores on a V100, bf16 on an
A100 and later; ``tf32`` as fp32 where there are no TF32 units) and ``η`` the fraction of it
training reaches: one for fp32 SIMT units, one per kind of model on tensor cores (``cnn``,
``transformer``; a trace is ``cnn`` when most of its FLOPs are in 4-D weights). A constant per GPU,
per layout or for memory-bound layers was tried and dropped: none predicts a harness left out of
the fit better (docs/devices.md). The fit minimises the squared log error of every row, each
harness's rows together weighing as much as any other harness's (:func:`fit`).

The error of the rule is measured on harnesses it has not seen: :func:`leave_one_harness_out`
predicts each harness's rows from a fit to the other harnesses. The band (:func:`band`) is the
range of those ratios (published ÷ predicted time) without a fraction of the most extreme at each
end, the largest (in steps of :data:`TRIM_STEP`) for which at least :data:`COVERAGE` of the rows
fall inside the band sized from the other harnesses' ratios alone (:func:`coverage`): it covers the
spread of software efficiency between code bases, not the residuals of one. What the table lacks
widens the band by a measured factor each (:class:`Compute`'s ``unmeasured``; :func:`widening`): a
GPU without rows, or a precision without rows on that GPU, by the largest shift of a GPU's
predictions when all its rows are left out of the fit; a layout not in the table (its kind's η)
likewise for layouts. A CPU is not fitted: its measured peak of the precision ×
:data:`~costs.devices.LAYOUT_UTILISATION`.

Batch size enters only through the optimizer step (the simulator's rule, :func:`optimizer_s`),
once per ``batch_size`` samples (per GPU, gradient accumulation included).
Units: FLOP, FLOP/s, seconds, bytes.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costs.compute import optimizer_from_bandwidth
from costs.devices import LAYOUT_UTILISATION, Device, base_name, get

PRECISIONS = ("fp32", "tf32", "amp")
DEFAULT_PRECISION = "amp"
KINDS = ("cnn", "transformer")
COVERAGE = 0.9
"""Fraction of the rows the band must hold when it is sized without their own harness."""
TRIM_STEP = 0.005
"""Steps of the fraction of ratios :func:`coverage` tries to leave out at each end of the band."""


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`; ValueError naming them otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return precision


@dataclass(frozen=True)
class Row:
    """One published measurement: ``samples_per_s`` of ``layout`` (at ``tokens`` tokens per
    sample for a transformer, else its stated input) trained on one ``device`` in ``precision``
    with ``batch_size`` samples per optimizer step (per GPU), by the code base ``harness``, run by
    ``run_by``, published at ``source``."""

    device: str
    layout: str
    precision: str
    batch_size: int
    samples_per_s: float
    source: str
    harness: str
    tokens: int | None = None
    run_by: str = ""


def table_path() -> Path:
    """The shipped table, ``profiles/throughput.json``."""
    import profiles

    return profiles.THROUGHPUT


@functools.lru_cache(maxsize=4)
def load(path: str | None = None) -> tuple[Row, ...]:
    """The rows of the throughput table at ``path`` (default :func:`table_path`); ValueError
    naming the file and the row on a malformed one."""
    where = Path(path) if path else table_path()
    data = json.loads(where.read_text())
    rows = []
    for i, raw in enumerate(data["rows"]):
        try:
            row = Row(str(raw["device"]), str(raw["layout"]), check_precision(str(raw["precision"])),
                      int(raw["batch_size"]), float(raw["samples_per_s"]), str(raw["source"]),
                      str(raw["harness"]), None if raw.get("tokens") is None else int(raw["tokens"]),
                      str(raw.get("run_by", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: row {i}: {exc}") from None
        if not row.samples_per_s > 0 or not row.source.strip() or not row.harness.strip() or row.batch_size < 1:
            raise ValueError(f"{where}: row {i}: samples_per_s and batch_size must be > 0, source and harness given")
        rows.append(row)
    return tuple(rows)


@functools.lru_cache(maxsize=64)
def layout_flops(layout: str, tokens: int | None = None) -> float:
    """Training FLOPs of one sample of ``layout`` (3 × its forward FLOPs: backward costs two forwards)."""
    import traces

    return 3.0 * sum(e["forward_flops"] for e in traces.layouts.layout(layout, tokens))


@functools.lru_cache(maxsize=16)
def layout_kind(layout: str) -> str:
    """``cnn`` or ``transformer``: :func:`kind_of` the layout's parameters."""
    import traces

    entries = traces.layouts.layout(layout)
    return kind_of([tuple(e["shape"]) for e in entries], [e["forward_flops"] for e in entries])


def kind_of(shapes: Sequence[Sequence[int] | None], forward_flops: Sequence[float]) -> str:
    """``cnn`` when most of the FLOPs are in 4-D (convolution) weights, else ``transformer``."""
    conv = sum(f for s, f in zip(shapes, forward_flops) if s is not None and len(s) == 4)
    return "cnn" if conv > 0.5 * sum(forward_flops) else "transformer"


@functools.lru_cache(maxsize=16)
def layout_numel(layout: str) -> int:
    """Parameters of ``layout``."""
    import traces

    return sum(int(e["numel"]) for e in traces.layouts.layout(layout))


def optimizer_s(layout: str, device: Device) -> float:
    """Seconds of the layout's optimizer step on ``device`` (the simulator's rule,
    :func:`costs.compute.optimizer_from_bandwidth`), held apart from the per-sample fit."""
    return optimizer_from_bandwidth(layout_numel(layout), device.memory_bandwidth_Bps)


@dataclass(frozen=True)
class Fit:
    """The fitted constants (see the module docstring): ``simt`` (η of fp32 SIMT units),
    ``tensor`` (η on tensor cores per kind), and the rows they were fitted to."""

    simt: float
    tensor: dict[str, float]
    rows: tuple[Row, ...] = field(default=(), repr=False)

    def eta(self, device: Device, precision: str, kind: str) -> float:
        """η of a model of ``kind`` in ``precision`` on ``device``; a kind the fit has no rows of
        takes the geometric mean of the tensor-core η it has."""
        if device.dtype(precision) == "fp32":
            return self.simt
        if kind in self.tensor:
            return self.tensor[kind]
        return math.exp(sum(math.log(v) for v in self.tensor.values()) / len(self.tensor))

    def flops_per_s(self, device: Device, precision: str, kind: str) -> float:
        """Effective training FLOP/s of a model of ``kind`` on a GPU in ``precision``: η · peak."""
        return self.eta(device, precision, kind) * device.peak_flops(precision)

    def samples_per_s(self, row: Row) -> float:
        """What the rule predicts for ``row`` (its optimizer step included, as the table's are)."""
        device = get(row.device)
        per_sample = layout_flops(row.layout, row.tokens) / self.flops_per_s(device, row.precision, layout_kind(row.layout))
        return row.batch_size / (row.batch_size * per_sample + optimizer_s(row.layout, device))


# The shipped solution (``profiles/throughput-fit.json``): the constants, every row's
# leave-one-harness-out prediction and the widening factors, keyed by a digest of the inputs
# (rows, layout FLOPs, device peaks, optimizer times). A projection uses it while the key matches
# and solves afresh otherwise, so it never goes stale; it saves each process SciPy's optimiser and
# the folds (about 1 s). Written by ``python -m costs.throughput``; a test holds it equal to a
# fresh solution.


@dataclass(frozen=True)
class _Problem:
    """The least-squares problem of :func:`fit`: parameter ``names`` and per-row arrays."""

    rows: tuple[Row, ...]
    names: tuple[str, ...]
    arrays: dict[str, Any]

    def key(self) -> str:
        """A digest of every input of the fit (12 significant digits per number)."""
        import hashlib

        text = repr((self.names,
                     [(r.device, r.layout, r.precision, r.batch_size, f"{r.samples_per_s:.12e}", r.tokens, r.harness)
                      for r in self.rows],
                     {k: [f"{float(x):.12e}" for x in v] for k, v in sorted(self.arrays.items())}))
        return hashlib.sha256(text.encode()).hexdigest()

    def fit_from(self, values: Sequence[float]) -> Fit:
        """The :class:`Fit` of parameter ``values`` (in the order of ``names``)."""
        v = dict(zip(self.names, values))
        return Fit(float(v["simt"]), {k: float(v[f"tensor:{k}"]) for k in KINDS if f"tensor:{k}" in v}, self.rows)


def _is_simt(row: Row) -> bool:
    return get(row.device).dtype(row.precision) == "fp32"


def _problem(rows: Sequence[Row]) -> _Problem:
    import numpy as np

    rows = tuple(rows)
    kinds = sorted({layout_kind(r.layout) for r in rows if not _is_simt(r)})
    names = ("simt", *(f"tensor:{k}" for k in kinds))
    index = {name: i for i, name in enumerate(names)}
    count = {h: sum(r.harness == h for r in rows) for h in {r.harness for r in rows}}
    weight = np.array([1.0 / count[r.harness] for r in rows])
    arrays = {
        "eta_of": np.array([index["simt"] if _is_simt(r) else index[f"tensor:{layout_kind(r.layout)}"] for r in rows]),
        "flops": np.array([layout_flops(r.layout, r.tokens) for r in rows]),
        "peak": np.array([get(r.device).peak_flops(r.precision) for r in rows]),
        "batch": np.array([float(r.batch_size) for r in rows]),
        "optimizer": np.array([optimizer_s(r.layout, get(r.device)) for r in rows]),
        "published": np.log([r.samples_per_s for r in rows]),
        "weight": np.sqrt(weight * len(rows) / weight.sum()),
    }
    return _Problem(rows, names, arrays)


def _solve_values(problem: _Problem) -> list[float]:
    """The fitted constants in the order of ``problem.names``."""
    import numpy as np
    from scipy.optimize import least_squares

    a = problem.arrays

    def residuals(theta: Any) -> Any:
        per_sample = a["flops"] / (np.exp(theta)[a["eta_of"]] * a["peak"])
        return a["weight"] * (np.log(a["batch"] / (a["batch"] * per_sample + a["optimizer"])) - a["published"])

    return [float(v) for v in np.exp(least_squares(residuals, np.log([0.5] * len(problem.names))).x)]


def fit(rows: Sequence[Row]) -> Fit:
    """The constants minimising Σ w·log²(predicted / published samples/s) over ``rows``, w = 1 /
    (rows of the row's harness) (SciPy's least squares on the logarithms of the constants, so that
    every one stays > 0; the residuals are :meth:`Fit.samples_per_s`'s formula, vectorised)."""
    problem = _problem(rows)
    return problem.fit_from(_solve_values(problem))


def _held_out(rows: tuple[Row, ...], group: Any) -> list[float]:
    """Each row's predicted samples/s from a fit to the rows whose ``group(row)`` differs from its own."""
    predicted = [0.0] * len(rows)
    for g in sorted({group(r) for r in rows}):
        rule = fit([r for r in rows if group(r) != g])
        for i, r in enumerate(rows):
            if group(r) == g:
                predicted[i] = rule.samples_per_s(r)
    return predicted


def _widening(rows: tuple[Row, ...], full: Fit, attribute: str) -> float:
    """The largest factor (≥ 1) by which leaving every row of one ``attribute`` value (a GPU, a
    layout) out of the fit moves the predictions of those rows; only rows whose constant (fp32
    SIMT, or their kind on tensor cores) the remaining rows still determine are counted."""
    def constant(r: Row) -> str:
        return "simt" if _is_simt(r) else layout_kind(r.layout)

    shifts = []
    for value in sorted({getattr(r, attribute) for r in rows}):
        rest = [r for r in rows if getattr(r, attribute) != value]
        known = {constant(r) for r in rest}
        rule = fit(rest)
        shifts += [rule.samples_per_s(r) / full.samples_per_s(r) for r in rows
                   if getattr(r, attribute) == value and constant(r) in known]
    return max([1.0, *shifts, *(1 / s for s in shifts)])


def _solve_all(problem: _Problem) -> dict[str, Any]:
    """The shipped solution: constants, leave-one-harness-out predictions, widening factors."""
    constants = dict(zip(problem.names, _solve_values(problem)))
    full = problem.fit_from(list(constants.values()))
    return {"constants": constants,
            "leave_one_harness_out": _held_out(problem.rows, lambda r: r.harness),
            "widening": {"device": _widening(problem.rows, full, "device"),
                         "layout": _widening(problem.rows, full, "layout")}}


def _cache_path() -> Path:
    import profiles

    return profiles.THROUGHPUT_FIT


def _shipped(problem: _Problem) -> dict[str, Any] | None:
    """The shipped solution when its key matches ``problem``'s, else ``None``."""
    try:
        cache = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return None
    return cache if isinstance(cache, dict) and cache.get("key") == problem.key() else None


@functools.lru_cache(maxsize=1)
def _solution() -> tuple[_Problem, dict[str, Any]]:
    """The problem of the shipped table and its solution: the shipped one while current, else
    solved afresh."""
    problem = _problem(load())
    return problem, _shipped(problem) or _solve_all(problem)


def shipped_is_current() -> bool:
    """Whether ``profiles/throughput-fit.json`` answers for the table and devices as they are."""
    return _shipped(_problem(load())) is not None


def write_cache() -> Path:
    """Solve the fit, its leave-one-harness-out and widening afresh and write them to
    ``profiles/throughput-fit.json``."""
    problem = _problem(load())
    path = _cache_path()
    path.write_text(json.dumps({"key": problem.key(), **_solve_all(problem)}, indent=1, sort_keys=True) + "\n")
    return path


@functools.lru_cache(maxsize=1)
def fitted() -> Fit:
    """The rule fitted to the shipped table (cached)."""
    problem, solution = _solution()
    return problem.fit_from([solution["constants"][name] for name in problem.names])


def reproduction(rows: Sequence[Row] | None = None) -> list[tuple[Row, float, float]]:
    """Each row of the table, what the fit to all of it predicts (samples/s) and the error
    (predicted / published − 1)."""
    rows = tuple(rows or load())
    f = fitted() if rows == load() else fit(rows)
    return [(r, f.samples_per_s(r), f.samples_per_s(r) / r.samples_per_s - 1) for r in rows]


def leave_one_harness_out() -> list[tuple[Row, float, float]]:
    """Each row predicted by a fit to the other harnesses' rows: (row, predicted samples/s,
    error = predicted / published − 1 = published ÷ predicted time − 1). Cached."""
    problem, solution = _solution()
    return [(r, p, p / r.samples_per_s - 1) for r, p in zip(problem.rows, solution["leave_one_harness_out"])]


def trimmed(ratios: Sequence[float], fraction: float) -> tuple[float, float]:
    """The range of ``ratios`` without the ⌊fraction · n⌋ lowest and highest, widened to hold 1."""
    ordered = sorted(ratios)
    k = math.floor(fraction * len(ordered) + 1e-9)
    return min(1.0, ordered[k]), max(1.0, ordered[len(ordered) - 1 - k])


def harness_band(ratios: Sequence[float], harnesses: Sequence[str]) -> dict[str, float]:
    """The band of ``ratios`` (model ÷ published, one per row; ``harnesses[i]`` the code base of
    row ``i``), sized as the compute band is: ``trim``, the fraction of ratios left out at each end,
    is the largest multiple of :data:`TRIM_STEP` below one half that keeps ``out_of_harness`` (the
    fraction of rows inside the band sized, with that trim, from the other harnesses' ratios alone)
    ≥ :data:`COVERAGE`. Returns ``low``/``high`` (the band, ``low ≤ 1 ≤ high``), ``trim``, ``k``
    (ratios left out at each end), ``rows``, ``harnesses``, ``inside`` (fraction of the rows inside
    the band) and ``out_of_harness``."""
    names = sorted(set(harnesses))

    def out_of_harness(fraction: float) -> float:
        inside = 0
        for harness in names:
            others = [x for h, x in zip(harnesses, ratios) if h != harness]
            if not others:
                continue
            low, high = trimmed(others, fraction)
            inside += sum(low <= x <= high for h, x in zip(harnesses, ratios) if h == harness)
        return inside / len(ratios)

    steps = [i * TRIM_STEP for i in range(int(0.5 / TRIM_STEP))]
    trim = max((q for q in steps if out_of_harness(q) >= COVERAGE), default=0.0)
    low, high = trimmed(ratios, trim)
    return {"low": low, "high": high, "trim": trim, "k": math.floor(trim * len(ratios) + 1e-9), "rows": len(ratios),
            "harnesses": len(names), "inside": sum(low <= x <= high for x in ratios) / len(ratios),
            "out_of_harness": out_of_harness(trim)}


@functools.lru_cache(maxsize=1)
def coverage() -> dict[str, float]:
    """How the band is sized (:func:`harness_band` over :func:`leave_one_harness_out`'s ratios):
    ``trim``, ``k``, ``rows``, ``harnesses``, ``inside`` and ``out_of_harness``."""
    held = leave_one_harness_out()
    sized = harness_band([1 + err for _, _, err in held], [r.harness for r, _, _ in held])
    return {k: v for k, v in sized.items() if k not in ("low", "high")}


def band() -> tuple[float, float]:
    """The factors on a projected compute time that span the rule's error on harnesses it has
    not seen: the range of published ÷ predicted time over :func:`leave_one_harness_out` without
    the :func:`coverage` ``k`` most extreme at each end, ``(low, high)`` with ``low ≤ 1 ≤ high``."""
    return trimmed([1 + err for _, _, err in leave_one_harness_out()], coverage()["trim"])


def widening() -> dict[str, float]:
    """The factor (≥ 1) each unmeasured input widens the band by: ``device`` (a GPU, or a
    precision on a GPU, without rows) and ``layout`` (a layout not in the table), each the largest
    shift of a group's predictions when all its rows leave the fit."""
    return dict(_solution()[1]["widening"])


UNMEASURED_CPU_BAND = (0.5, 2.0)
"""Compute band on a CPU (no published table: the measured peak × a utilisation stated, not
fitted): a factor of 2 either way."""


@dataclass(frozen=True)
class Compute:
    """How a projection's compute runs: ``flops_per_s`` (effective training FLOP/s), ``low``/
    ``high`` (factors on compute time spanning the rule's error on unseen harnesses, widened by
    a measured factor per input in ``unmeasured``), ``note`` (where it comes from, in words)."""

    flops_per_s: float
    low: float
    high: float
    unmeasured: tuple[str, ...]
    note: str


def compute(device: Device, precision: str, kind: str, layout: str | None = None) -> Compute:
    """The compute of a model of ``kind`` (``layout`` when it is one) on ``device`` in ``precision``."""
    check_precision(precision)
    dtype = device.dtype(precision)
    if device.kind != "gpu":
        flops = device.peak_flops(precision) * LAYOUT_UTILISATION
        return Compute(flops, *UNMEASURED_CPU_BAND, ("cpu compute (no published table)",),
                       f"{flops / 1e12:.3g} TFLOP/s ({device.name} {dtype} peak x {LAYOUT_UTILISATION:g}, "
                       f"not fitted: band x{UNMEASURED_CPU_BAND[0]:g}-{UNMEASURED_CPU_BAND[1]:g})")
    f = fitted()
    rows = f.rows
    widen = widening()
    unmeasured, factor = [], 1.0
    name = base_name(device.name)
    if not any(r.device == name for r in rows):
        unmeasured.append(f"{name} (no published row: its peak at the efficiency measured on other GPUs)")
        factor *= widen["device"]
    elif not any(r.device == name and device.dtype(r.precision) == dtype for r in rows):
        unmeasured.append(f"{dtype} on {name} (no published row: the {dtype} efficiency of other GPUs)")
        factor *= widen["device"]
    if layout is None or not any(r.layout == layout for r in rows):
        unmeasured.append(f"{layout or 'this trace'} (not in the table: the {kind} rows' efficiency)")
        factor *= widen["layout"]
    low, high = band()
    low, high = low / factor, high * factor
    flops = f.flops_per_s(device, precision, kind)
    harnesses = len({r.harness for r in rows})
    where = "; ".join(unmeasured) or "anchored on published rows"
    note = (f"{flops / 1e12:.3g} TFLOP/s effective ({device.name} {precision}: {dtype} peak "
            f"{device.peak_flops(precision) / 1e12:.3g} TFLOP/s x {f.eta(device, precision, kind):.2f}, rule fitted to "
            f"{len(rows)} published rows of {harnesses} harnesses, {kind}; {where}; time band x{low:.2f}-{high:.2f})")
    return Compute(flops, low, high, tuple(unmeasured), note)


def report() -> str:
    """The fit in Markdown (docs/devices.md, BENCHMARKS.md): the constants, the band and its
    coverage, every row with its harness and its leave-one-harness-out model ÷ published
    samples/s (= published ÷ modelled time), inside the band or not (``own out``: the band sized
    without the row's harness), and a summary per harness."""
    f, held, cov = fitted(), leave_one_harness_out(), coverage()
    low, high = band()
    ratios = [1 + err for _, _, err in held]
    own = {}
    for harness in {r.harness for r, _, _ in held}:
        own[harness] = trimmed([x for (r, _, _), x in zip(held, ratios) if r.harness != harness], cov["trim"])
    widen = widening()
    lines = [f"Fitted: η fp32 SIMT {f.simt:.3f}; η tensor cores " + ", ".join(f"{k} {v:.3f}" for k, v in f.tensor.items())
             + f". Band ×{low:.2f}–{high:.2f} (leave-one-harness-out ratios without the {cov['k']} most extreme at each"
             f" end, {cov['trim']:.1%} of {cov['rows']}): it holds {cov['inside']:.1%} of the rows, and"
             f" {cov['out_of_harness']:.1%} when sized without their own harness (goal ≥ {COVERAGE:.0%}). Widening per"
             f" unmeasured input: GPU or precision ×{widen['device']:.2f}, layout ×{widen['layout']:.2f}.", "",
             "| device | layout | precision | tokens | batch | harness | run by | published samples/s "
             "| model (harness left out) | model/published | in band | in band (own out) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (r, predicted, _), x in zip(held, ratios):
        lo, hi = own[r.harness]
        lines.append(f"| {r.device} | {r.layout} | {r.precision} | {r.tokens or ''} | {r.batch_size} | {r.harness} "
                     f"| {r.run_by} | {r.samples_per_s:.4g} | {predicted:.4g} | {x:.2f} | {'yes' if low <= x <= high else 'no'} "
                     f"| {'yes' if lo <= x <= hi else 'no'} |")
    lines += ["", "| harness | rows | GPUs | layouts | model/published | in band | in band (own out) |",
              "|---|---|---|---|---|---|---|"]
    for harness in sorted(own):
        mine = [(r, x) for (r, _, _), x in zip(held, ratios) if r.harness == harness]
        lo, hi = own[harness]
        xs = [x for _, x in mine]
        lines.append(f"| {harness} | {len(mine)} | {', '.join(sorted({r.device for r, _ in mine}))} "
                     f"| {', '.join(sorted({r.layout for r, _ in mine}))} | {min(xs):.2f}–{max(xs):.2f} "
                     f"| {sum(low <= x <= high for x in xs)}/{len(xs)} | {sum(lo <= x <= hi for x in xs)}/{len(xs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(report() if sys.argv[1:] == ["--report"] else f"wrote {write_cache()}")
