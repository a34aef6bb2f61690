"""The declared work of Random-k (:mod:`compressors.randomk`), torch-free for the cost model
(:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compressors.work.cards import Card
from compressors.work.declare import Declared, Work, finite, sparse_decompress, sparse_wire
from compressors.rules import target_count

ROUNDS = 1
"""Random-k's draw rounds seen on the benchmark's gradient-like vector at δ = 0.01."""


def randomk(n: int, density: float, itemsize: int, stages: int, rounds: int | None,
            backend: str) -> tuple[Work, Work]:
    """Random-k: for ``k ≥ n/4`` a random permutation's first ``k``, sorted; else ``rounds`` draws
    of a few more indices than are missing, each made unique with what was drawn before (a sort,
    a sync to size it), a random ``k`` of them kept and sorted; the finiteness check; the values
    gathered."""
    rounds = ROUNDS if rounds is None else rounds
    k = target_count(density, n)
    c = Work()
    if 4 * k >= n:
        c.stream(n, 0, 8).sort(k)
    else:
        draw = k + k // 16 + 16
        for _ in range(rounds):
            c.stream(draw, 0, 8).stream(draw, 8, 8).sort(draw).sync()
        c.stream(draw, 0, 8).gather(k).sort(k)
    finite(c, n, itemsize)
    return c.gather(k), sparse_decompress(n, k, itemsize)


def loops(ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """Random-k's draw rounds (``rounds``: its ``unique`` calls), read from one call's operations."""
    return {"rounds": ops.count("_unique2")}


CARD = Card("randomk", "compressors.randomk:RandomK", "sparse", Declared(randomk, sparse_wire), loops=loops,
            shared_seed="seed")
"""Random-k: with a ``seed`` every rank draws the same indices and the values are all-reduced."""
