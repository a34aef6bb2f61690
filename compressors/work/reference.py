"""The declared work of ``none`` and exact Top-k (:mod:`compressors.reference`), torch-free for the
cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from compressors.messages.wire import ALLREDUCE
from compressors.work.cards import Card
from compressors.work.counting import kept_hits, selections
from compressors.work.declare import (FINITE_OPS, ISFINITE_OPS, Declared, Work, dense_wire, finite, kept, select,
                                      sparse_decompress, sparse_wire)
from compressors.rules import TOPK_SAMPLE, target_count

TOPK_ROUNDS = 0
"""Top-k's halvings of its sampled threshold guess seen on the benchmark's gradient-like vector at
δ = 0.01 (none)."""


def none(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str) -> tuple[Work, Work]:
    """``none``: the finiteness check (a fresh sum); decompress copies the dense message into the
    kept buffer."""
    c = Work()
    finite(c, n, itemsize)
    return c, Work().stream(n, itemsize, itemsize, full=True)


def topk(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
         hits: Sequence[float] = ()) -> tuple[Work, Work]:
    """Exact Top-k (:func:`compressors.numerics.selection.exact_topk`) on a CPU (torch or native
    selection): a threshold guess from a strided sample, the candidates above it (``rounds``
    halvings of the guess while too few), ``torch.topk`` among the candidates. ``n`` < 2¹⁴ or ``k ≥ n/4``: ``torch.topk``
    over ``|g|``, as on CUDA (``backend="cuda"``)."""
    rounds = TOPK_ROUNDS if rounds is None else rounds
    k = target_count(density, n)
    c = Work()
    if backend == "cuda" or 4 * k >= n or n < 4 * TOPK_SAMPLE:
        c.stream(n, itemsize, itemsize, full=True).select_topk(n, k).sort(k)
        c.stream(n, itemsize, 0, "reduce", full=True).gather(k)
    else:
        stride = max(1, n // max(TOPK_SAMPLE, math.ceil(20 * n / k)))
        sample = math.ceil(n / stride)
        top = min(sample, math.ceil(1.5 * sample * k / n) + 3)
        candidates = n * min(1.0, 1.2 * k / n)
        c.stream(sample, itemsize, itemsize).allocate(sample * itemsize).select_topk(sample, top)
        c.stream(top, itemsize, 0, "reduce")
        select(c, n, kept(hits, 0, candidates), itemsize, backend, total=True)
        c.scalars(ISFINITE_OPS).sync()
        for step in range(rounds):
            c.scalars(2).sync()
            select(c, n, kept(hits, step + 1, candidates), itemsize, backend)
        c.select_topk(kept(hits, rounds, candidates), k).sort(k).gather(k).gather(k).gather(k)
    c.scalars(FINITE_OPS).sync().gather(k).stream(k, itemsize, 0, "reduce")
    return c, sparse_decompress(n, k, itemsize)


def topk_loops(ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """Top-k's halvings of its threshold guess (``rounds``: its selections but the first) and the
    ``hits`` of each native selection, read from one call's operations."""
    return {"rounds": max(0, selections(ops) - 1), **kept_hits(ops)}


NONE = Card("none", "compressors.reference:NoCompression", "sparse", Declared(none, dense_wire, residual="fresh"),
            takes_density=False, error_feedback=False, collective=ALLREDUCE, baseline=True, always_compared=True)
"""``none``: the whole vector, all-reduced; it leaves a fresh zero residual and trains without one."""

TOPK = Card("topk", "compressors.reference:TopK", "sparse", Declared(topk, sparse_wire), native_on_cpu=True,
            loops=topk_loops)
"""Exact Top-k."""
