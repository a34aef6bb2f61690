"""The declared work of Gaussian-k (:mod:`compressors.gaussiank`), torch-free for the cost model
(:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compressors.work.cards import Card
from compressors.work.counting import kept_hits, selections
from compressors.work.declare import (ISFINITE_OPS, Declared, Work, fused_selection, kept, select, sparse_decompress,
                                      sparse_wire)
from compressors.rules import target_count

ROUNDS = 3
"""Gaussian-k's threshold corrections seen on the benchmark's gradient-like vector at δ = 0.01
(all three)."""

MOMENT_OPS = 13
"""Launches of 0-d tensor arithmetic making the mean and variance of the two reductions and
checking them finite (read by the one sync), as the torch path issues them (counted with a
dispatch mode when the code was written)."""

THRESHOLD_OPS = 7
"""Launches of 0-d tensor arithmetic of the threshold formula ``|μ| + z·σ`` in float64 and its cast
(likewise)."""


def gaussiank(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
              hits: Sequence[float] = ()) -> tuple[Work, Work]:
    """Gaussian-k: mean and variance of ``g`` (two reductions), the threshold formula, a
    selection, then ``rounds`` corrections each with a new selection, each scaling the float64
    threshold (×1.5 or ×0.5: its finiteness check, widening, choice, product and narrowing)."""
    rounds = ROUNDS if rounds is None else rounds
    k = target_count(density, n)
    c = Work().stream(n, itemsize, 0, "reduce", full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.scalars(MOMENT_OPS).sync().scalars(THRESHOLD_OPS)
    select(c, n, kept(hits, 0, k), itemsize, backend)
    for step in range(rounds):
        c.scalars(4 + ISFINITE_OPS)
        select(c, n, kept(hits, step + 1, k), itemsize, backend)
    sent = kept(hits, rounds, k)
    return c.gather(sent), sparse_decompress(n, sent, itemsize)


def loops(ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """Gaussian-k's threshold corrections (``rounds``: its selections but the first) and the
    ``hits`` of each native selection, read from one call's operations."""
    return {"rounds": selections(ops) - 1, **kept_hits(ops)}


CARD = Card("gaussiank", "compressors.gaussiank:GaussianK", "sparse",
            Declared(gaussiank, sparse_wire, sends_last_hits=True, fused=fused_selection, eager_feedback=True),
            native_on_cpu=True, loops=loops)
"""Gaussian-k."""
