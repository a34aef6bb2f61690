"""The declared work and card of ``int8``, block-wise INT8 quantization (:mod:`compressors.int8`),
torch-free for the cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds
it to the code."""

from __future__ import annotations

from compressors.messages.wire import quantized_bytes
from compressors.work.cards import Card
from compressors.work.declare import FINITE_OPS, Declared, Work

BLOCK = 256
"""Elements per block, each with its own float32 scale (the last block partial): 1/64 byte of
scale per element on the wire; 256 keeps an outlier's reach (the elements whose precision it
coarsens) to its own block."""

LEVELS = 127
"""Largest code magnitude: codes lie in [−127, 127] (−128 unused, so the range is symmetric)."""

SCALE_OPS = 4
"""Launches over the scales (one per block): ``absmax / 127``, its cast to float32, the ``+∞`` it
steps towards and the step (``nextafter``)."""


def blocks(n: int) -> int:
    """Blocks of an ``n``-element gradient (:data:`BLOCK` each, the last partial)."""
    return -(-n // BLOCK)


def int8(n: int, density: float, itemsize: int, stages: int, rounds: int | None,
         backend: str) -> tuple[Work, Work]:
    """int8: the gradient widened into a fresh float64 buffer padded to whole blocks (the padding
    zeroed), each block's ``max|g|`` (one reduction; summed over the blocks and read back for the
    finiteness check: one sync, and for float64 gradients a second read of the largest against
    float32's range), the scales, then in place ``g / s`` and its rounding, and the codes narrowed
    into a fresh int8 vector. Decompress of a float32 or float64 gradient: the codes widened into
    the kept output buffer and multiplied there by their blocks' scales (the whole blocks at once,
    then the partial last one; float64 widens the scales first); of a 16-bit gradient: the codes
    widened into a fresh float64 buffer, multiplied by their blocks' scales in place, and copied
    (rounded once) into the kept output buffer."""
    b = blocks(n)
    padded = b * BLOCK
    c = Work().allocate(8 * padded).stream(n, itemsize, 8, full=True)
    if padded > n:
        c.stream(padded - n, 0, 8)
    c.stream(padded, 8, 8 * b / padded, "reduce", full=True)
    c.stream(b, 8, 0, "reduce").scalars(FINITE_OPS).sync()
    if itemsize == 8:
        c.stream(b, 8, 0, "reduce").sync()
    c.stream(b, 8, 8).stream(b, 8, 4).scalars(1).stream(b, 4, 4)
    c.stream(b, 4, 8).stream(padded, 16 * b / padded + 8, 8, full=True).stream(padded, 8, 8, full=True)
    c.stream(n, 8, 1, full=True).allocate(n)
    return c, _dequantize(n, itemsize)


def _dequantize(n: int, itemsize: int) -> Work:
    """Decompress (:meth:`compressors.int8.Int8.decompress`) of ``n`` codes into ``itemsize``-byte values."""
    b = blocks(n)
    if itemsize == 2:
        padded = b * BLOCK
        d = Work().allocate(8 * padded).stream(n, 1, 8, full=True)
        return d.stream(b, 4, 8).stream(padded, 8 + 8 * b / padded, 8, full=True).stream(n, 8, itemsize, full=True)
    whole = n // BLOCK * BLOCK
    d = Work().stream(n, 1, itemsize, full=True)
    if itemsize == 8:
        d.stream(b, 4, 8)
    if whole:
        d.stream(whole, itemsize + (itemsize * b) / whole, itemsize, "rewrite", full=whole == n)
    if whole < n:
        d.stream(n - whole, itemsize, itemsize, "rewrite")
    return d


def wire(n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends: a code byte per element and a float32 scale per block
    (:func:`compressors.messages.wire.quantized_bytes`)."""
    return float(quantized_bytes(n, BLOCK))


CARD = Card("int8", "compressors.int8:Int8", "quantized", Declared(int8, wire, residual="decompressed"),
            takes_density=False)
"""``int8``: codes and scales all-gathered (they differ from worker to worker), error feedback on."""
