"""Compute on a GPU from published training throughput: the rule fitted to ``profiles/throughput.json``.

The table holds published single-GPU training throughput (samples/s) of full-size models on
the modelled GPUs in each precision, each row citing where it was published (docs/devices.md).
The rule that turns a sample's training FLOPs ``F`` (3 × its forward FLOPs) into seconds is a
two-term roofline,

    seconds per sample = F / (η · e_device · peak(device, precision)) + m_kind · F / bandwidth(device)

with ``peak`` the device's dense peak in the format the precision runs in
(:meth:`~simulator.devices.Device.peak_flops`: ``amp`` on fp16 tensor cores on a V100, bf16 on
an A100 and later; ``tf32`` as fp32 where there are no TF32 units), ``bandwidth`` its memory
bandwidth, and fitted: ``η`` the fraction of the peak matrix work reaches (one for fp32 SIMT
units, one per layout on tensor cores), ``e_device`` how well the software of the table used
each GPU (1 on the A100), ``m_kind`` the bytes the memory-bound layers (normalisation,
activations) move per FLOP, per kind of model (``cnn``, ``transformer``). The fit minimises
the squared log error of every row (:func:`fit`).

What the table lacks falls back, and says so (:class:`Compute`'s ``unmeasured``): a layout not in
the table takes the geometric mean of ``η`` over the layouts of its kind; a trace's kind is
``cnn`` when most of its FLOPs are in 4-D (convolution) weights; the H200 takes the H100's
``e_device`` (same SMs and software, more bandwidth); fp32 on an A100/H100 (the table has TF32
there) extrapolates the V100's fp32 rows. A CPU is not fitted: its measured peak of the
precision × :data:`~simulator.devices.LAYOUT_UTILISATION`.

The error of the rule is measured, not assumed: :func:`leave_one_out` predicts each row from a
fit to the others; its range of errors is the band (:class:`Compute`'s ``low``/``high``) that
every projection carries, widened once per unmeasured input. Batch size is not modelled: the
rule is per sample (the table's batches are each harness's default, 8 to 1280).
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

from simulator.devices import LAYOUT_UTILISATION, Device, base_name, get

PRECISIONS = ("fp32", "tf32", "amp")
DEFAULT_PRECISION = "amp"
KINDS = ("cnn", "transformer")
DEVICE_FALLBACK = {"h200": "h100"}
"""A GPU without rows in the table borrows ``e_device`` from this one (the H200 is an H100 with
HBM3e: same SMs, same software)."""


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`; ValueError naming them otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return precision


@dataclass(frozen=True)
class Row:
    """One published measurement: ``samples_per_s`` of ``layout`` (at ``tokens`` tokens per
    sample for a transformer, else its stated input) trained on one ``device`` in ``precision``
    with ``batch_size`` samples, and its ``source``."""

    device: str
    layout: str
    precision: str
    batch_size: int
    samples_per_s: float
    source: str
    tokens: int | None = None


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
                      None if raw.get("tokens") is None else int(raw["tokens"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: row {i}: {exc}") from None
        if not row.samples_per_s > 0 or not row.source.strip():
            raise ValueError(f"{where}: row {i}: samples_per_s must be > 0 and source given")
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


@dataclass(frozen=True)
class Fit:
    """The fitted constants (see the module docstring): ``simt`` (η of fp32 SIMT units),
    ``tensor`` (η on tensor cores per layout), ``device`` (``e_device`` per GPU),
    ``bytes_per_flop`` (``m_kind``), and the rows it was fitted to."""

    simt: float
    tensor: dict[str, float]
    device: dict[str, float]
    bytes_per_flop: dict[str, float]
    rows: tuple[Row, ...] = field(default=(), repr=False)

    def flops_per_s(self, device: Device, precision: str, kind: str, layout: str | None = None) -> float:
        """Effective training FLOP/s of a model of ``kind`` (``layout`` when it is in the table)
        on a GPU in ``precision``: ``1 / (1/(η·e·peak) + m/bandwidth)``."""
        return 1.0 / self.seconds_per_flop(device, precision, kind, layout)

    def seconds_per_flop(self, device: Device, precision: str, kind: str, layout: str | None = None) -> float:
        """Seconds per training FLOP (the reciprocal of :meth:`flops_per_s`)."""
        dtype = device.dtype(precision)
        eta = self.simt if dtype == "fp32" else self.eta_tensor(kind, layout)
        name = base_name(device.name)
        e = self.device.get(name, self.device.get(DEVICE_FALLBACK.get(name, ""), 1.0))
        return 1.0 / (eta * e * device.peak_flops(precision)) + self.bytes_per_flop[kind] / device.memory_bandwidth_Bps

    def eta_tensor(self, kind: str, layout: str | None) -> float:
        """η on tensor cores of ``layout``; for a layout not in the table the geometric mean
        over the table's layouts of ``kind``."""
        if layout in self.tensor:
            return self.tensor[layout]
        same = [v for name, v in self.tensor.items() if layout_kind(name) == kind] or list(self.tensor.values())
        return math.exp(sum(math.log(v) for v in same) / len(same))

    def samples_per_s(self, row: Row) -> float:
        """What the rule predicts for ``row`` (its optimizer step included, as the table's are)."""
        device = get(row.device)
        flops = layout_flops(row.layout, row.tokens)
        per_sample = flops * self.seconds_per_flop(device, row.precision, layout_kind(row.layout), row.layout)
        return row.batch_size / (row.batch_size * per_sample + optimizer_s(row.layout, device))


