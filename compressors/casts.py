"""Dense 16-bit casts: ``fp16`` and ``bf16`` send the whole gradient in a narrower dtype.

The strongest simple baseline of gradient compression (PyTorch ships it as the DDP hooks
``fp16_compress_hook`` / ``bf16_compress_hook``): every element travels, as half the bytes of
fp32, and is all-reduced (no indices). ``decompress`` casts back to the gradient's dtype.

Round-trip error: fp16 keeps 11 significant bits, so ``|x − fp32(fp16(x))| ≤ 2⁻¹¹·|x|`` for
normal values (``|x| ≥ 2⁻¹⁴``) and ``≤ 2⁻²⁵`` absolutely below; bf16 keeps 8 bits:
``≤ 2⁻⁸·|x|`` over fp32's whole range. A finite gradient beyond fp16's range (``|x| > 65504``)
raises ``ValueError``: the cast would send Inf. Error feedback (``compressors.ErrorFeedback``) keeps
the rounding error as the residual; it is optional, like for every compressor.

On a GPU compress is one cast and decompress one cast back, as PyTorch's hooks do: no
finiteness check, since it needs a device→host synchronisation per bucket (``check_finite=True``
asks for it). Off the GPU the check is on by default: a synchronisation costs nothing there.
"""

from __future__ import annotations

import torch

from compressors.work import casts as casts_work
from compressors._validate import raise_if_not_finite
from compressors.base import Compressor
from compressors.messages.kinds import Dense


class DenseCast(Compressor):
    """Send every element cast to :attr:`wire_dtype`. ``density`` is accepted and ignored (1);
    ``check_finite``: refuse NaN, Inf and values beyond the narrower range (two syncs), default
    off on a GPU and on elsewhere."""

    message = "dense"
    wire_dtype = torch.float16

    def __init__(self, density: float = 1.0, check_finite: bool | None = None):
        super().__init__(density)
        if check_finite is not None and not isinstance(check_finite, bool):
            raise ValueError(f"check_finite must be True, False or None, got {check_finite!r}")
        self.check_finite = check_finite

    def _compress(self, grad: torch.Tensor) -> Dense:
        values = grad.to(self.wire_dtype)
        if not (self.check_finite if self.check_finite is not None else not grad.is_cuda):
            return Dense(values, grad.dtype)  # PyTorch's fp16/bf16 hook: the cast alone, no sync
        statistic = None
        if values.numel():  # max/2 − min/2 in fp32: finite iff every value is (NaN and ±Inf reach it);
            low, high = torch.aminmax(values)  # halved, so that values near fp32's largest cannot overflow it
            statistic = high.float() * 0.5 - low.float() * 0.5
        raise_if_not_finite(grad, statistic)
        if statistic is not None and not bool(torch.isfinite(statistic)):
            raise ValueError(f"gradient has finite values beyond the range of {self.wire_dtype} "
                             f"(largest |g| = {float(grad.abs().max()):.4g}); refusing to send Inf")
        return Dense(values, grad.dtype)

    work = staticmethod(casts_work.cast)

    def decompress(self, message: Dense, out: torch.Tensor | None = None) -> torch.Tensor:
        """The values cast back to the gradient's dtype (into ``out`` when given)."""
        if out is None:
            return message.values.to(message.dtype)
        if out.shape != (message.numel,) or out.dtype != message.dtype:
            raise ValueError(f"out buffer must be 1-D {message.dtype} of {message.numel} elements, "
                             f"got {out.dtype} {tuple(out.shape)}")
        return out.copy_(message.values)


class FP16(DenseCast):
    """``fp16``: the dense gradient in IEEE half precision (2 bytes per element)."""

    name = "fp16"
    wire_dtype = torch.float16


class BF16(DenseCast):
    """``bf16``: the dense gradient in bfloat16 (2 bytes per element, fp32's exponent range)."""

    name = "bf16"
    wire_dtype = torch.bfloat16
