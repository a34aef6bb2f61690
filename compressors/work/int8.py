"""The declared work and card of ``int8``, block-wise INT8 quantization (:mod:`compressors.int8`),
torch-free for the cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds
it to the code."""

from __future__ import annotations

from compressors.messages.wire import quantized_bytes
from compressors.work import blockwise
from compressors.work.cards import Card
from compressors.work.declare import Declared, Work

BLOCK = 256
"""Elements per block, each with its own float32 scale (the last block partial): 1/64 byte of
scale per element on the wire; 256 keeps an outlier's reach (the elements whose precision it
coarsens) to its own block."""

LEVELS = 127
"""Largest code magnitude: codes lie in [−127, 127] (−128 unused, so the range is symmetric)."""


def blocks(n: int) -> int:
    """Blocks of an ``n``-element gradient (:data:`BLOCK` each, the last partial)."""
    return blockwise.blocks(n, BLOCK)


def int8(n: int, density: float, itemsize: int, stages: int, rounds: int | None,
         backend: str) -> tuple[Work, Work]:
    """int8: the scales and ``g / s`` in a padded float64 buffer
    (:func:`compressors.work.blockwise.scaled`), rounded in place and narrowed into a fresh int8
    vector; decompress: :func:`compressors.work.blockwise.dequantize` of the codes."""
    padded = blocks(n) * BLOCK
    c = blockwise.scaled(n, itemsize, BLOCK).stream(padded, 8, 8, "rewrite", full=True)
    c.stream(n, 8, 1, full=True).allocate(n)
    return c, blockwise.dequantize(n, itemsize, BLOCK)


def wire(n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends: a code byte per element and a float32 scale per block
    (:func:`compressors.messages.wire.quantized_bytes`)."""
    return float(quantized_bytes(n, BLOCK))


CARD = Card("int8", "compressors.int8:Int8", "quantized", Declared(int8, wire, residual="decompressed"),
            takes_density=False)
"""``int8``: codes and scales all-gathered (they differ from worker to worker), error feedback on."""
