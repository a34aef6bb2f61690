"""``fp8``: block-wise FP8 (e4m3) quantization with per-block absmax scales.

The gradient is cut into blocks of :data:`compressors.work.fp8.BLOCK` consecutive elements (the last
one partial). Each block sends one float32 scale ``s ≥ max|g|/448`` of the block (its absmax over
448, e4m3's largest finite number, rounded up to the next float32 by one step, so that no code
exceeds 448) and each element the e4m3 number (``torch.float8_e4m3fn``: 4 exponent bits, 3 mantissa
bits, subnormals, no infinities) nearest ``g / s``, ties to even; ``decompress`` returns
``code · s``. Wire bytes: one byte per element and four per block
(:func:`compressors.messages.wire.quantized_bytes`).

Rounding: torch's cast of a float64 to float8 goes through float32 and rounds twice, which can
land on the wrong side of a midpoint (1.0625·(1 + 2⁻²⁸) casts to 1.0, not 1.125). So ``g / s`` is
formed in float64 (on the right side of every e4m3 midpoint, :mod:`compressors.blockwise`) and
rounded there to the e4m3 grid: its spacing at ``q = g / s`` is
``u(q) = 2^(max(⌊log₂|q|⌋, −6) − 3)`` (three mantissa bits; below 2⁻⁶, e4m3's subnormals, a fixed
2⁻⁹), read off the exponent bits of ``q``, and ``round(q / u) · u`` is exact in float64; the cast of
that e4m3 number to float8 is then exact.

Error: ``|g − code·s| ≤ s · u(g/s) / 2 = s · 2^(max(⌊log₂|g/s|⌋, −6) − 4)`` exactly, for float16,
bfloat16 and float32 gradients: at most ``2⁻⁴·|g|`` (half an ulp of three mantissa bits) where
``|g/s| ≥ 2⁻⁶``, and at most ``s · 2⁻¹⁰`` below. ``decompress`` rounds ``code·s`` once to the
gradient's dtype (exact in float64; half an ulp of the dtype more otherwise); off the GPU it widens
the codes through their bits (:meth:`Fp8._codes`: torch's CPU cast from float8 is scalar). A zero block has the
smallest float32 subnormal as its scale and sends zeros; −0 comes back as −0. NaN and ±Inf are
refused (``ValueError``, as every compressor), and so is a float64 gradient beyond 448 · 3.4e38.
Error feedback (``compressors.ErrorFeedback``) keeps the rounding error as the residual.

Exchange: as ``int8``'s, codes and scales all-gathered, each worker dequantizing and averaging them.
"""

from __future__ import annotations

import torch

from compressors.blockwise import BlockQuantizer
from compressors.messages.kinds import Quantized
from compressors.work import fp8 as fp8_work

EXPONENT_BITS = 0x7FF0000000000000
"""The exponent field of a float64: ``bits(q) & EXPONENT_BITS`` read as a float64 is ``2^⌊log₂|q|⌋``
(0 for 0 and float64 subnormals)."""


class Fp8(BlockQuantizer):
    """Block-wise e4m3 quantization (module docstring). ``density`` is accepted and ignored (1)."""

    name = "fp8"
    block = fp8_work.BLOCK
    levels = fp8_work.LEVELS
    code_dtype = torch.float8_e4m3fn

    def _encode(self, work: torch.Tensor, n: int) -> torch.Tensor:
        """The e4m3 number nearest each ``g / s`` (ties to even), rounded in place in float64, then
        narrowed exactly into float8_e4m3fn."""
        spacing = (work.view(torch.int64) & EXPONENT_BITS).view(torch.float64)  # 2^⌊log₂|q|⌋
        spacing.clamp_(min=fp8_work.SMALLEST_NORMAL).mul_(2.0 ** -fp8_work.MANTISSA_BITS)
        return work.div_(spacing).round_().mul_(spacing)[:n].to(torch.float8_e4m3fn)

    def _codes(self, message: Quantized) -> tuple[torch.Tensor, torch.Tensor]:
        """On a GPU the e4m3 codes and the scales as they are (its cast widens e4m3 natively). Off
        it, torch's CPU kernels widen float8 one element at a time (3.3 ns an element here, 24
        times int8's), so the codes are widened through their bits: an e4m3 byte ``s eeee mmm``
        moved into bits 15 and 7–13 of a float16 is that float16's pattern of ``code · 2⁻⁸``
        exactly (float16's exponent bias is 8 more than e4m3's, and its subnormals hold e4m3's),
        and the scales are multiplied by 2⁸ (exact in float32: no scale exceeds 3.4e38/448)."""
        if message.codes.is_cuda:
            return message.codes, message.scales
        bits = message.codes.view(torch.uint8).to(torch.int16)
        bits.add_(bits & 0x80).bitwise_left_shift_(7)  # the sign from bit 7 to bit 15, the rest up by 7
        return bits.view(torch.float16), message.scales * 2.0 ** fp8_work.FLOAT16_SHIFT

    work = staticmethod(fp8_work.fp8)
