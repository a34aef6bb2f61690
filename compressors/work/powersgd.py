"""The declared work of PowerSGD (:mod:`compressors.powersgd`), torch-free for the cost model
(:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

import math

from compressors.messages.wire import ALLREDUCE
from compressors.work.cards import Card
from compressors.work.declare import FINITE_OPS, Declared, Work

RANK = 1
"""PowerSGD rank assumed by its declaration (the compressor's default; the gradient viewed as a
⌈√n⌉-row square matrix)."""


def factors(n: int) -> tuple[int, int, int]:
    """Rows, columns and rank of PowerSGD's one matrix: the vector as a square of side ⌈√n⌉."""
    side = math.isqrt(max(n - 1, 0)) + 1
    return side, side, min(side, RANK)


def powersgd(n: int, density: float, itemsize: int, stages: int, rounds: int | None,
             backend: str) -> tuple[Work, Work]:
    """PowerSGD, one power iteration on the whole vector as one square matrix (zero-padded to
    ``side²``): ``‖g‖`` for the finiteness check, re-orthogonalise the kept Q, ``P = M·Q``,
    orthogonalise P, ``Q = Mᵀ·P`` (each product one read of M), a copy of Q to send."""
    rows, cols, r = factors(n)
    c = Work().stream(n, itemsize, 0, "reduce", full=True).scalars(FINITE_OPS).sync()
    if rows * cols != n:
        c.stream(rows * cols, 0, itemsize, full=True).allocate(rows * cols * itemsize)
        c.stream(n, itemsize, itemsize, full=True)
    _orthogonalize(c, cols * r, itemsize)
    c.stream(rows * cols, itemsize, r * itemsize / cols, full=True)
    _orthogonalize(c, rows * r, itemsize)
    c.stream(rows * cols, itemsize, r * itemsize / rows, full=True).stream(cols * r, itemsize, itemsize)
    c.flops += 4.0 * rows * cols * r
    return c, _expand(n, itemsize)


def _orthogonalize(w: Work, elements: int, itemsize: int) -> None:
    """PyTorch's Gram-Schmidt of one rank-1 factor (its norm, the division) and the NaN clean-up."""
    w.stream(elements, itemsize, 0, "reduce").stream(elements, itemsize, itemsize)
    w.stream(elements, itemsize, itemsize)


def _expand(n: int, itemsize: int) -> Work:
    """PowerSGD's decompress into a kept buffer: ``P·Qᵀ`` straight into place when the square
    holds exactly ``n`` elements, else into a fresh padded square and copied (its first ``n``)."""
    rows, cols, r = factors(n)
    d = Work().stream(rows * cols, r * itemsize * (rows + cols) / (rows * cols), itemsize, "outer", full=True)
    if rows * cols != n:
        d.allocate(rows * cols * itemsize).stream(n, itemsize, itemsize, full=True)
    return d


def wire(n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends: the two factors of the vector as one square matrix (:func:`factors`)."""
    rows, cols, r = factors(n)
    return float((rows + cols) * r * itemsize)


CARD = Card("powersgd", "compressors.powersgd:PowerSGD", "lowrank", Declared(powersgd, wire, residual="decompressed"),
            takes_density=False, collective=ALLREDUCE, baseline=True, always_compared=True)
"""PowerSGD: its factors all-reduced (PyTorch's hook)."""
