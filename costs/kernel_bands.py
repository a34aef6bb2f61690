"""Kernel bands: the cost model's error on published GPU timings, one band per kind of kernel.

The GPU cost model (:mod:`costs.costmodel`) prices every call as a sum over kinds of kernel
(:data:`costs.costmodel.KERNEL_KINDS`: elementwise and casts, reductions, sort and top-k,
compaction, scatter/gather, matrix products, launch and sync latency). Each kind's rule is
checked here against every published GPU timing of that kind of kernel found: the kernel rows
of ``profiles/published-<gpu>.json`` (the rows the GPU rules are fitted to) and of
``profiles/kernel-evidence.json`` (rows fitted to nothing, on modelled GPUs and on others, the
latter described by their sustained bandwidth). A row's ratio is published ÷ modelled seconds
(:func:`costs.costmodel.row_seconds`), the model being the GPU's rules **refitted without the
row's own harness** (:func:`held_out_device`): a copy row of one benchmark suite is predicted by
the bandwidth and sync fitted to the other suites' copies, never by a fit it took part in. A
row no other harness can predict (the H100's one published copy, the one published launch
floor) is listed and left out of its band.

A kind's band is the range of its rows' ratios, widened to include 1 (:func:`kind_bands`); a
kind without one published row keeps :data:`UNMEASURED` (a factor of 2 either way, the cost
model's goal, not a measurement). A compressor's band (:func:`compressor_band`) is the mix of
the bands of the kinds its declared work spends its modelled time in, at the bucket sizes the
cost model is fitted at: Top-k, whose GPU time is one ``torch.topk`` over the gradient, takes
the sort/top-k band; a cast takes the elementwise and latency bands. All kinds are taken at the
same end together (their errors are not assumed to cancel). Units: seconds; bands are
dimensionless factors on modelled seconds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costs import costmodel, device_profile, devices, published

UNMEASURED = (0.5, 2.0)
"""Band of a kind of kernel no published GPU timing checks: a factor of 2 either way (the cost
model's goal on every row, not a measured error)."""

KIND_OF_KERNEL = {"copy": "elementwise", "cast": "elementwise", "fill": "elementwise", "read": "reduction",
                  "sort": "sort/top-k", "topk": "sort/top-k", "matmul": "matmul", "launch": "latency"}
"""The kind of kernel (:data:`costs.costmodel.KERNEL_KINDS`) each kernel row checks."""

ERA_KINDS = {"topk_s_per_element": "sort/top-k", "topk_cache_s_per_element": "sort/top-k"}
"""The kind of kernel each field an earlier PyTorch's kernels replace (:data:`costs.devices.ERAS`)
belongs to: on such a device that kind is unmeasured (its rate was published on another GPU)."""


def evidence_path() -> Path:
    """The shipped file of published timings fitted to nothing, ``profiles/kernel-evidence.json``."""
    import profiles

    return profiles.KERNEL_EVIDENCE


@dataclass(frozen=True)
class Evidence:
    """One published kernel timing and the model's price of it: ``device`` it ran on, ``kind`` of
    kernel, ``harness`` (benchmark suite or code base), ``published_s`` and ``model_s``
    (seconds; the rules refitted without the harness, ``None`` when nothing else predicts it),
    ``ratio`` = published ÷ modelled (``None`` likewise), ``fitted``: the row is one the GPU
    rules are fitted to (``published-<gpu>.json``), ``row``: the kernel row as shipped."""

    device: str
    kind: str
    harness: str
    published_s: float
    model_s: float | None
    ratio: float | None
    fitted: bool
    row: Mapping[str, Any]


@dataclass(frozen=True)
class Band:
    """A kind of kernel's band: factors ``low`` ≤ 1 ≤ ``high`` on modelled seconds, spanning
    ``rows`` published timings from ``harnesses`` (0 rows: :data:`UNMEASURED`)."""

    low: float
    high: float
    rows: int
    harnesses: tuple[str, ...]


def _harness(row: Mapping[str, Any]) -> str:
    return str(row.get("harness") or row["source"].split(",")[0])


def held_out_device(name: str, harness: str, kind: str) -> devices.Device | None:
    """GPU ``name`` as the cost model sees it with its published rules refitted without the rows
    of ``harness``: its bandwidth and sync from the other harnesses' copy rows on it (the sync
    the other GPUs' median where none of them includes one, :func:`costs.published.sync_s`).
    A GPU whose rules no published copy fits (the H200) is as modelled. ``None`` when nothing
    else predicts a row of ``kind`` from ``harness``: every copy on the GPU is the harness's, or
    the row is a launch and every published launch row is the harness's."""
    base = devices.get(name)
    launches = [r for gpu in published.names() for r in published.profile(gpu).kernels if r["kernel"] == "launch"]
    if kind == "latency" and launches and all(_harness(r) == harness for r in launches):
        return None
    shipped = published.profile(name)
    copies = [] if shipped is None else [r for r in shipped.kernels if r["kernel"] == "copy"]
    if not copies:
        return base
    others = [r for r in copies if _harness(r) != harness]
    if not others:
        return None
    bandwidth, sync = published.fit_copies(others, published.launch_s())
    return devices.with_bandwidth(base, bandwidth, published.sync_s() if sync is None else sync)


def _model(name: str, row: Mapping[str, Any]) -> devices.Device:
    """A GPU that is not modelled, as the H100's rules with the row's sustained ``bandwidth_Bps``
    (its own name; launch and sync are host costs, the same for every GPU here)."""
    h100 = devices.get("h100")
    return devices.with_bandwidth(h100, float(row.get("bandwidth_Bps") or h100.memory_bandwidth_Bps), name=name)


def _rows() -> list[tuple[str, Mapping[str, Any], bool]]:
    """Every published kernel row: ``(device, row, fitted)``, the fitted files' first."""
    found = [(gpu, row, True) for gpu in published.names() for row in published.profile(gpu).kernels]
    data = json.loads(evidence_path().read_text())
    for i, raw in enumerate(data["rows"]):
        row = device_profile._kernel_row(raw, f"{evidence_path()}: row {i}")
        found.append((str(row["device"]).lower(), row, False))
    return found


@functools.lru_cache(maxsize=1)
def evidence() -> tuple[Evidence, ...]:
    """Every published kernel timing with the model's held-out price of it (read once per process)."""
    out = []
    for name, row, fitted in _rows():
        kind, harness = KIND_OF_KERNEL[row["kernel"]], _harness(row)
        model = held_out_device(name, harness, kind) if name in devices.GPUS else _model(name, row)
        model_s = None if model is None else costmodel.row_seconds(row, model)
        ratio = None if model_s is None else float(row["seconds"]) / model_s
        out.append(Evidence(name, kind, harness, float(row["seconds"]), model_s, ratio, fitted, row))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def kind_bands() -> dict[str, Band]:
    """The band of every kind of kernel (:data:`costs.costmodel.KERNEL_KINDS`) over its
    published timings (the module docstring); :data:`UNMEASURED` for a kind without any."""
    bands = {}
    for kind in costmodel.KERNEL_KINDS:
        ratios = [e for e in evidence() if e.kind == kind and e.ratio is not None]
        if not ratios:
            bands[kind] = Band(*UNMEASURED, 0, ())
            continue
        bands[kind] = Band(min(1.0, min(e.ratio for e in ratios)), max(1.0, max(e.ratio for e in ratios)),
                           len(ratios), tuple(sorted({e.harness for e in ratios})))
    return bands


def bands_on(device: devices.Device) -> dict[str, tuple[float, float]]:
    """The kind bands that hold on ``device``: :func:`kind_bands`, with :data:`UNMEASURED` for the
    kinds whose rates an earlier PyTorch's kernels replace on it (``v100@pytorch-1.3``)."""
    bands = {kind: (band.low, band.high) for kind, band in kind_bands().items()}
    if "@" in device.name:
        era = devices.ERAS[device.name.split("@", 1)[1]]
        for field in era:
            if field in ERA_KINDS:
                bands[ERA_KINDS[field]] = UNMEASURED
    return bands


def mix(parts: Mapping[str, float], bands: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    """The band of seconds split into kinds ``parts`` (kind → seconds) under kind ``bands``: each
    kind's seconds at its band's end, all at the same end; ``(1, 1)`` for no seconds."""
    total = sum(parts.values())
    if total <= 0:
        return 1.0, 1.0
    low = sum(t * bands[kind][0] for kind, t in parts.items()) / total
    high = sum(t * bands[kind][1] for kind, t in parts.items()) / total
    return low, high


def shares(compressor: str, density: float | None, device: devices.Device, numel: int) -> dict[str, float]:
    """Modelled seconds of one compress and one decompress call of ``compressor`` at ``density``
    on ``numel`` elements on ``device``, by kind of kernel (as training runs it, error feedback
    included: :func:`costs.costmodel.call_work`)."""
    work = costmodel.call_work(compressor, numel, 1.0 if density is None else float(density), device)
    parts = dict.fromkeys(costmodel.KERNEL_KINDS, 0.0)
    for side in (work.compress, work.decompress):
        for kind, seconds in costmodel.seconds_by_kind(side, device).items():
            parts[kind] += seconds
    return parts


_BANDS: dict[tuple[Any, ...], tuple[float, float]] = {}


def compressor_band(compressor: str, density: float | None, device: devices.Device) -> tuple[float, float]:
    """Factors ``(low, high)`` on the modelled compression costs of ``compressor`` at ``density``
    on GPU ``device``: the kind bands (:func:`bands_on`) mixed by where its modelled time goes
    (:func:`shares`), the wider end of the two bucket sizes the costs are fitted at
    (:data:`costs.costmodel.FIT_SIZES`). Cached per compressor, density and device."""
    key = (compressor, density, device.name, device.memory_bandwidth_Bps, device.launch_s, device.sync_s)
    if key not in _BANDS:
        bands = bands_on(device)
        ends = [mix(shares(compressor, density, device, numel), bands) for numel in costmodel.FIT_SIZES]
        _BANDS[key] = (min(low for low, _ in ends), max(high for _, high in ends))
    return _BANDS[key]


def table(kinds: Sequence[str] = costmodel.KERNEL_KINDS) -> list[dict[str, Any]]:
    """One row per kind: its band, how many published rows and harnesses it rests on (for the
    docs and ``sidco profile --check``)."""
    bands = kind_bands()
    return [{"kind": k, "low": bands[k].low, "high": bands[k].high, "rows": bands[k].rows,
             "harnesses": list(bands[k].harnesses)} for k in kinds]
