"""The declared work and card of ``fp8``, block-wise e4m3 quantization (:mod:`compressors.fp8`),
torch-free for the cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds
it to the code."""

from __future__ import annotations

from compressors.messages.wire import quantized_bytes
from compressors.work import blockwise
from compressors.work.cards import Card
from compressors.work.declare import Declared, Work

BLOCK = 256
"""Elements per block, each with its own float32 scale (the last block partial), as ``int8``'s:
1/64 byte of scale per element on the wire."""

LEVELS = 448
"""e4m3's largest finite number (``torch.finfo(torch.float8_e4m3fn).max``): codes lie in [−448, 448]."""

MANTISSA_BITS = 3
"""e4m3's stored mantissa bits: the spacing of its numbers in [2^e, 2^(e+1)) is 2^(e − 3)."""

SMALLEST_NORMAL = 2.0 ** -6
"""e4m3's smallest normal number; below it the subnormals are spaced 2⁻⁹ apart."""

FLOAT16_SHIFT = 8
"""float16's exponent bias less e4m3's (15 − 7): an e4m3 pattern read as float16 bits (sign to bit
15, the rest to bits 7–13) is the e4m3 number times 2⁻⁸."""


def fp8(n: int, density: float, itemsize: int, stages: int, rounds: int | None,
        backend: str) -> tuple[Work, Work]:
    """fp8: the scales and ``g / s`` in a padded float64 buffer
    (:func:`compressors.work.blockwise.scaled`); the e4m3 spacing of each quotient (its exponent
    bits masked into a fresh float64 buffer, clamped to the smallest normal and scaled by 2⁻³, in
    place), the quotient divided by it, rounded and multiplied back (in place), and narrowed into a
    fresh float8 vector. Decompress: :func:`compressors.work.blockwise.dequantize` of the codes, on
    a GPU (``backend="cuda"``) as they are, elsewhere widened through their bits first (the bytes
    into a fresh int16 vector, their sign bit masked into another, added in place, shifted in
    place; the scales times 2⁸) and read as float16 (2 bytes each)."""
    padded = blockwise.blocks(n, BLOCK) * BLOCK
    c = blockwise.scaled(n, itemsize, BLOCK)
    c.allocate(8 * padded).stream(padded, 8, 8, full=True)
    c.stream(padded, 8, 8, "rewrite", full=True).stream(padded, 8, 8, "rewrite", full=True)
    for read in (16, 8, 16):  # the division, the rounding, the multiplication back
        c.stream(padded, read, 8, "rewrite", full=True)
    c.stream(n, 8, 1, full=True).allocate(n)
    if backend == "cuda":
        return c, blockwise.dequantize(n, itemsize, BLOCK)
    d = Work().allocate(2 * n).stream(n, 1, 2, full=True).allocate(2 * n).stream(n, 2, 2, full=True)
    d.stream(n, 4, 2, "rewrite", full=True).stream(n, 2, 2, "rewrite", full=True)
    d.stream(blockwise.blocks(n, BLOCK), 4, 4)
    return c, blockwise.dequantize(n, itemsize, BLOCK, d, code_bytes=2)


def wire(n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends: a code byte per element and a float32 scale per block
    (:func:`compressors.messages.wire.quantized_bytes`)."""
    return float(quantized_bytes(n, BLOCK))


CARD = Card("fp8", "compressors.fp8:Fp8", "quantized", Declared(fp8, wire, residual="decompressed"),
            takes_density=False)
"""``fp8``: codes and scales all-gathered (they differ from worker to worker), error feedback on."""
