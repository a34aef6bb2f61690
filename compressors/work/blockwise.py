"""The declared work the block-wise quantizers share (:mod:`compressors.blockwise`: ``int8``,
``fp8``, ``int4``): the scales and quotients of compress, the dequantization of decompress;
torch-free for the cost model (:mod:`compressors.work.declare`)."""

from __future__ import annotations

from compressors.work.declare import FINITE_OPS, Work


def blocks(n: int, block: int) -> int:
    """Blocks of an ``n``-element gradient (``block`` elements each, the last partial)."""
    return -(-n // block)


def scaled(n: int, itemsize: int, block: int) -> Work:
    """:meth:`compressors.blockwise.BlockQuantizer._scaled`: the gradient widened into a fresh
    float64 buffer padded to whole blocks (the padding zeroed), each block's ``max|g|`` (its
    largest and its smallest element, two reductions, the smallest negated in place and the larger
    of the two taken; summed over the blocks and read back for the finiteness check: one sync, and
    for float64 gradients a second read of the largest against float32's range), the scales (the
    absmax over the levels, its cast to float32, the ``+∞`` it steps towards and the step,
    ``nextafter``), widened again, and ``g / s`` in place (a ``rewrite``, as every in-place pass
    of the quantizers over a buffer the call has just written)."""
    b = blocks(n, block)
    padded = b * block
    c = Work().allocate(8 * padded).stream(n, itemsize, 8, full=True)
    if padded > n:
        c.stream(padded - n, 0, 8)
    c.stream(padded, 8, 8 * b / padded, "reduce", full=True).stream(padded, 8, 8 * b / padded, "reduce", full=True)
    c.stream(b, 8, 8).stream(b, 16, 8)
    c.stream(b, 8, 0, "reduce").scalars(FINITE_OPS).sync()
    if itemsize == 8:
        c.stream(b, 8, 0, "reduce").sync()
    c.stream(b, 8, 8).stream(b, 8, 4).scalars(1).stream(b, 4, 4)
    return c.stream(b, 4, 8).stream(padded, 16 * b / padded + 8, 8, "rewrite", full=True)


def dequantize(n: int, itemsize: int, block: int, d: Work | None = None, code_bytes: int = 1) -> Work:
    """:meth:`compressors.blockwise.BlockQuantizer.decompress` of ``n`` codes of ``code_bytes``
    bytes into ``itemsize``-byte values, after the work ``d`` that made those codes (default none;
    :meth:`compressors.blockwise.BlockQuantizer._codes`). A float32
    or float64 gradient: the codes widened into the kept output buffer and multiplied there by their
    blocks' scales (the whole blocks at once, then the partial last one; float64 widens the scales
    first); a 16-bit gradient: the codes widened into a fresh float64 buffer, multiplied by their
    blocks' scales in place, and copied (rounded once) into the kept output buffer."""
    d = Work() if d is None else d
    b = blocks(n, block)
    if itemsize == 2:
        padded = b * block
        d.allocate(8 * padded).stream(n, code_bytes, 8, full=True)
        d.stream(b, 4, 8).stream(padded, 8 + 8 * b / padded, 8, "rewrite", full=True)
        return d.stream(n, 8, itemsize, full=True)
    whole = n // block * block
    d.stream(n, code_bytes, itemsize, full=True)
    if itemsize == 8:
        d.stream(b, 4, 8)
    if whole:
        d.stream(whole, itemsize + (itemsize * b) / whole, itemsize, "rewrite", full=whole == n)
    if whole < n:
        d.stream(n - whole, itemsize, itemsize, "rewrite")
    return d
