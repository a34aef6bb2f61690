"""What the block-wise quantizers (``int8``, ``fp8``, ``int4``) share: the block scales and the
dequantization.

A quantizer cuts the gradient into blocks of ``block`` consecutive elements (the last one partial).
Each block sends one float32 scale ``s ≥ max|g|/levels`` of the block (its absmax over the largest
code magnitude ``levels``, rounded up to the next float32 by one step, so that no code exceeds
``levels``) and each element a code near ``g / s``; ``decompress`` returns ``code · s``.

:meth:`BlockQuantizer._scaled` widens the gradient into a fresh float64 buffer padded to whole
blocks and divides it there by its blocks' scales. For a float16, bfloat16 or float32 ``g`` (at
most 24 significant bits) and a float32 ``s``, ``g`` and ``m · s`` for a midpoint ``m`` of a code
grid of few significant bits (the half-integers, the midpoints of the e4m3 numbers) are multiples
of one power of two and differ, where they differ, by at least that power: far more than float64's
rounding of the quotient. So the quotient in float64 lies on the same side of every midpoint as
the exact ``g / s``, and on one only where ``g / s`` is, and rounding it to the grid there (ties to
even) gives the grid point nearest ``g / s``. Each subclass rounds and narrows the quotients into
its codes (:meth:`BlockQuantizer._encode`) and widens them back (:meth:`BlockQuantizer._codes`);
:meth:`BlockQuantizer.decompress` multiplies them by their blocks' scales, rounded once to the
gradient's dtype (half an ulp of that dtype more). A float64 gradient's quotient is rounded once
in float64 before it is rounded to the grid.

A block of zeros has the smallest float32 subnormal as its scale and sends zeros. NaN and ±Inf are
refused (``ValueError``, as every compressor), and so is a float64 gradient beyond what float32
scales can carry (``|g| > levels · 3.4e38``).
"""

from __future__ import annotations

import math

import torch

from compressors._validate import raise_if_not_finite
from compressors.base import Compressor
from compressors.messages.kinds import Quantized

FLOAT32_MAX = torch.finfo(torch.float32).max


class BlockQuantizer(Compressor):
    """Block-wise quantization with per-block absmax scales (module docstring). Class attributes:
    ``block`` (elements per scale), ``levels`` (the largest code magnitude), ``bits`` (bits per code
    on the wire), ``code_dtype`` (the dtype of its message's ``codes``). ``density`` is accepted and
    ignored (1)."""

    message = "quantized"
    block = 256
    levels = 127
    bits = 8
    code_dtype = torch.int8

    def _scaled(self, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``g / s`` of every element in a fresh float64 buffer padded to whole blocks (the padding
        zero), each ``|g / s| ≤ levels``, and the float32 scales ``s`` (one a block)."""
        n = grad.numel()
        blocks = -(-n // self.block)
        work = torch.empty(blocks * self.block, dtype=torch.float64, device=grad.device)
        work[:n].copy_(grad)
        if blocks * self.block > n:
            work[n:].zero_()
        rows = work.view(blocks, self.block)
        # max(largest, −smallest) of each block: two plain reductions (torch's CPU kernel of
        # vector_norm(ord=inf, dim=1) takes 3 to 5 ns an element on blocks this short, amax 0.15)
        absmax = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_())
        raise_if_not_finite(grad, absmax.sum())
        if grad.dtype == torch.float64 and n and float(absmax.max()) > self.levels * FLOAT32_MAX:
            raise ValueError(f"gradient has values beyond what float32 scales can carry "
                             f"(largest |g| = {float(absmax.max()):.4g}); refusing to quantize")
        nearest = (absmax / self.levels).float()
        scales = torch.nextafter(nearest, nearest.new_full((), math.inf))  # one step up: no code beyond levels
        rows.div_(scales.double().unsqueeze(1))
        return work, scales

    def _compress(self, grad: torch.Tensor) -> Quantized:
        work, scales = self._scaled(grad)
        return Quantized(self._encode(work, grad.numel()), scales, self.block, grad.dtype, grad.numel(), self.bits)

    def _encode(self, work: torch.Tensor, n: int) -> torch.Tensor:
        """The codes of the first ``n`` quotients ``g / s`` in ``work`` (float64, padded to whole
        blocks with zeros; it may be overwritten)."""
        raise NotImplementedError

    def _codes(self, message: Quantized) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``numel`` codes of ``message`` in a dtype that ``copy_`` widens exactly into the
        gradient's, and the float32 scales that multiply them (its own codes and scales, where
        the codes are one a byte)."""
        return message.codes, message.scales

    def decompress(self, message: Quantized, out: torch.Tensor | None = None) -> torch.Tensor:
        """``code · scale`` of every element, rounded once to the gradient's dtype (into ``out``
        when given), from :meth:`_codes`. In float32 and float64 the product is formed in place in
        ``out`` (a float32 product of a code of at most 8 significant bits and a float32 scale
        rounds once; a float64 one is exact); for 16-bit gradients it is formed in float64 and
        rounded once into ``out``."""
        n, blocks, block = message.numel, message.scales.numel(), message.block
        if out is None:
            out = torch.empty(n, dtype=message.dtype, device=message.codes.device)
        elif out.shape != (n,) or out.dtype != message.dtype:
            raise ValueError(f"out buffer must be 1-D {message.dtype} of {n} elements, "
                             f"got {out.dtype} {tuple(out.shape)}")
        if not n:
            return out
        codes, scales = self._codes(message)
        if out.dtype in (torch.float32, torch.float64):
            out.copy_(codes)
            scales = scales if out.dtype == torch.float32 else scales.double()
            whole = n // block
            if whole:
                out[:whole * block].view(whole, block).mul_(scales[:whole].unsqueeze(1))
            if whole < blocks:
                out[whole * block:].mul_(scales[whole])
            return out
        values = torch.empty(blocks * block, dtype=torch.float64, device=message.codes.device)
        values[:n].copy_(codes)
        values.view(blocks, block).mul_(scales.double().unsqueeze(1))
        return out.copy_(values[:n])