@functools.lru_cache(maxsize=16)
def layout_numel(layout: str) -> int:
    """Parameters of ``layout``."""
    import traces

    return sum(int(e["numel"]) for e in traces.layouts.layout(layout))


def optimizer_s(layout: str, device: Device) -> float:
    """Seconds of the layout's optimizer step on ``device`` (the simulator's rule,
    :func:`simulator.workload.optimizer_from_bandwidth`), held apart from the per-sample fit."""
    from simulator.workload import optimizer_from_bandwidth

    return optimizer_from_bandwidth(layout_numel(layout), device.memory_bandwidth_Bps)


# The shipped solution of the fit (``profiles/throughput-fit.json``): the constants and the
# leave-one-out errors, keyed by a digest of the fit's inputs (rows, layout FLOPs, device peaks
# and bandwidths). A projection uses it while the key matches and solves afresh otherwise, so it
# never goes stale; it saves each process importing SciPy's optimiser (about 1 s). Written by
# ``python -m simulator.throughput``; a test holds it equal to a fresh solution.


@dataclass(frozen=True)
class _Problem:
    """The least-squares problem of :func:`fit`: parameter ``names`` and per-row arrays."""

    rows: tuple[Row, ...]
    names: tuple[str, ...]
    layouts: tuple[str, ...]
    gpus: tuple[str, ...]
    arrays: dict[str, Any]

    def key(self) -> str:
        """A digest of every input of the fit (12 significant digits per number)."""
        import hashlib

        text = repr((self.names, [(r.device, r.layout, r.precision, r.batch_size, f"{r.samples_per_s:.12e}", r.tokens)
                                  for r in self.rows],
                     {k: [f"{float(x):.12e}" for x in v] for k, v in sorted(self.arrays.items())}))
        return hashlib.sha256(text.encode()).hexdigest()

    def fit_from(self, values: Sequence[float]) -> Fit:
        """The :class:`Fit` of parameter ``values`` (in the order of ``names``)."""
        v = dict(zip(self.names, values))
        return Fit(float(v["simt"]), {n: float(v[f"tensor:{n}"]) for n in self.layouts},
                   {"a100": 1.0, **{n: float(v[f"device:{n}"]) for n in self.gpus}},
                   {k: float(v.get(f"m:{k}", 0.0)) for k in KINDS}, self.rows)


