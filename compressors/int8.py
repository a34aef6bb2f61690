"""``int8``: block-wise INT8 quantization with per-block absmax scales.

The gradient is cut into blocks of :data:`compressors.work.int8.BLOCK` consecutive elements (the
last one partial). Each block sends one float32 scale ``s ≥ max|g|/127`` of the block (its absmax
over 127, rounded up to the next float32 by one step, so that no code exceeds 127) and each element
``code = round(g / s)``, an int8 in [−127, 127]; ``decompress`` returns ``code · s``. Wire bytes:
one byte per element and four per block (:func:`compressors.messages.wire.quantized_bytes`).

Error: the division and the rounding are done in float64, where ``g / s`` of a float16, bfloat16
or float32 ``g`` and a float32 ``s`` lands on the right side of every half-integer
(:mod:`compressors.blockwise`), so each code is the nearest integer to ``g / s`` and
``|g − code·s| ≤ s/2`` exactly (``code·s`` is exact in float64). ``decompress`` rounds ``code·s``
once to the gradient's dtype (half an ulp of that dtype more). A block of zeros has the smallest
float32 subnormal as its scale and sends zeros. Error feedback (``compressors.ErrorFeedback``) keeps
the rounding error as the residual.

Exchange: codes and scales differ between workers, so they are not all-reduced: every worker's
message is all-gathered, and each worker dequantizes and averages them (the card's collective;
the simulator charges that all-gather of its wire bytes).
"""

from __future__ import annotations

import torch

from compressors.blockwise import BlockQuantizer
from compressors.work import int8 as int8_work


class Int8(BlockQuantizer):
    """Block-wise INT8 quantization (module docstring). ``density`` is accepted and ignored (1)."""

    name = "int8"
    block = int8_work.BLOCK
    levels = int8_work.LEVELS
    code_dtype = torch.int8

    def _encode(self, work: torch.Tensor, n: int) -> torch.Tensor:
        """The nearest integer to each ``g / s`` (in place, ties to even), narrowed to int8."""
        return work.round_()[:n].to(torch.int8)

    work = staticmethod(int8_work.int8)
