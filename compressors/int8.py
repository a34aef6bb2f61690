"""``int8``: block-wise INT8 quantization with per-block absmax scales.

The gradient is cut into blocks of :data:`compressors.work.int8.BLOCK` consecutive elements (the
last one partial). Each block sends one float32 scale ``s ≥ max|g|/127`` of the block (its absmax
over 127, rounded up to the next float32 by one step, so that no code exceeds 127) and each element
``code = round(g / s)``, an int8 in [−127, 127]; ``decompress`` returns ``code · s``. Wire bytes:
one byte per element and four per block (:func:`compressors.messages.wire.quantized_bytes`).

Error: the division and the rounding are done in float64, where ``g / s`` of a float16, bfloat16
or float32 ``g`` and a float32 ``s`` lands on the right side of every half-integer, so each code is
the nearest integer to ``g / s`` and ``|g − code·s| ≤ s/2`` exactly (``code·s`` is exact in
float64). ``decompress`` rounds ``code·s`` once to the gradient's dtype (half an ulp of that dtype
more). A block of zeros has the smallest float32 subnormal as its scale and sends zeros. Error
feedback (``compressors.ErrorFeedback``) keeps the rounding error as the residual.

Exchange: codes and scales differ between workers, so they are not all-reduced: every worker's
message is all-gathered, and each worker dequantizes and averages them (the card's collective;
the simulator charges that all-gather of its wire bytes).
"""

from __future__ import annotations

import math

import torch

from compressors._validate import raise_if_not_finite
from compressors.base import Compressor
from compressors.messages.kinds import Quantized
from compressors.work import int8 as int8_work

FLOAT32_MAX = torch.finfo(torch.float32).max


class Int8(Compressor):
    """Block-wise INT8 quantization (module docstring). ``density`` is accepted and ignored (1)."""

    name = "int8"
    message = "quantized"
    block = int8_work.BLOCK

    def _compress(self, grad: torch.Tensor) -> Quantized:
        n = grad.numel()
        blocks = -(-n // self.block)
        work = torch.empty(blocks * self.block, dtype=torch.float64, device=grad.device)
        work[:n].copy_(grad)
        if blocks * self.block > n:
            work[n:].zero_()
        rows = work.view(blocks, self.block)
        absmax = torch.linalg.vector_norm(rows, ord=math.inf, dim=1)
        raise_if_not_finite(grad, absmax.sum())
        if grad.dtype == torch.float64 and float(absmax.max()) > int8_work.LEVELS * FLOAT32_MAX:
            raise ValueError(f"gradient has values beyond what float32 scales can carry "
                             f"(largest |g| = {float(absmax.max()):.4g}); refusing to quantize")
        nearest = (absmax / int8_work.LEVELS).float()
        scales = torch.nextafter(nearest, nearest.new_full((), math.inf))  # one step up: no code beyond LEVELS
        rows.div_(scales.double().unsqueeze(1)).round_()
        return Quantized(work[:n].to(torch.int8), scales, self.block, grad.dtype)

    work = staticmethod(int8_work.int8)

    def decompress(self, message: Quantized, out: torch.Tensor | None = None) -> torch.Tensor:
        """``code · scale`` of every element, rounded once to the gradient's dtype (into ``out``
        when given). In float32 and float64 the product is formed in place in ``out`` (a float32
        product of an 8-bit code and a float32 scale rounds once; a float64 one is exact); for
        16-bit gradients it is formed in float64 and rounded once into ``out``."""
        n, blocks, block = message.numel, message.scales.numel(), message.block
        if out is None:
            out = torch.empty(n, dtype=message.dtype, device=message.codes.device)
        elif out.shape != (n,) or out.dtype != message.dtype:
            raise ValueError(f"out buffer must be 1-D {message.dtype} of {n} elements, "
                             f"got {out.dtype} {tuple(out.shape)}")
        if not n:
            return out
        if out.dtype in (torch.float32, torch.float64):
            out.copy_(message.codes)
            scales = message.scales if out.dtype == torch.float32 else message.scales.double()
            whole = n // block
            if whole:
                out[:whole * block].view(whole, block).mul_(scales[:whole].unsqueeze(1))
            if whole < blocks:
                out[whole * block:].mul_(scales[whole])
            return out
        values = torch.empty(blocks * message.block, dtype=torch.float64, device=message.codes.device)
        values[:n].copy_(message.codes)
        values.view(blocks, message.block).mul_(message.scales.double().unsqueeze(1))
        return out.copy_(values[:n])
