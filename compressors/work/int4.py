"""The declared work and card of ``int4``, block-wise 4-bit quantization (:mod:`compressors.int4`),
torch-free for the cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds
it to the code."""

from __future__ import annotations

from compressors.messages.wire import quantized_bytes
from compressors.work import blockwise
from compressors.work.cards import Card
from compressors.work.declare import Declared, Work

BLOCK = 64
"""Elements per block, each with its own float32 scale (the last block partial): 1/16 byte of scale
per element beside half a byte of code. With 7 levels a block's outlier coarsens the whole block:
on gradient-like data (:func:`measuring.samples.gradient_like`, 2²⁰ elements) the relative error
‖g − dequantized‖/‖g‖ is 0.16 at 64 against 0.23 at 256 (0.13 at 32), for 0.5625 bytes an element
against 0.516 (0.625). 64 is also bitsandbytes' 4-bit block."""

LEVELS = 7
"""Largest code magnitude: codes lie in [−7, 7] (−8 unused, so the range is symmetric)."""

BITS = 4
"""Bits per code on the wire: two codes a byte."""

OFFSET = 8
"""What a code carries as its nibble: ``code + 8`` in [1, 15]."""


def int4(n: int, density: float, itemsize: int, stages: int, rounds: int | None,
         backend: str) -> tuple[Work, Work]:
    """int4: the scales and ``g / s`` in a padded float64 buffer
    (:func:`compressors.work.blockwise.scaled`), rounded in place; the two halves packed (one add
    of the first half and sixteen times the second into a fresh float64 vector of half the length,
    the offset added in place, narrowed into a fresh uint8 vector). Decompress: the bytes' lower
    and upper nibbles into the two halves of a fresh byte vector, the offset taken off in place,
    then :func:`compressors.work.blockwise.dequantize` of the codes."""
    padded = blockwise.blocks(n, BLOCK) * BLOCK
    half = (n + 1) // 2
    c = blockwise.scaled(n, itemsize, BLOCK).stream(padded, 8, 8, "rewrite", full=True)
    c.stream(half, 16, 8).allocate(8 * half).stream(half, 8, 8, "rewrite").stream(half, 8, 1).allocate(half)
    d = Work().allocate(2 * half).stream(half, 1, 1).stream(half, 1, 1).stream(2 * half, 1, 1, "rewrite", full=True)
    return c, blockwise.dequantize(n, itemsize, BLOCK, d)


def wire(n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends: half a code byte per element (rounded up) and a float32 scale per
    block (:func:`compressors.messages.wire.quantized_bytes`)."""
    return float(quantized_bytes(n, BLOCK, BITS))


CARD = Card("int4", "compressors.int4:Int4", "quantized", Declared(int4, wire, residual="decompressed"),
            takes_density=False)
"""``int4``: codes and scales all-gathered (they differ from worker to worker), error feedback on."""