def _problem(rows: Sequence[Row]) -> _Problem:
    import numpy as np

    rows = tuple(rows)
    simt = [get(r.device).dtype(r.precision) == "fp32" for r in rows]
    layouts = sorted({r.layout for r, fp32 in zip(rows, simt) if not fp32})
    gpus = sorted({r.device for r in rows} - {"a100"})
    kinds = sorted({layout_kind(r.layout) for r in rows})
    names = ["simt", *(f"tensor:{n}" for n in layouts), *(f"device:{n}" for n in gpus), *(f"m:{k}" for k in kinds)]
    index = {name: i for i, name in enumerate(names)}
    arrays = {
        "eta_of": np.array([index["simt"] if fp32 else index[f"tensor:{r.layout}"] for r, fp32 in zip(rows, simt)]),
        "e_of": np.array([index.get(f"device:{r.device}", -1) for r in rows]),
        "m_of": np.array([index[f"m:{layout_kind(r.layout)}"] for r in rows]),
        "flops": np.array([layout_flops(r.layout, r.tokens) for r in rows]),
        "peak": np.array([get(r.device).peak_flops(r.precision) for r in rows]),
        "bandwidth": np.array([get(r.device).memory_bandwidth_Bps for r in rows]),
        "batch": np.array([float(r.batch_size) for r in rows]),
        "optimizer": np.array([optimizer_s(r.layout, get(r.device)) for r in rows]),
        "published": np.log([r.samples_per_s for r in rows]),
    }
    return _Problem(rows, tuple(names), tuple(layouts), tuple(gpus), arrays)


def _solve(problem: _Problem) -> Fit:
    return problem.fit_from(_solve_values(problem))


def _solve_values(problem: _Problem) -> list[float]:
    """The fitted constants in the order of ``problem.names``."""
    import numpy as np
    from scipy.optimize import least_squares

    a = problem.arrays

    def residuals(theta: Any) -> Any:
        v = np.exp(theta)
        e = np.where(a["e_of"] >= 0, v[np.maximum(a["e_of"], 0)], 1.0)
        per_sample = a["flops"] * (1.0 / (v[a["eta_of"]] * e * a["peak"]) + v[a["m_of"]] / a["bandwidth"])
        return np.log(a["batch"] / (a["batch"] * per_sample + a["optimizer"])) - a["published"]

    kinds = sum(name.startswith("m:") for name in problem.names)
    start = np.log([0.5] * (len(problem.names) - kinds) + [0.01] * kinds)
    return [float(v) for v in np.exp(least_squares(residuals, start).x)]


def fit(rows: Sequence[Row]) -> Fit:
    """The constants minimising Σ log²(predicted / published samples/s) over ``rows`` (SciPy's
    least squares on the logarithms of the constants, so that every one stays > 0; the
    residuals are :meth:`Fit.samples_per_s`'s formula, vectorised over the rows)."""
    return _solve(_problem(rows))


def _cache_path() -> Path:
    import profiles

    return profiles.THROUGHPUT_FIT


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[_Problem, dict[str, Any] | None]:
    """The problem of the shipped table and the shipped solution when its key matches, else ``None``."""
    problem = _problem(load())
    try:
        cache = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return problem, None
    if not isinstance(cache, dict) or cache.get("key") != problem.key():
        return problem, None
    return problem, cache


@functools.lru_cache(maxsize=1)
def fitted() -> Fit:
    """The rule fitted to the shipped table (the shipped solution while current; cached)."""
    problem, cache = _shipped()
    if cache is not None:
        return problem.fit_from([cache["constants"][name] for name in problem.names])
    return _solve(problem)


