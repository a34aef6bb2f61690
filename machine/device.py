"""Torch devices given by name on the command line, checked against this machine."""

from __future__ import annotations

import os

import torch


def resolve(name: str | torch.device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a :class:`torch.device` that exists here.

    Raises ``ValueError`` with one line naming the device and what this machine has
    (no CUDA, or the valid indices), for unknown names (``xyz``), other backends
    (``mps``, ``meta``) and missing GPUs (``cuda:99``).
    """
    text = str(name).strip()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {text!r}: use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        if device.index not in (None, 0):
            raise ValueError(f"device {text!r}: there is one cpu device; use cpu")
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"unsupported device {text!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"device {text!r} requested but CUDA is not available on this machine; use cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"device {text!r} does not exist: this machine has cuda:0 … cuda:{count - 1}")
    return device


def available_memory(device: str | torch.device) -> int:
    """Bytes free for new tensors on ``device``: the GPU's free memory, or the host's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
