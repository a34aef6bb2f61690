"""The declared work of DGC's selection (:mod:`compressors.dgc`), torch-free for the cost model
(:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from compressors.work.cards import Card
from compressors.work.counting import kept_hits, selections
from compressors.work.declare import (FINITE_OPS, Declared, Work, fused_selection, kept, select, sparse_decompress,
                                      sparse_wire)
from compressors.rules import sample_stride, target_count

SAMPLE_RATIO = 0.01
"""DGC's default share of the elements it samples (:class:`compressors.dgc.DGC`'s ``sample_ratio``)."""

ROUNDS = 0
"""DGC's threshold lowerings seen on the benchmark's gradient-like vector at δ = 0.01 (none)."""


def dgc(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
        trim: bool = True, hits: Sequence[float] = (), error_feedback: bool = False,
        pending: bool | None = None) -> tuple[Work, Work]:
    """DGC: top ``δ`` of a strided sample of ``|g|`` sets the threshold; the selection
    ``|g| ≥ thr`` (with ``Σ|g|`` for the finiteness check); ``rounds`` lowerings by 0.8 while it
    holds fewer than 0.8·k; ``trim``: an exact top-k among more than 1.3·k. On the fused path
    with error feedback folded (``error_feedback``: :meth:`compressors.dgc.DGC.compress_feedback`,
    whenever the sample is not the whole vector) the sample is ``|g + r|`` at its positions, the
    first selection's read folds in the addition (:func:`compressors.work.work`), and a trimmed
    selection, not exactly ``|x| ≥ thr``, updates the residual itself (an ``index_add_`` of what
    was sent); an untrimmed one leaves it pending, and the next call zeroes it in its sample first
    (three more small operations; ``pending``: whether the call before left it so, by default
    the steady state, ``not trim``)."""
    rounds = ROUNDS if rounds is None else rounds
    k = target_count(density, n)
    samples = math.ceil(n / sample_stride(n, density, SAMPLE_RATIO))
    folded = error_feedback
    c = Work().stream(samples, itemsize, itemsize).allocate(samples * itemsize)
    if folded:  # the sample's g + r (and, after an untrimmed call, the pending zeroing of r first)
        c.stream(samples, 2 * itemsize, itemsize)
        if (not trim) if pending is None else pending:
            c.stream(samples, itemsize, itemsize).stream(samples, itemsize, 1, "compare")
            c.stream(samples, itemsize + 1, itemsize)
    top = max(1, math.ceil(samples * density))
    c.select_topk(samples, top).stream(top, itemsize, 0, "reduce")
    c.scalars(2)
    select(c, n, kept(hits, 0, k), itemsize, backend, total=True)
    c.scalars(FINITE_OPS).sync()
    for step in range(rounds):
        c.scalars(2)
        select(c, n, kept(hits, step + 1, k), itemsize, backend)
    if trim:
        c.select_topk(1.3 * k, k).gather(k).sort(k)
    c.gather(k)
    if folded and trim:
        c.gather(k)
    return c, sparse_decompress(n, k, itemsize)


def samples_everything(n: int, density: float) -> bool:
    """Whether DGC's sample is the whole vector (stride 1): then error feedback stays eager on its
    fused path (:meth:`compressors.dgc.DGC.compress_feedback` declines)."""
    return sample_stride(n, density, SAMPLE_RATIO) == 1


def loops(ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """DGC's threshold lowerings (``rounds``: its selections but the first), whether it trimmed
    (a second ``topk``), whether it found the residual's zeroing pending (``masked_fill``) and the
    ``hits`` of each native selection, read from one call's operations."""
    return {"rounds": selections(ops) - 1, "trim": ops.count("topk") == 2, "pending": "masked_fill" in ops,
            **kept_hits(ops)}


CARD = Card("dgc", "compressors.dgc:DGC", "sparse",
            Declared(dgc, sparse_wire, fused=fused_selection, eager_feedback=samples_everything),
            native_on_cpu=True, loops=loops)
"""DGC's selection."""
