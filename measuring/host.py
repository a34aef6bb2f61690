"""Measuring this host's ``cpu`` device numbers (explicit job only: ``sidco profile --run-on cpu``).

The timing loops behind :func:`measure_host`; the cluster model (:mod:`costs.devices`) only
reads the :class:`~costs.devices.Device` they produce.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from costs.devices import NO_TENSOR_UNITS, Device
from machine import host_identity, host_key
from machine.timing import timed


def host_clock():
    """The clock for timing work on this host: with one torch thread the process's CPU time
    (``time.process_time``: other work sharing the cores does not inflate it, page faults and
    the kernel's work on its behalf still count), otherwise the wall clock."""
    import torch

    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def _timings(fn, repeats: int, before=None) -> list[float]:
    """``repeats`` timed calls of ``fn`` (s each, :func:`host_clock`), after one untimed call;
    ``before`` (untimed) runs ahead of each call (to leave the caches as the call finds them in use)."""
    clock = host_clock()
    fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        times.append(timed(fn, clock)[0])
    return times


def _best(fn, repeats: int, before=None) -> float:
    """Fastest of :func:`_timings` (s): compute rates and latencies, which other work only slows."""
    return min(_timings(fn, repeats, before))


def _median(fn, repeats: int, before=None) -> float:
    """Median of :func:`_timings` (s): for memory bandwidths, which move both ways from call to
    call (the fastest 64 MiB write here was up to 25 % above the median, and which call got lucky
    changed the model by as much)."""
    return statistics.median(_timings(fn, repeats, before))


CACHE_FRACTIONS = (0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5)
"""Working sets, as fractions of the last-level cache, at which :func:`measure_host` times a
re-read (``torch.sum`` of a vector that large, again and again): on a shared CPU the rate falls
long before the cache is full (here 90 GB/s up to a quarter of it, 55 at half, 22 beyond). The
first, 1/8 of the cache, is also the speed-up ``cache_speedup`` states below the cache size."""


SORT_LENGTHS = (2**10, 2**12, 3 * 2**11, 2**13, 2**14, 2**15 - 1, 2**15, 2**16, 2**18, 2**20)
"""Lengths at which :func:`measure_host` times ``torch.sort`` of int64 keys (a selection's
indices). On torch 2.13's CPU build the rate per element is ≈ 12 ns up to 2¹², rises to ≈ 40 ns
from 2¹³ to 2¹⁵ − 1 and falls back to ≈ 12 ns from 2¹⁵ on (where a radix sort takes over for
integer keys): hence the points on both sides of each step."""


def _measure_sorts(torch, gen, repeats: int) -> tuple[tuple[float, float], ...]:
    """``torch.sort`` seconds per element of random int64 keys at each of :data:`SORT_LENGTHS`."""
    rates = []
    for m in SORT_LENGTHS:
        keys = torch.randint(1 << 24, (m,), generator=gen)
        rates.append((float(m), _best(lambda: torch.sort(keys), repeats * 3) / m))
    return tuple(rates)


def host_cache_bytes() -> float:
    """Size of this host's last-level cache (bytes; 0 when the system does not say)."""
    best = 0.0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        best = max(best, float(text.rstrip("KMG")) * scale)
    return best


MMAP_THRESHOLD_BYTES = 32 * 2**20
"""glibc maps blocks at least this large afresh on every allocation (its largest dynamic mmap
threshold on 64-bit Linux); smaller blocks are reused from the heap."""


SELECT_KEPT = {1e-05: 4.4172, 0.001: 3.2905, 0.01: 2.5758, 0.1: 1.6449}
"""Kept fraction of a selecting pass → the threshold on ``|z|``, ``z`` standard normal, that keeps it."""


def _measure_ops(torch, gen, repeats: int, large) -> dict[str, float]:
    """Per-element compute time of each kernel kind on 2¹⁸ fp32 elements (1 MiB: in cache, so
    compute rather than memory bounds it): abs (map), sum (reduce), ``aminmax`` of their fp16
    cast (minmax), ``>`` into a mask
    (compare), ``count_nonzero`` (count), ``log`` (log), a rank-1 ``P·Qᵀ`` into a kept matrix
    (outer; and timed whole on ``large``'s size from memory, after rewriting ``large``:
    ``outer_memory``, a matrix product writes slower than ``zero_``), and the fused C kernels: a statistics
    pass (native), a statistics pass with logarithms (native_log), and the selecting pass at the
    kept fractions of :data:`SELECT_KEPT` in cache and on ``large`` (a vector beyond the cache:
    memory traffic included), timed whole for :meth:`Device.select_s`. Without that table (older
    measurements, the stated defaults) a selecting pass is charged ``native_select`` per element
    plus its memory traffic."""
    from compressors.kernels import native

    m = 1 << 18
    a = torch.randn(m, generator=gen).abs()
    out = torch.empty_like(a)
    mask = torch.empty(m, dtype=torch.bool)
    threshold = torch.tensor(2.0)
    half = a.half()
    torch.gt(a, threshold, out=mask)
    loops = repeats * 3
    ops = {
        "map": _best(lambda: torch.abs(a, out=out), loops) / m,
        "reduce": _best(lambda: torch.sum(a), loops) / m,
        "minmax": _best(lambda: torch.aminmax(half), loops) / m,
        "compare": _best(lambda: torch.gt(a, threshold, out=mask), loops) / m,
        "count": _best(lambda: torch.count_nonzero(mask), loops) / m,
        "log": _best(lambda: torch.log(a, out=out), loops) / m,
    }
    if native.library() is not None:
        ops["native"] = _best(lambda: native.scan(a, absolute=True, shift=1.0), loops) / m
        ops["native_log"] = _best(lambda: native.scan(a, absolute=True, logs=True), loops) / m
        small = (torch.empty(m, dtype=torch.int32), torch.empty(m))
        big = (torch.empty(large.numel(), dtype=torch.int32), torch.empty(large.numel()))
        for kept, t in SELECT_KEPT.items():
            ops[f"native_select@{kept:g}"] = _best(
                lambda: native.select_above(a, t, absolute=True, buffers=small), loops) / m
            ops[f"native_select_memory@{kept:g}"] = _best(
                lambda: native.select_above(large, t, absolute=True, buffers=big), repeats) / large.numel()
    else:
        ops["native"], ops["native_select"], ops["native_log"] = ops["reduce"], ops["compare"], ops["log"]
    side = math.isqrt(m)
    p, q = torch.randn(side, 1, generator=gen), torch.randn(1, side, generator=gen)
    ops["outer"] = _best(lambda: torch.mm(p, q, out=out.view(side, side)), loops) / m
    big_side = math.isqrt(large.numel())
    p, q = torch.randn(big_side, 1, generator=gen), torch.randn(1, big_side, generator=gen)
    written = torch.zeros(big_side, big_side)
    ops["outer_memory"] = _best(lambda: torch.mm(p, q, out=written), repeats, before=lambda: large.mul_(1.0)) / (
        big_side * big_side)
    return ops


TOPK_DENSITIES = (0.001, 0.01, 0.1)


def _measure_topk(torch, mag, cache: float, repeats: int) -> tuple[tuple[tuple[float, float], ...], ...]:
    """``torch.topk`` seconds per input element at :data:`TOPK_DENSITIES`: on ``mag`` (beyond the
    cache) and on a prefix whose top-k working set (16 bytes per element) fits in the cache."""
    cached = mag[: max(1 << 12, int(cache) // 32)]

    def rate(v, d):
        return _best(lambda: torch.topk(v, max(1, round(d * v.numel())), sorted=False), max(2, repeats // 2)) / v.numel()

    return tuple((d, rate(mag, d)) for d in TOPK_DENSITIES), tuple((d, rate(cached, d)) for d in TOPK_DENSITIES)
"""Densities at which :func:`measure_host` times ``torch.topk`` (a CPU top-k's cost depends on k)."""


def fastest(a: Device, b: Device) -> Device:
    """Two measurements of this host combined figure by figure, keeping the faster of each (on a
    shared machine the least disturbed; rates measured as seconds take the smaller), except the
    memory bandwidths and the cache's speed-ups, medians both, whose mean is kept."""
    faster_high = ("fp32_flops", "bf16_flops")
    faster_low = ("launch_s", "sync_s", "sort_s_per_element", "gather_s_per_element", "compact_s_per_element",
                  "fault_s_per_byte")
    values: dict[str, Any] = {k: max(getattr(a, k), getattr(b, k)) for k in faster_high}
    values.update({k: min(getattr(a, k), getattr(b, k)) for k in faster_low})
    values.update({k: (getattr(a, k) + getattr(b, k)) / 2
                   for k in ("memory_bandwidth_Bps", "write_bandwidth_Bps", "pcie_Bps", "cache_speedup")})
    b_points = dict(b.cache_speedup_by_fraction)
    values["cache_speedup_by_fraction"] = tuple((f, (s + b_points.get(f, s)) / 2) for f, s in a.cache_speedup_by_fraction)
    for key in ("topk_s_per_element", "topk_cache_s_per_element", "sort_s_by_size"):
        values[key] = tuple((d, min(t, dict(getattr(b, key)).get(d, t))) for d, t in getattr(a, key))
    values["op_s_per_element"] = {k: min(t, b.op_s_per_element.get(k, t)) for k, t in a.op_s_per_element.items()}
    sources = {k: v.replace("fastest of", "fastest of two sessions of").replace("median of", "mean of two sessions of the median of")
               for k, v in a.sources.items()}
    return replace(a, **values, sources=sources)


LAUNCH_PROBE = ("gaussiank", 1 << 12, 0.001)
"""The call :func:`_launch_s` times: (compressor, elements, density). Gaussian-k's compress issues
≈ 50 eager operations at 4,096 elements (its moments, the 0-d threshold formula, three
corrections, each a selection), and at 4,096 elements its data work is a few µs. (SIDCo, which
was the probe while its estimator ran as 0-d device operations, now does that algebra on host
floats and dispatches ≈ 13.)"""


def _launch_s(torch, repeats: int) -> float:
    """Seconds per eager operation as the compressors issue them between their kernels: the
    compress of :data:`LAUNCH_PROBE` on a fixed gradient-like vector, after warm-up (so every
    call dispatches the same operations), timed and divided by the
    operations it dispatches (0-d arithmetic and the Python around it; an earlier rule timed the
    generalized-Pareto formula alone, a tight loop of float64 0-d operations, at 1.24 µs per
    operation against the 2.0 µs the compressors pay on this testbed's CPU)."""
    import compressors
    from compressors.work.counting import HITS_MARKER, record_ops
    from measuring.samples import gradient_like

    name, numel, density = LAUNCH_PROBE
    grad = gradient_like(numel, 0, torch.device("cpu"))
    compressor = compressors.create(name, density=density)
    for _ in range(5):
        compressor.compress(grad)
    _, ops = record_ops(lambda: compressor.compress(grad))
    dispatched = sum(1 for op in ops if op not in ("_local_scalar_dense", "view", "alias", "detach", "slice")
                     and not op.startswith(HITS_MARKER))
    return _best(lambda: compressor.compress(grad), repeats * 3) / dispatched


def measure_host(repeats: int = 7, numel: int = 1 << 24) -> Device:
    """Measure this host's ``cpu`` numbers (fastest of ``repeats``; threads as torch has them).

    Memory bandwidths and the cache's speed-ups take the median of ``3 · repeats`` (:func:`_median`),
    everything else the fastest. Read bandwidth: ``torch.sum`` over ``numel`` fp32, or over twice the
    last-level cache where that is larger (a cache of 300 MiB holds 2²⁴ floats, and a read from
    memory, as of a gradient written long before the call, is then 2.5 times slower than that
    re-read); write: ``zero_`` of a kept ``numel`` buffer just after rewriting that much data or
    more (evicted, with other written data to write back, as between a compressor's calls);
    FLOP/s: 1024³ fp32 and bf16 matrix products; launch: :func:`_launch_s` (the 0-d arithmetic between a
    compressor's kernels, per operation); sync: ``.item()``;
    top-k: :func:`_measure_topk`; sort: :func:`_measure_sorts` (``sort_s_per_element`` is its rate
    at 2¹⁴, for lengths it does not cover); gather: ``index_select``
    of 2¹⁸ random positions;
    compaction: ``nonzero`` of a 1 %-dense mask; per-element compute of each kernel kind:
    :func:`_measure_ops`; page faults: a fresh ``x + x`` less one into a kept buffer; cache speed-up: ``torch.sum`` over a vector of 1/8 of the last-level cache
    against ``numel``, and the same at each working set of :data:`CACHE_FRACTIONS`.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=gen)
    out = torch.empty_like(x)
    cache = host_cache_bytes()
    memory = x if 4 * numel >= 2 * cache else torch.randn(math.ceil(2 * cache / 4), generator=gen)
    read = 4 * memory.numel() / _median(lambda: torch.sum(memory), repeats * 3)
    write = 4 * numel / _median(lambda: out.zero_(), repeats * 3, before=lambda: memory.mul_(1.0))
    by_fraction = tuple((f, max(1.0, 4 * v.numel() / _median(lambda: torch.sum(v), repeats * 3) / read))
                        for f, v in ((f, memory[: max(1024, int(f * cache) // 4)]) for f in CACHE_FRACTIONS)
                        ) if cache else ()
    del memory
    a = torch.randn(1024, 1024, generator=gen)
    fp32 = 2 * 1024**3 / _best(lambda: torch.mm(a, a), repeats)
    ab = a.to(torch.bfloat16)
    bf16 = 2 * 1024**3 / _best(lambda: torch.mm(ab, ab), repeats)
    launch = _launch_s(torch, repeats)
    scalar = torch.ones(())
    sync = _best(lambda: [scalar.item() for _ in range(1000)], repeats) / 1000
    topk, topk_cached = _measure_topk(torch, x[: 1 << 22].abs(), cache, repeats)
    sorts = _measure_sorts(torch, gen, repeats)
    positions = torch.randint(numel, (1 << 18,), generator=gen)
    gather = _best(lambda: x.index_select(0, positions), repeats) / positions.numel()
    mask = torch.rand(numel, generator=gen) < 0.01
    compact = _best(lambda: torch.nonzero(mask), repeats) / numel
    ops = _measure_ops(torch, gen, repeats, x.abs())
    fresh = _best(lambda: torch.add(x, x), repeats)
    fault = max(0.0, fresh - _best(lambda: torch.add(x, x, out=out), repeats)) / (4 * numel)
    identity = {**host_identity(), "threads": torch.get_num_threads()}
    how = f"measured on this host by sidco profile ({torch.get_num_threads()} threads, fastest of {repeats})"
    values = {
        "memory_bandwidth_Bps": read, "write_bandwidth_Bps": write, "fp32_flops": fp32, "bf16_flops": bf16,
        "launch_s": launch, "sync_s": sync, "pcie_Bps": read, "topk_s_per_element": topk, "topk_cache_s_per_element": topk_cached,
        "sort_s_per_element": dict(sorts)[2.0**14], "sort_s_by_size": sorts, "gather_s_per_element": gather, "compact_s_per_element": compact,
        "op_s_per_element": ops, "alloc_threshold_bytes": MMAP_THRESHOLD_BYTES, "fault_s_per_byte": fault,
        "cache_bytes": cache,
        "cache_speedup": by_fraction[0][1] if by_fraction else 1.0,
        "cache_speedup_by_fraction": by_fraction,
    }
    sources = {k: how for k in values}
    for key in ("memory_bandwidth_Bps", "write_bandwidth_Bps", "cache_speedup", "cache_speedup_by_fraction"):
        sources[key] = how.replace(f"fastest of {repeats}", f"median of {3 * repeats}")
    sources["pcie_Bps"] = "no host link on the host itself: its read bandwidth"
    sources.update({k: NO_TENSOR_UNITS for k in ("fp16_flops", "tf32_flops")})
    sources["cache_bytes"] = "last-level cache size reported by the kernel (/sys/devices/system/cpu)"
    sources["alloc_threshold_bytes"] = "glibc's largest dynamic mmap threshold on 64-bit Linux (32 MiB)"
    return Device(name="cpu", kind="cpu", label=f"this host: {host_key(identity)}", **values, sources=sources,
                  measured=time.strftime("%Y-%m-%d", time.gmtime()), identity=identity)
