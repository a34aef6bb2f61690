"""Which machine ran a measurement: the device identity string recorded with every benchmark and
replay (``"cpu: AMD EPYC 7B13 (avx2, avx512f)"``, ``"cuda: NVIDIA H200"``)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

SIMD_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512bw", "avx512vl", "fma", "neon", "asimd", "sve")
"""CPU feature flags worth naming: the ones the native kernels' speed depends on."""


@functools.lru_cache(maxsize=None)
def cpu_identity() -> str:
    """``"cpu: <model name> (<SIMD flags>)"`` from ``/proc/cpuinfo`` (``platform`` elsewhere)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "Hardware") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    named = [flag for flag in SIMD_FLAGS if flag in flags]
    return f"cpu: {model} ({', '.join(named) if named else 'no SIMD flags listed'})"


def device_identity(device: str | torch.device) -> str:
    """The identity of ``device``: the CPU model and SIMD flags, or the GPU's name."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    if dev.type == "cpu":
        return cpu_identity()
    return f"{dev.type}: {dev}"
