"""Memory per GPU of data-parallel training under DDP: the model states and each compressor's state.

Every GPU holds a full replica under DDP (PyTorch ``DistributedDataParallel``, mixed precision by
``torch.autocast``, Adam), in bytes, for Ψ parameters:

- parameters, fp32: 4Ψ (autocast keeps the weights in fp32 and casts per operation);
- gradients, fp32: 4Ψ (``param.grad``);
- DDP's bucket buffers: 4Ψ (with ``gradient_as_bucket_view=False``, PyTorch's default, DDP copies
  the gradients into flat buckets: "the saved memory size will be equal to the total gradients
  size" when the views are on, PyTorch's ``DistributedDataParallel`` documentation);
- Adam's two moments (``exp_avg``, ``exp_avg_sq``), fp32: 8Ψ.

That is the 16Ψ of mixed-precision Adam in ZeRO's accounting (Rajbhandari et al. 2020, §3.1:
fp16 parameters and gradients 2Ψ + 2Ψ, fp32 parameters, momentum and variance 12Ψ; autocast keeps
4Ψ + 4Ψ + 8Ψ), plus DDP's buckets. The compressor adds its state (:func:`compressor_bytes`, the
DDP hooks of :mod:`compressors.ddp.hooks` with their defaults): the error-feedback residual of
every compressor of the testbed's hook, fp32, 4Ψ; PowerSGD (PyTorch's ``PowerSGDState`` with
``use_error_feedback`` and ``warm_start``): the residual 4Ψ and the warm-started factors P (n × r)
and Q (m × r) of every tensor of two or more dimensions viewed as n × m that it compresses
(:func:`powersgd_factor_bytes`), fp32; the casts and
``none`` nothing. Activations are not counted: a row that does not fit does not, one that fits
may still not once activations are added.

The device's memory is its data sheet's capacity (:data:`CAPACITY_BYTES`, decimal gigabytes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from compressors import message_kind
from compressors.rules import trains_with_error_feedback
from units import check_count

GIB = 1 << 30
"""Bytes per GiB (what ``memory_gib`` counts in)."""

STATE_BYTES_PER_PARAMETER: dict[str, int] = {"parameters": 4, "gradients": 4, "ddp_buckets": 4, "adam": 8}
"""Bytes per parameter of each model state under DDP (the module docstring has the sources)."""

RESIDUAL_BYTES_PER_PARAMETER = 4
"""The fp32 error-feedback residual, bytes per parameter."""

CAPACITY_BYTES: dict[str, int] = {
    "v100": 32 * 10**9,   # NVIDIA Tesla V100 data sheet: 32 GB HBM2 (SXM2)
    "a100": 80 * 10**9,   # NVIDIA A100 Tensor Core GPU data sheet: 80 GB HBM2e
    "h100": 80 * 10**9,   # NVIDIA H100 Tensor Core GPU data sheet (SXM): 80 GB HBM3
    "h200": 141 * 10**9,  # NVIDIA H200 Tensor Core GPU data sheet: 141 GB HBM3e
}
"""Device memory (bytes) of each modelled GPU, from its data sheet."""


def model_state_bytes(numel: int) -> dict[str, int]:
    """Bytes per GPU of each model state of :data:`STATE_BYTES_PER_PARAMETER` for ``numel`` parameters."""
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be a whole number >= 0, got {numel!r}")
    return {part: per * numel for part, per in STATE_BYTES_PER_PARAMETER.items()}


POWERSGD_MIN_COMPRESSION_RATE = 2.0
"""PyTorch's ``PowerSGDState`` default: a matrix is compressed only when that makes it this much smaller."""


def powersgd_factor_bytes(shapes: Sequence[Sequence[int] | None], rank: int,
                          min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE) -> int:
    """Bytes of PowerSGD's warm-started P and Q (fp32) at ``rank`` for tensors of ``shapes``, by PyTorch's
    ``powerSGD_hook``: a tensor of two or more dimensions viewed as n × m, at rank r' = min(n, m, ``rank``),
    keeps (n + m) × r' when (n + m) × r' × ``min_compression_rate`` < n × m; others (and 1-D tensors) none."""
    check_count(rank, "PowerSGD's rank")
    total = 0
    for shape in shapes:
        if shape is not None and len(shape) >= 2:
            n = int(shape[0])
            m = math.prod(shape) // n
            r = min(n, m, rank)
            if (n + m) * r * min_compression_rate < n * m:
                total += (n + m) * r
    return 4 * total


def compressor_bytes(compressor: str, numel: int, shapes: Sequence[Sequence[int] | None], rank: int = 1) -> int:
    """Bytes per GPU of ``compressor``'s state in the DDP hook for ``numel`` parameters of ``shapes``
    (the module docstring): none for ``none`` and the casts, the residual for the rest, PowerSGD's
    factors besides."""
    if not trains_with_error_feedback(compressor):  # its card: no residual (none, the casts)
        return 0
    residual = RESIDUAL_BYTES_PER_PARAMETER * numel
    return residual + (powersgd_factor_bytes(shapes, rank) if message_kind(compressor) == "lowrank" else 0)


def capacity(device: str) -> int | None:
    """Memory (bytes) of GPU ``device`` (a name, ``h100@era`` as ``h100``), ``None`` for another device."""
    return CAPACITY_BYTES.get(device.split("@", 1)[0])


def per_gpu(compressor: str, numel: int, shapes: Sequence[Sequence[int] | None], device: str,
            rank: int = 1) -> dict[str, float | bool | None]:
    """Memory per GPU under DDP: ``memory_gib`` (model states and ``compressor``'s state, GiB),
    ``memory_capacity_gib`` (the ``device``'s, ``None`` when not a modelled GPU) and ``fits``
    (``memory_gib`` within it; ``None`` when unknown); activations are not counted."""
    total = sum(model_state_bytes(numel).values()) + compressor_bytes(compressor, numel, shapes, rank)
    room = capacity(device)
    return {"memory_gib": total / GIB, "memory_capacity_gib": None if room is None else room / GIB,
            "fits": None if room is None else total <= room}
