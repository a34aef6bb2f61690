"""Measuring a device profile: steady-state compress/decompress times of compressors.

Each (compressor, density, size) runs in this process, with error feedback (as training runs
it), on a rotation of three seeded gradient-like vectors (so thresholds and residuals move as
they do between iterations), after ``warmup`` untimed calls (adaptive SIDCo settles its stage
count), timing ``repeats`` calls device-synchronised (on a CPU with one thread by the process's
CPU time, :func:`simulator.devices.host_clock`, so that other work on a shared machine does not
inflate them). Rows keep the median call as ``compress_s``/``decompress_s`` (a call that ran:
the typical cost, fresh-page faults and data-dependent loops included as often as they occur;
the fastest call skips them when it is lucky) and add the fastest and the slowest. Every call is
reseeded (``reseed(call)``), so a second, untimed run of the same sequence with the op recorder
(:func:`compressors.work.record_ops`) makes the same calls: for the compressors whose work depends
on the data (Gaussian-k's corrections, RedSync's probes, DGC's lowerings and trim, Top-k's
halvings, Random-k's draws, SIDCo's stages, pool, passes and correction steps) a row carries the
loop counts of the very call it reports, so the cost model is checked with the loops that ran. Nothing else in the testbed times compressors
implicitly: this runs only from ``sidco profile``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import compressors
from compressors import work as declared
from compressors.samples import gradient_like
from simulator import devices
from simulator.costmodel import backend_on
from simulator.device_profile import DeviceProfile

GPU_NAMES = {"H200": "h200", "H100": "h100", "A100": "a100", "V100": "v100"}


def pin_threads(threads: int) -> list[int]:
    """Run torch (and the native kernels) on ``threads`` threads pinned to the first ``threads``
    CPUs this process may use; returns those CPUs."""
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    chosen = allowed[:threads]
    if chosen and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, chosen)
    return chosen


def torch_device(device: str) -> torch.device:
    """``device`` as a torch device that can be measured here; ValueError (one line) otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"bad device {device!r}: give cpu, cuda or cuda:N ({str(exc).splitlines()[0]})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"cannot profile {device!r}: give cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def device_identity(device: torch.device) -> tuple[str, dict[str, Any]]:
    """The profile's device name (``cpu``, ``h200``, …) and identity of ``device``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        short = next((v for k, v in GPU_NAMES.items() if k in name.upper()), name.lower().replace(" ", "-"))
        major, minor = torch.cuda.get_device_capability(device)
        return short, {"gpu": name, "capability": f"{major}.{minor}", "torch": torch.__version__,
                       "cuda": torch.version.cuda}
    return "cpu", {**devices.host_identity(), "threads": torch.get_num_threads()}


def median_call(seconds: Sequence[float]) -> int:
    """Index of the median of ``seconds`` (the lower middle one for an even count): a call that
    ran, so its loop counts describe the time it took."""
    order = sorted(range(len(seconds)), key=seconds.__getitem__)
    return order[(len(order) - 1) // 2]


DATA_DEPENDENT = ("gaussiank", "redsync", "dgc", "randomk", "topk", "sidco-e", "sidco-p", "sidco-gp")
"""Compressors whose work per call depends on the data (their loop counts go into each row)."""


def loops_of_call(name: str, density: float, grads: Sequence[torch.Tensor], call: int, out: torch.Tensor
                  ) -> dict[str, Any]:
    """The loop counts (:func:`compressors.work.loop_counts`) of call number ``call`` (0-based,
    warm-up included) of the sequence :func:`measure` times: the same calls, reseeded alike, run
    again untimed, the last one under the op recorder."""
    comp = compressors.create(name, density=density)
    ef = compressors.ErrorFeedback(comp)
    for i in range(call):
        comp.reseed(i)
        comp.decompress(ef.compress(grads[i % len(grads)]), out=out)
    comp.reseed(call)
    message, ops = declared.record_ops(lambda: ef.compress(grads[call % len(grads)]))
    return declared.loop_counts(name, ops, message.stages)


def measure(device: str, sizes: Sequence[int], names: Sequence[str], densities: Sequence[float], *,
            warmup: int = 5, repeats: int = 7, progress: Callable[[str], None] | None = None,
            on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Profile rows for every compressor × density × size on ``device`` (``cpu``, ``cuda``…).

    ``none`` runs once per size (density 1). ``on_row`` sees each row as soon as it is measured.
    """
    dev = torch_device(device)
    unknown = [n for n in names if n not in compressors.names()]
    if unknown:
        raise ValueError(f"unknown compressor {unknown[0]!r}; choose from {', '.join(compressors.names())}")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warm-up must be >= 0 and repeats >= 1, got {warmup} and {repeats}")
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    clock = time.perf_counter if dev.type == "cuda" else devices.host_clock()
    rows = []
    for numel in sizes:
        grads = [gradient_like(numel, seed, dev) for seed in range(3)]
        out = torch.empty_like(grads[0])
        plan = [(n, 1.0) for n in names if n == "none"] + [(n, d) for d in densities for n in names if n != "none"]
        for name, density in plan:
            if progress:
                progress(f"{name} δ={density:g} n={numel}")
            comp_s, decomp_s, messages = [], [], []
            comp = compressors.create(name, density=density)
            ef = compressors.ErrorFeedback(comp)
            for call in range(warmup + repeats):
                grad = grads[call % len(grads)]
                comp.reseed(call)
                sync()
                t0 = clock()
                sparse = ef.compress(grad)
                sync()
                t1 = clock()
                comp.decompress(sparse, out=out)
                sync()
                t2 = clock()
                if call >= warmup:
                    comp_s.append(t1 - t0)
                    decomp_s.append(t2 - t1)
                    messages.append((sparse.wire_bytes(), sparse.stages))
            typical = median_call(comp_s)
            loops = loops_of_call(name, density, grads, warmup + typical, out) if name in DATA_DEPENDENT else {}
            row = {
                "compressor": name, "density": density, "numel": numel,
                "compress_s": comp_s[typical], "decompress_s": decomp_s[median_call(decomp_s)],
                "compress_min_s": min(comp_s), "compress_max_s": max(comp_s), "decompress_min_s": min(decomp_s),
                "wire_bytes": messages[typical][0], "stages": messages[typical][1],
                "backend": backend_on("cpu" if dev.type == "cpu" else "gpu", name),
                **loops,
            }
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def profile(device: str, sizes: Sequence[int], names: Sequence[str], densities: Sequence[float], *,
            warmup: int = 5, repeats: int = 7, host: devices.Device | None = None,
            progress: Callable[[str], None] | None = None,
            on_partial: Callable[[DeviceProfile, BaseException], None] | None = None) -> DeviceProfile:
    """Measure a whole :class:`DeviceProfile` of ``device``; ``host`` (the measured ``cpu``
    device) is kept with a CPU profile so that ``sidco profile --check`` models it with the
    numbers of the same session. If measuring fails halfway, ``on_partial`` receives the
    profile of the rows measured so far (its source says so) before the error propagates."""
    dev = torch_device(device)
    name, identity = device_identity(dev)
    created = time.strftime("%Y-%m-%d", time.gmtime())
    rows: list[dict[str, Any]] = []
    try:
        measure(device, sizes, names, densities, warmup=warmup, repeats=repeats, progress=progress,
                on_row=rows.append)
    except BaseException as exc:
        if rows and on_partial is not None:
            on_partial(_profile(name, identity, created, dev, rows, warmup, repeats, host, partial=True), exc)
        raise
    return _profile(name, identity, created, dev, rows, warmup, repeats, host)


def _profile(name: str, identity: dict[str, Any], created: str, dev: torch.device, rows: list[dict[str, Any]],
             warmup: int, repeats: int, host: devices.Device | None, partial: bool = False) -> DeviceProfile:
    what = identity.get("gpu") or devices.host_key(identity)
    threads = f", {torch.get_num_threads()} CPU threads" if dev.type == "cpu" else ""
    timer = "" if dev.type == "cuda" or torch.get_num_threads() > 1 else " (process CPU time)"
    source = (f"sidco profile on {what}{threads}, torch {torch.__version__}, {created}: error feedback on, "
              f"{warmup} warm-up calls, median of {repeats}{timer}" + (" (partial: the run stopped early)" if partial else ""))
    clock = "wall clock" if dev.type == "cuda" or torch.get_num_threads() > 1 else "process CPU time (1 thread)"
    method = {"warmup": warmup, "repeats": repeats, "statistic": "median", "error_feedback": True, "clock": clock,
              "gradients": "3 seeded gradient-like vectors (70 % Laplace, 30 % Student-t(3)) in rotation"}
    return DeviceProfile(name, source, tuple(rows), created, identity, method,
                         host.to_json() if host is not None else None)
