"""The declared work of DGC's selection (:mod:`compressors.dgc`), torch-free for the cost model
(:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

import math
from collections.abc import Sequence

from compressors.work.declare import (FINITE_OPS, Declared, Work, fused_selection, kept, select, sparse_decompress,
                                      sparse_wire)
from compressors.rules import sample_stride, target_count

ROUNDS = 0
"""DGC's threshold lowerings seen on the benchmark's gradient-like vector at δ = 0.01 (none)."""


def dgc(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
        trim: bool = True, hits: Sequence[float] = ()) -> tuple[Work, Work]:
    """DGC: top ``δ`` of a strided sample of ``|g|`` sets the threshold; the selection
    ``|g| ≥ thr`` (with ``Σ|g|`` for the finiteness check); ``rounds`` lowerings by 0.8 while it
    holds fewer than 0.8·k; ``trim``: an exact top-k among more than 1.3·k."""
    rounds = ROUNDS if rounds is None else rounds
    k = target_count(density, n)
    samples = math.ceil(n / sample_stride(n, density, 0.01))
    c = Work().stream(samples, itemsize, itemsize).allocate(samples * itemsize)
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
    return c.gather(k), sparse_decompress(n, k, itemsize)


DECLARES: dict[str, Declared] = {"dgc": Declared(dgc, sparse_wire, fused=fused_selection,
                                                 eager_feedback=True)}
"""DGC by name."""
