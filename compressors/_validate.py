"""Input checks shared by every compressor: density, gradient shape/dtype, finiteness."""

from __future__ import annotations

import math

import torch

from compressors.rules import target_count  # noqa: F401  (re-exported: the compressors count with it)
import units

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_density(density: object) -> float:
    """Return ``density`` as a float in (0, 1]; raise ``ValueError`` naming the problem otherwise."""
    return units.check_density(density)


def check_gradient(grad: object) -> torch.Tensor:
    """Return ``grad`` (detached from autograd) if it is a 1-D floating tensor; raise ``ValueError``
    otherwise.

    A tensor with ``requires_grad=True`` is returned as ``grad.detach()`` (same storage, no copy):
    compressing is never part of the autograd graph, and in-place kernels refuse tracked tensors.
    """
    if not isinstance(grad, torch.Tensor):
        raise ValueError(f"gradient must be a torch.Tensor, got {type(grad).__name__}")
    if grad.dim() != 1:
        raise ValueError(f"gradient must be 1-D (flatten it first), got shape {tuple(grad.shape)}")
    if grad.dtype not in FLOATING:
        raise ValueError(f"gradient must be floating point (fp16/bf16/fp32/fp64), got {grad.dtype}")
    return grad.detach() if grad.requires_grad else grad


def raise_if_not_finite(grad: torch.Tensor, statistic: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` if ``grad`` holds NaN or Inf.

    ``statistic`` is a reduction of ``grad`` already computed (a sum, a mean of ``|grad|``) that
    is finite whenever ``grad`` is, barring overflow; when it is given and finite, the full scan
    is skipped. Callers check it after their one unavoidable device->host sync, so on CUDA the
    value is already there and reading it does not stall the stream.
    """
    if statistic is not None and bool(torch.isfinite(statistic).all()):
        return
    bad = ~torch.isfinite(grad)
    if bool(bad.any()):
        nans = int(torch.isnan(grad).sum())
        infs = int(bad.sum()) - nans
        raise ValueError(f"gradient contains {nans} NaN and {infs} Inf values (first at index "
                         f"{int(bad.nonzero()[0, 0])}); refusing to compress")


def power_of_two_above(x: torch.Tensor) -> float:
    """The smallest power of two ≥ ``max|x|`` that ``x``'s dtype can hold (1 for an all-zero ``x``):
    dividing by it maps ``x`` into [−2, 2] exactly (only exponents change), so statistics of huge
    finite gradients (sums of squares near fp32's 3.4e38) can be computed without overflow and
    scaled back."""
    top = float(torch.amax(torch.abs(x))) if x.numel() else 0.0
    if not top > 0:
        return 1.0
    return math.ldexp(1.0, min(math.frexp(top)[1], math.frexp(torch.finfo(x.dtype).max)[1] - 1))
