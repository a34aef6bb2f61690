"""``int4``: block-wise 4-bit quantization with per-block absmax scales, two codes a byte.

The gradient is cut into blocks of :data:`compressors.work.int4.BLOCK` consecutive elements (the last
one partial). Each block sends one float32 scale ``s ≥ max|g|/7`` of the block (its absmax over 7,
rounded up to the next float32 by one step, so that no code exceeds 7) and each element
``code = round(g / s)`` in [−7, 7] (ties to even; −8 unused, so the range is symmetric). The codes
travel as 4-bit nibbles ``code + 8`` in [1, 15], two a byte: byte ``i`` carries element ``i`` in its
lower nibble and element ``i + ⌈n/2⌉`` in its upper one (for an odd ``n`` the last byte's upper
nibble is a zero code); ``decompress`` unpacks them and returns ``code · s``. Wire bytes: half a byte per element (rounded up) and four per block
(:func:`compressors.messages.wire.quantized_bytes` with 4 bits).

Error: as ``int8``'s, the division and the rounding in float64 make each code the nearest integer to
``g / s`` of a float16, bfloat16 or float32 ``g`` (:mod:`compressors.blockwise`), so
``|g − code·s| ≤ s/2`` exactly, and ``decompress`` rounds ``code·s`` once to the gradient's dtype
(half an ulp of it more). Packing and unpacking are exact (the codes are small integers). A block of
zeros has the smallest float32 subnormal as its scale and sends zeros. NaN and ±Inf are refused
(``ValueError``, as every compressor), and so is a float64 gradient beyond 7 · 3.4e38. Error feedback
(``compressors.ErrorFeedback``) keeps the rounding error as the residual.

Exchange: as ``int8``'s, codes and scales all-gathered, each worker dequantizing and averaging them.
"""

from __future__ import annotations

import torch

from compressors.blockwise import BlockQuantizer
from compressors.messages.kinds import Quantized
from compressors.work import int4 as int4_work


class Int4(BlockQuantizer):
    """Block-wise 4-bit quantization (module docstring). ``density`` is accepted and ignored (1)."""

    name = "int4"
    block = int4_work.BLOCK
    levels = int4_work.LEVELS
    bits = int4_work.BITS
    code_dtype = torch.uint8

    def _encode(self, work: torch.Tensor, n: int) -> torch.Tensor:
        """The nearest integer to each ``g / s`` (in place, ties to even), packed two a byte: byte
        ``i`` is ``(code[i] + 8) + 16 · (code[i + h] + 8)`` with ``h = ⌈n/2⌉``, formed exactly in
        float64 (contiguous halves: strided pairs take CPU kernels ten times as long)."""
        half = -(-n // 2)  # the block is even: for an odd n, code[2h − 1] is the padding's zero
        work.round_()
        return torch.add(work[:half], work[half:2 * half], alpha=16).add_(int4_work.OFFSET * 17).to(torch.uint8)

    def _codes(self, message: Quantized) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes unpacked into a fresh int8 vector (each byte's lower nibble into the first
        half, its upper one into the second, less the offset), and the scales."""
        packed = message.codes
        half = packed.numel()
        codes = torch.empty(2 * half, dtype=torch.uint8, device=packed.device)
        torch.bitwise_and(packed, 0xF, out=codes[:half])
        torch.bitwise_right_shift(packed, 4, out=codes[half:])
        return codes.view(torch.int8).sub_(int4_work.OFFSET)[:message.numel], message.scales

    work = staticmethod(int4_work.int4)
