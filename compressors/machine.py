"""Which machine ran a measurement: the device identity string recorded with every benchmark and
replay (``"cpu: AMD EPYC 7B13 (avx2, avx512f)"``, ``"cuda: NVIDIA H200"``). Reading the CPU's
identity imports no torch (a projection onto this CPU reads it)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SIMD_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512bw", "avx512vl", "fma", "neon", "asimd", "sve")
"""CPU feature flags worth naming: the ones the native kernels' speed depends on."""


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> tuple[tuple[str, str], ...]:
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and key not in fields:
            fields[key] = " ".join(value.split())
    return tuple(fields.items())


def cpuinfo() -> dict[str, str]:
    """The first value of each field of ``/proc/cpuinfo`` (the first CPU's; white space folded),
    read once; empty where there is no such file. The one reader of it: the CPU identity of
    measurements, the native build's cache key and the device model's host all use it."""
    return dict(_cpuinfo())


@functools.lru_cache(maxsize=None)
def cpu_identity() -> str:
    """``"cpu: <model name> (<SIMD flags>)"`` from ``/proc/cpuinfo`` (``platform`` elsewhere)."""
    info = cpuinfo()
    model = next((info[k] for k in ("model name", "Model", "Hardware") if info.get(k)), "")
    flags = set(next((info[k] for k in ("flags", "Features") if k in info), "").split())
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    named = [flag for flag in SIMD_FLAGS if flag in flags]
    return f"cpu: {model} ({', '.join(named) if named else 'no SIMD flags listed'})"


def device_identity(device: str | torch.device) -> str:
    """The identity of ``device``: the CPU model and SIMD flags, or the GPU's name."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    if dev.type == "cpu":
        return cpu_identity()
    return f"{dev.type}: {dev}"