def write_cache() -> Path:
    """Solve the fit and its leave-one-out afresh and write them to ``profiles/throughput-fit.json``."""
    problem = _problem(load())
    constants = dict(zip(problem.names, _solve_values(problem)))
    errors = [err for _, _, err in _solve_leave_one_out(problem.rows)]
    path = _cache_path()
    path.write_text(json.dumps({"key": problem.key(), "constants": constants, "leave_one_out": errors},
                               indent=1, sort_keys=True) + "\n")
    return path


def reproduction(rows: Sequence[Row] | None = None) -> list[tuple[Row, float, float]]:
    """Each row of the table, what the fit to all of it predicts (samples/s) and the error
    (predicted / published − 1)."""
    rows = tuple(rows or load())
    f = fitted() if rows == load() else fit(rows)
    return [(r, f.samples_per_s(r), f.samples_per_s(r) / r.samples_per_s - 1) for r in rows]


def _solve_leave_one_out(rows: tuple[Row, ...]) -> tuple[tuple[Row, float, float], ...]:
    out = []
    for i, r in enumerate(rows):
        predicted = fit(rows[:i] + rows[i + 1:]).samples_per_s(r)
        out.append((r, predicted, predicted / r.samples_per_s - 1))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _leave_one_out() -> tuple[tuple[Row, float, float], ...]:
    problem, cache = _shipped()
    if cache is not None:
        return tuple((r, r.samples_per_s * (1 + float(err)), float(err))
                     for r, err in zip(problem.rows, cache["leave_one_out"]))
    return _solve_leave_one_out(problem.rows)


def leave_one_out() -> list[tuple[Row, float, float]]:
    """Each row predicted by a fit to all the other rows: (row, predicted samples/s, error =
    predicted / published − 1). Cached: 18 fits of a few milliseconds each."""
    return list(_leave_one_out())


def band() -> tuple[float, float]:
    """The factors on a projected compute time that span the rule's measured error: the range
    of published ÷ predicted time over :func:`leave_one_out` (= 1 + its error), ``(low, high)``
    with ``low ≤ 1 ≤ high``."""
    ratios = [1.0 + err for _, _, err in leave_one_out()]
    return min(1.0, min(ratios)), max(1.0, max(ratios))


UNMEASURED_CPU_BAND = (0.5, 2.0)
"""Compute band on a CPU (no published table: the measured peak × a utilisation stated, not
fitted): a factor of 2 either way."""


@dataclass(frozen=True)
class Compute:
    """How a projection's compute runs: ``flops_per_s`` (effective training FLOP/s), ``low``/
    ``high`` (factors on compute time spanning the rule's error, widened once per input in
    ``unmeasured``), ``note`` (where it comes from, in words)."""

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
    unmeasured = []
    name = base_name(device.name)
    if not any(r.device == name for r in rows):
        unmeasured.append(f"{name} (not in the table: {DEVICE_FALLBACK.get(name, 'a100')}'s efficiency)")
    if layout is None or not any(r.layout == layout for r in rows):
        unmeasured.append(f"{layout or 'this trace'} (not in the table: the {kind} layouts' mean efficiency)")
    if not any(r.device == name and device.dtype(r.precision) == dtype for r in rows) and \
            not unmeasured[:1]:
        unmeasured.append(f"{dtype} on {name} (no row: extrapolated from other GPUs)")
    low, high = band()
    widen = 1 + len(unmeasured)
    low, high = low**widen, high**widen
    flops = f.flops_per_s(device, precision, kind, layout)
    where = "; ".join(unmeasured) or "anchored on published rows"
    note = (f"{flops / 1e12:.3g} TFLOP/s effective ({device.name} {precision}: {dtype} peak "
            f"{device.peak_flops(precision) / 1e12:.3g} TFLOP/s, rule fitted to {len(rows)} published rows, "
            f"{kind}; {where}; time band x{low:.2f}-{high:.2f})")
    return Compute(flops, low, high, tuple(unmeasured), note)


if __name__ == "__main__":
    print(f"wrote {write_cache()}")
