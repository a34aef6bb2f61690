"""Which machine this is, and where the testbed keeps what it built or measured on it.

The one home of the machine's identity: :func:`host_identity` (CPU model, the SIMD flags that
decide measured numbers, cores, torch version), the key two hosts share when their measured
numbers may stand for each other (:func:`host_key`), what a ``-march=native`` build depends on
(:func:`march_key`), and the identity string recorded with every benchmark and replay
(:func:`device_identity`: ``"cpu: AMD EPYC 7B13 (avx2, avx512f)"``, ``"cuda: NVIDIA H200"``). Reading the CPU's identity imports no torch (a projection onto this CPU
reads it). :func:`cache_dir` is the one reader of ``SIDCO_CACHE_DIR``.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def march_key() -> str:
    """What a ``-march=native`` build depends on (the native kernels' cache key): this CPU's model
    name and all its feature flags (:func:`cpuinfo`; elsewhere the platform's processor and machine
    strings)."""
    info = cpuinfo()
    fields = {key: info[key] for key in ("model name", "flags", "Features", "CPU part") if key in info}
    if not fields:
        return f"{platform.processor()} {platform.machine()}"
    return "; ".join(f"{key}: {value}" for key, value in sorted(fields.items()))


CACHE_ENV = "SIDCO_CACHE_DIR"
"""The variable naming the testbed's cache directory."""


def cache_dir() -> Path:
    """Where the testbed keeps what it built or measured on this machine (the native kernels,
    this host's measured device numbers): ``$SIDCO_CACHE_DIR``, default ``~/.cache/sidco-testbed``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sidco-testbed")


def _model(info: Mapping[str, str]) -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform`` elsewhere)."""
    model = next((info[k] for k in ("model name", "Model", "Hardware") if info.get(k)), "")
    return model or platform.processor() or platform.machine() or "unknown CPU"


def _flags(info: Mapping[str, str]) -> set[str]:
    return set(next((info[k] for k in ("flags", "Features") if k in info), "").split())


KEY_FLAGS: tuple[str, ...] = ("avx512f", "avx512_bf16", "avx2", "fma", "neon", "asimd")
"""The SIMD flags that decide whether two hosts' measured numbers stand for each other (part of
:func:`host_key`; profiles record them)."""


def host_identity() -> dict[str, Any]:
    """This host: CPU model, the flags of :data:`KEY_FLAGS` it has, core count, torch version (read
    from the installed package's metadata: a projection never imports torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    info = cpuinfo()
    flags = _flags(info)
    return {"cpu": _model(info), "flags": [f for f in KEY_FLAGS if f in flags], "cores": os.cpu_count() or 1,
            "torch": torch_version}


def host_key(identity: Mapping[str, Any]) -> str:
    """What makes two hosts the same for measured numbers: CPU model and SIMD flags."""
    return f"{identity.get('cpu', '?')} ({','.join(identity.get('flags', [])) or 'no SIMD flags'})"


@functools.lru_cache(maxsize=None)
def cpu_identity() -> str:
    """``"cpu: <model name> (<SIMD flags>)"``: this CPU as every measurement records it."""
    info = cpuinfo()
    named = [flag for flag in SIMD_FLAGS if flag in _flags(info)]
    return f"cpu: {_model(info)} ({', '.join(named) if named else 'no SIMD flags listed'})"


def device_identity(device: str | torch.device) -> str:
    """The identity of ``device``: the CPU model and SIMD flags, or the GPU's name."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    if dev.type == "cpu":
        return cpu_identity()
    return f"{dev.type}: {dev}"
