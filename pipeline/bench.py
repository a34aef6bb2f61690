"""Steady-state micro-benchmark of compress/decompress against a one-pass floor.

Every compressor runs in one process on the same seeded gradient-like vector, as a training loop
would run it: same sizes every call (buffers reused), after warm-up calls (adaptive SIDCo has
settled its stage count by then), timing the median of repeats. The floor is one read pass
(``torch.sum``) over the same vector, timed interleaved with each compressor so that ratios are
measured side by side on a noisy shared machine. Times are milliseconds.
"""

from __future__ import annotations

import importlib.util

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import compressors
from compressors.work import FUSED
from measuring.samples import gradient_like
from machine.device import available_memory, resolve as resolve_device
from machine import device_identity
from machine.timing import no_sync, timed
from units import check_count

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def density_bound(name: str) -> bool:
    """Whether compressor ``name`` sends a chosen fraction of elements (runs at every density);
    ``none`` and the dense and low-rank compressors do not (they run once, at density 1)."""
    return compressors.takes_density(name)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``wall``: elapsed seconds; ``cpu``: CPU seconds of this process, all its threads (on a shared
machine it leaves out the time other processes hold the cores; with one thread it is the work
itself, with several it also counts threads waiting at a barrier)."""


def _timer(device: torch.device, clock: str = "wall") -> Callable[[Callable[[], Any]], tuple[float, Any]]:
    sync = torch.cuda.synchronize if device.type == "cuda" else no_sync
    now = CLOCKS[clock]

    def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
        seconds, result = timed(fn, now, sync)
        return seconds * 1e3, result

    return timed_ms


def run(size: int, densities: Sequence[float], device: str = "cpu", names: Sequence[str] | None = None,
        repeats: int = 10, warmup: int = 10, dtype: str = "fp32", seed: int = 0, threads: int | None = None,
        progress: Callable[[str], None] | None = None, clock: str = "wall",
        stages: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Benchmark ``names`` (default: all) at each density; return one dict per (compressor, density).

    Keys: compressor, density, size, dtype, device, compress_ms, decompress_ms, floor_ms,
    over_floor (compress_ms / floor_ms), speedup_vs_topk (topk's over_floor / this row's over_floor
    at the same density, when topk ran: each row is normalised by its own interleaved floor, so a
    change of machine load between the two rows cancels), speedup_vs_topk_raw (topk compress_ms /
    compress_ms), compress_min_ms / floor_min_ms / over_floor_min / speedup_vs_topk_min (the same
    from the fastest repeat: on a shared machine the minimum is the least disturbed estimate), achieved_over_target, selected, stages, fallback (the count guard sent the exact top-k), wire_bytes,
    repeats, warmup, threads, clock (``wall`` or ``cpu``: :data:`CLOCKS`), backend (what ran the timed calls: ``native``, ``fused``, ``torch`` or ``cuda``; on a GPU with
    Triton each compressor with a fused path, :data:`compressors.work.FUSED`, has a ``fused`` row and an eager
    ``cuda`` row),
    device_identity (CPU model and SIMD flags, or the GPU's name). ``none``, ``fp16``, ``bf16`` and
    ``powersgd`` (rank 1, the vector as one square matrix) run once at density 1. ``threads`` sets torch's (and the
    native kernels') CPU thread count for the run (default: leave it as it is). ``stages``: run
    each SIDCo variant once per fixed stage count in it (rows side by side; default: once, with its
    adaptive stage count).
    """
    if size < 1:
        raise ValueError(f"size must be >= 1 element, got {size}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    names = list(names) if names else compressors.names()
    compressors.check_names(names)
    dev = resolve_device(device)
    need = 4 * size * torch.empty(0, dtype=DTYPES[dtype]).element_size()
    free = available_memory(dev)
    if need > free:
        raise ValueError(f"size {size:,} elements needs ~{need / 2**30:,.1f} GiB (the vector and 3 work copies), "
                         f"{dev} has {free / 2**30:,.1f} GiB free; lower --size")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    grad = gradient_like(size, seed, dev, DTYPES[dtype])
    if clock not in CLOCKS or (clock == "cpu" and dev.type == "cuda"):
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)} (cpu only for CPU tensors), got {clock!r}")
    timed = _timer(dev, clock)
    out = torch.empty_like(grad)
    rows = []
    if stages is not None and not stages:
        raise ValueError("stages must name at least one stage count")
    for m in stages or ():
        check_count(m, "stages")
    plan = [(n, 1.0, None) for n in names if not density_bound(n)] + [
        (n, d, m) for d in densities for n in names if density_bound(n)
        for m in (stages if stages and n.startswith("sidco") else [None])]
    # on a GPU with Triton, SIDCo, DGC, Gaussian-k and RedSync run fused by default: their eager torch path gets a row
    both = dev.type == "cuda" and importlib.util.find_spec("triton") is not None
    made = [(name, density, fixed, compressors.create(name, density=density, **option,
                                                      **({} if fixed is None else {"stages": fixed})))
            for name, density, fixed in plan
            for option in ([{}, {"backend": "torch"}] if both and name in FUSED else [{}])]
    identity = device_identity(dev)
    for name, density, fixed, c in made:
        if progress:
            progress(f"{name} δ={density:g}")
        sparse = None
        for _ in range(warmup):
            sparse = c.compress(grad)
            c.decompress(sparse, out=out)
        floors, comps, decomps = [], [], []
        for _ in range(repeats):
            floors.append(timed(lambda: torch.sum(grad))[0])
            ms, sparse = timed(lambda: c.compress(grad))
            comps.append(ms)
            decomps.append(timed(lambda: c.decompress(sparse, out=out))[0])
        rows.append({
            "compressor": name, "density": density, "size": size, "dtype": dtype, "device": str(dev),
            "compress_ms": statistics.median(comps), "decompress_ms": statistics.median(decomps),
            "floor_ms": statistics.median(floors),
            "compress_min_ms": min(comps), "floor_min_ms": min(floors),
            "achieved_over_target": sparse.selected / (density * size),
            "selected": sparse.selected, "stages": sparse.stages, "wire_bytes": sparse.wire_bytes(),
            "fallback": sparse.fallback,
            "repeats": repeats, "warmup": warmup, "threads": torch.get_num_threads(), "clock": clock,
            "backend": c.backend, "device_identity": identity,
        })
    for r in rows:
        r["over_floor"] = r["compress_ms"] / r["floor_ms"]
        r["over_floor_min"] = r["compress_min_ms"] / r["floor_min_ms"]
    topk = {r["density"]: r for r in rows if r["compressor"] == "topk"}
    for r in rows:
        ref = topk.get(r["density"])
        r["speedup_vs_topk"] = ref["over_floor"] / r["over_floor"] if ref else None
        r["speedup_vs_topk_raw"] = ref["compress_ms"] / r["compress_ms"] if ref else None
        r["speedup_vs_topk_min"] = ref["compress_min_ms"] / r["compress_min_ms"] if ref else None
    return rows
