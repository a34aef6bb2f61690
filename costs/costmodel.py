"""The compression cost model: a compressor's declared work (:mod:`compressors.work`) in seconds
on a :class:`~costs.devices.Device`.

One call costs

    t = Σ_streaming kernels max(read / read_bw + written / write_bw, elements · op_s[kind])
          (the sum of the two for the kinds of :data:`NOT_OVERLAPPED`; a kernel the device
          timed whole, elements · whole_s: a selecting pass by its kept fraction, P·Qᵀ to memory)
        + Σ_top-k inputs · topk_s(kept fraction) + Σ_sorts length · sort_s(length) + gathered · gather_s
        + compacted · compact_s + 8 · hits / write_bw
        + Σ_fresh buffers ≥ alloc_threshold bytes · fault_s
        + flops / fp32_flops + launches · launch_s + syncs · sync_s + host_bytes / pcie_Bps

Each streaming kernel takes the longer of its memory traffic and its per-element compute (a
roofline per kernel), except a selecting pass, which takes both. Reads (except cold ones: state
kept between calls, such as error feedback's residual, and the gradient itself when no memory
came first) and gathers run ``reuse_speedup(working set)`` times faster (a CPU's last-level
cache as measured at each fraction of it filled; GPU caches are not modelled); when the working
set fits in the cache top-k and selecting passes take their in-cache rates. Writes go at
``write_bw``, the rate into a buffer evicted since it was last written with other written data
to write back: what a buffer kept between calls is in training, where a backward pass comes
between two calls for one bucket (a benchmark loop of the cheapest compressors at 2²⁰ elements
finds its output buffer still cached and writes it up to twice as fast), but for a ``rewrite``
pass (a map in place over a buffer the call has just written: the quantizers' divisions, roundings
and dequantizing multiplications), whose writes run ``reuse_speedup`` times faster too. On a CPU a
rewrite's reads and write-backs overlap (its lines are already owned, and one thread's reads are
bound by their latency, not by the bus: ``mul_`` in place over an evicted 64 MiB float32 buffer
takes 3.3 ms here, a ``sum`` over it 3.4 ms, reading it and writing it elsewhere 7.3 ms as
modelled), so it takes the longer of the two, at the ``reuse_speedup`` of its own bytes (the
buffer it rereads, which the pass before it has just written: ``mul_`` in place over a float32
buffer just filled, 0.16 ms at 2²⁰ elements, where reading it and writing it elsewhere is
modelled at 0.30 ms), and at least the compute of a ``map``; on a GPU it is a ``map`` whose writes
go at the cache's speed (none modelled there); sorts and compactions are bound by compute. Launch and sync latencies are added, not overlapped with device work: for the sizes
that matter (≥ 1 MiB) they are small, below it they dominate, as on a real GPU. SIDCo runs its
native kernels on a ``cpu`` device (float32) and its fused Triton kernels on a GPU (the ``gpu``
extra), DGC, Gaussian-k and RedSync select with the native kernels on a ``cpu`` device and with
the fused Triton compaction on a GPU, as the code does.
Units: seconds, elements, bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compressors import work as declared
from compressors.rules import trains_with_error_feedback
from costs.devices import Device, radix_sort_bytes
from costs.profile import CompressionCost, CompressionProfile, density_key

NOT_OVERLAPPED = ("native_select",)
"""Kernel kinds whose memory traffic and compute add up instead of overlapping: a selecting
pass branches on the data and writes what it keeps (on this testbed's CPU, 1 % kept at 2²⁴
elements: 0.52 ns per element against 0.18 to read and 0.34 to compute in cache)."""

FIT_SIZES = (1 << 20, 1 << 24)
"""Bucket sizes (elements) between which :func:`compression_profile` fits its linear costs."""


KERNEL_KINDS = ("elementwise", "reduction", "sort/top-k", "compaction", "scatter/gather", "matmul", "latency")
"""The kinds of kernel a call's modelled seconds are split into (:func:`seconds_by_kind`), each
checked against its own published GPU timings (:mod:`costs.kernel_bands`): streaming maps,
casts and comparisons (and fresh-page faults); reductions (sum, amax, min/max, counts);
``torch.topk`` and sorts; ``nonzero`` and the positions it writes; gathers and scatters;
matrix products (PowerSGD's ``P·Qᵀ`` and its FLOPs); launches, synchronisations and the host's
reads over PCIe."""

STREAM_KIND = {"reduce": "reduction", "minmax": "reduction", "count": "reduction", "outer": "matmul"}
"""The kind of kernel of each streaming kind (:data:`compressors.work.declare.KINDS`) that is not elementwise."""


def seconds_by_kind(work: declared.Work, device: Device) -> dict[str, float]:
    """Seconds one call with ``work`` takes on ``device``, split into :data:`KERNEL_KINDS` (the
    formula of the module docstring, term by term; their sum is :func:`seconds`)."""
    parts = dict.fromkeys(KERNEL_KINDS, 0.0)
    fits = 0 < work.working_set_bytes < device.cache_bytes
    speedup = device.reuse_speedup(work.working_set_bytes)
    for kind, elements, read, written, cold in work.streams:
        where = STREAM_KIND.get(kind, "elementwise")
        kept = written / 8.0 / max(elements, 1.0)
        if kind == "native_log" and written > 0:  # a pass with logarithms that also collects (SIDCo-GP's first)
            selecting = device.whole_s("native_select", kept, cached=fits and not cold)
            if selecting is not None:  # the selecting pass timed whole, plus the logarithms' own compute
                logs = device.op_s_per_element.get("native_log", 0.0) - device.op_s_per_element.get("native", 0.0)
                parts[where] += elements * (selecting + max(logs, 0.0))
                continue
        measured = device.whole_s(kind, kept, cached=fits and not cold)
        if measured is not None:  # a kernel timed whole (a selecting pass at its kept fraction, P·Qᵀ)
            parts[where] += elements * measured
            continue
        if kind == "rewrite" and device.kind == "cpu":  # write-backs behind its reads, at its own reuse distance
            memory = max(read / device.memory_bandwidth_Bps, written / device.write_bandwidth_Bps) / \
                device.reuse_speedup(read)
        else:
            memory = (read / device.memory_bandwidth_Bps / (1.0 if cold else speedup)
                      + written / device.write_bandwidth_Bps / (speedup if kind == "rewrite" else 1.0))
        compute = elements * device.op_s_per_element.get("map" if kind == "rewrite" else kind, 0.0)
        parts[where] += memory + compute if kind in NOT_OVERLAPPED else max(memory, compute)
    parts["sort/top-k"] += (sum(n * device.topk_s(kept, cached=fits) for n, kept in work.topk)
                            + sum(n * device.sort_s(n) for n in work.sorts))
    parts["scatter/gather"] += work.gather_elements * device.gather_s_per_element / speedup
    parts["compaction"] += (work.compact_elements * device.compact_s_per_element
                            + 8.0 * work.compact_hits / device.write_bandwidth_Bps)
    parts["elementwise"] += (sum(size for size in work.allocations if size >= device.alloc_threshold_bytes)
                             * device.fault_s_per_byte)
    parts["matmul"] += work.flops / device.fp32_flops
    parts["latency"] += work.launches * device.launch_s + work.syncs * device.sync_s + work.host_bytes / device.pcie_Bps
    return parts


def seconds(work: declared.Work, device: Device) -> float:
    """Seconds one call with ``work`` takes on ``device`` (the formula of the module docstring)."""
    return sum(seconds_by_kind(work, device).values())


def kernel_seconds(kernel: str, numel: int, device: Device, *, element_bytes: float = 4.0, launches: int = 0,
                   syncs: int = 0, out_bytes: float | None = None, value_bytes: float = 0.0,
                   k: int | None = None, inner: int | None = None, rows: int | None = None) -> float:
    """Modelled seconds of one published kernel timing (a kernel row of
    :mod:`costs.device_profile`) on ``device``: ``copy`` and ``cast`` read ``numel``
    elements of ``element_bytes`` bytes and write ``out_bytes`` each (default ``element_bytes``),
    ``read`` reads them, ``fill`` writes them (at the read and write bandwidths), ``sort`` sorts
    ``numel`` keys of ``element_bytes`` with ``value_bytes`` of payload each (the device's rate
    per int64 key, :meth:`~costs.devices.Device.sort_s`, scaled by the bytes a radix sort
    moves, :func:`~costs.devices.radix_sort_bytes`), ``topk`` keeps ``k`` of ``numel``
    (:meth:`~costs.devices.Device.topk_s`), ``matmul`` is a product with ``numel`` outputs
    in ``rows`` rows (default a square) over an ``inner`` dimension (its FLOPs at the fp32 rate
    plus its operands and output at the bandwidth, as :func:`seconds` charges PowerSGD's), ``launch``
    has no device time; plus the ``launches`` and ``syncs`` the timing included, at ``launch_s``
    and ``sync_s`` each."""
    size = numel * element_bytes
    written = numel * (element_bytes if out_bytes is None else out_bytes)
    streamed = size / device.memory_bandwidth_Bps + written / device.write_bandwidth_Bps
    if kernel == "topk":
        if not k or not 1 <= k <= numel:
            raise ValueError(f"a topk row keeps k of numel elements, 1 <= k <= {numel}, got {k!r}")
        device_s = numel * device.topk_s(k / numel)
    elif kernel == "matmul":
        if not inner or inner < 1:
            raise ValueError(f"a matmul row needs its inner dimension, got {inner!r}")
        m = rows or max(1, round(math.sqrt(numel)))
        operands = (m * inner + inner * numel / m) * element_bytes
        device_s = 2.0 * numel * inner / device.fp32_flops + operands / device.memory_bandwidth_Bps + \
            written / device.write_bandwidth_Bps
    else:
        by_kernel = {"copy": streamed, "cast": streamed,
                     "read": size / device.memory_bandwidth_Bps, "fill": size / device.write_bandwidth_Bps,
                     "sort": numel * device.sort_s(numel) * radix_sort_bytes(element_bytes, value_bytes)
                     / radix_sort_bytes(8),
                     "launch": 0.0}
        if kernel not in by_kernel:
            raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join([*by_kernel, 'topk', 'matmul'])}")
        device_s = by_kernel[kernel]
    return device_s + launches * device.launch_s + syncs * device.sync_s


def row_seconds(row: Mapping[str, Any], device: Device) -> float:
    """:func:`kernel_seconds` of one checked kernel row (:mod:`costs.device_profile`) on ``device``."""
    return kernel_seconds(row["kernel"], int(row["numel"]), device, element_bytes=float(row["element_bytes"]),
                          launches=int(row["launches"]), syncs=int(row["syncs"]), out_bytes=float(row["out_bytes"]),
                          value_bytes=float(row["value_bytes"]), k=row.get("k"), inner=row.get("inner"),
                          rows=row.get("rows"))


def backend_on(kind: str, compressor: str) -> str:
    """The code path ``compressor`` takes on a device of ``kind`` (``cpu``/``gpu``) for float32:
    the fused native kernels on a CPU where they are built (:func:`compressors.kernels.native_build.built`
    asks, never builds: pricing compiles nothing; SIDCo, and the selection of Top-k, DGC,
    Gaussian-k and RedSync), on a GPU the fused Triton kernels of SIDCo and of the selection of
    DGC, Gaussian-k and RedSync (``fused``, :data:`compressors.work.FUSED`: what ``backend="auto"``
    runs there with the ``gpu`` extra installed) and ``cuda`` for the others, torch otherwise.
    Which compressors run native kernels on a CPU is on their cards (``native_on_cpu``)."""
    card = declared.CARDS.get(compressor)
    if kind == "cpu" and card is not None and card.native_on_cpu:
        from compressors.kernels import native_build

        return "native" if native_build.built() else "torch"
    if kind == "gpu":
        return "fused" if compressor in declared.FUSED else "cuda"
    return "torch"


def call_work(compressor: str, numel: int, density: float, device: Device, *,
              stages: int | None = None, error_feedback: bool | None = None,
              backend: str | None = None, rounds: int | None = None,
              trim: bool = True, steps: int | None = None,
              pool: float | None = None, collects: int = 1,
              hits: Sequence[float] | None = None, deepened: int | None = None) -> declared.CallWork:
    """The declared work of one call of ``compressor`` on ``numel`` fp32 elements as ``device``
    runs it (``backend``: the code path, default :func:`backend_on` the device; ``stages``,
    ``rounds``, ``trim``, ``steps``, ``pool``, ``collects``, ``hits``, ``deepened``: the
    data-dependent counts of :func:`compressors.work.work`; ``error_feedback``: default as
    training runs ``compressor``, :func:`compressors.rules.trains_with_error_feedback`)."""
    return declared.work(compressor, numel, density, stages=stages, rounds=rounds, trim=trim, steps=steps,
                         pool=pool, collects=collects, hits=hits, deepened=deepened,
                         backend=backend or backend_on(device.kind, compressor),
                         error_feedback=trains_with_error_feedback(compressor) if error_feedback is None
                         else error_feedback)


def call_seconds(compressor: str, numel: int, density: float, device: Device, **counts: Any) -> tuple[float, float]:
    """Modelled (compress, decompress) seconds of one call of ``compressor`` on ``numel`` fp32
    elements (``counts``: the keywords of :func:`call_work`)."""
    call = call_work(compressor, numel, density, device, **counts)
    return seconds(call.compress, device), seconds(call.decompress, device)


def source_label(device: Device) -> str:
    """The cost source of modelled costs: ``model h200`` (``model cpu 2026-12-01`` when the
    host's numbers were measured then; ``model cpu (defaults)`` when they never were)."""
    if device.kind == "cpu" and not device.measured:
        return f"model {device.name} (defaults)"
    return f"model {device.label_for_source()}"


def cost(compressor: str, density: float | None, device: Device) -> CompressionCost:
    """Linear costs ``t0 + t1·numel`` of ``compressor`` at ``density`` on ``device``, through the
    model's times at :data:`FIT_SIZES`; wire bytes per element from the message format; the
    cost's ``source`` is :func:`source_label`, followed by `` fused`` where the modelled code
    path is a fused one (``model a100 fused``: SIDCo's, or DGC's, Gaussian-k's and RedSync's
    fused selection)."""
    d = 1.0 if density is None else float(density)
    small, large = FIT_SIZES
    c_small, d_small = call_seconds(compressor, small, d, device)
    c_large, d_large = call_seconds(compressor, large, d, device)

    def line(t_small: float, t_large: float) -> tuple[float, float]:
        slope = max(0.0, (t_large - t_small) / (large - small))
        return max(0.0, t_small - slope * small), slope

    c0, c1 = line(c_small, c_large)
    d0, d1 = line(d_small, d_large)
    fused = " fused" if backend_on(device.kind, compressor) == "fused" and declared.fused_path(
        compressor, large, d) else ""
    return CompressionCost(c0, c1, d0, d1, (declared.wire_bytes(compressor, large, d) / large,),
                           source_label(device) + fused)


def compression_profile(device: Device, pairs: Iterable[tuple[str, float | None]]) -> CompressionProfile:
    """Modelled costs of every ``(compressor, density)`` in ``pairs`` (``none`` skipped) on ``device``."""
    costs = {
        (name, density_key(density)): cost(name, density, device) for name, density in pairs if name != "none"
    }
    return CompressionProfile(costs, source_label(device))
