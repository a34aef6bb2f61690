"""The declared work of RedSync (:mod:`compressors.redsync`), torch-free for the cost model
(:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compressors.work.cards import Card
from compressors.work.counting import kept_hits, selections
from compressors.work.declare import (Declared, Work, count, fused_selection, kept, select, sparse_decompress,
                                      sparse_wire)
from compressors.rules import target_count

ROUNDS = 5
"""RedSync's binary-search probes seen on the benchmark's gradient-like vector at δ = 0.01."""

SETUP_OPS = 6
"""Launches of 0-d tensor arithmetic making ``mean|g|`` of its reduction and checking it finite
(read by the one sync), as the torch path issues them (counted with a dispatch mode when the code
was written)."""

PROBE_OPS = 5
"""Launches of 0-d tensor arithmetic per probe: its threshold ``μ + mid·(max|g| − μ)``, clamped
and cast (likewise)."""


def redsync(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
            hits: Sequence[float] = ()) -> tuple[Work, Work]:
    """RedSync: ``max|g|`` and ``mean|g|``, then ``rounds`` binary-search probes each counting
    ``|g| > thr`` (one sync each), then the selection at the chosen threshold (≈ 1.5·k hits)."""
    rounds = ROUNDS if rounds is None else rounds
    k = target_count(density, n)
    c = Work().stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.scalars(1).stream(n, itemsize, 0, "reduce", full=True).scalars(SETUP_OPS).sync()
    for step in range(rounds):
        c.scalars(PROBE_OPS)
        count(c, n, kept(hits, step, 2 * k), itemsize, backend)
    sent = kept(hits, rounds, 1.5 * k)
    select(c, n, sent, itemsize, backend)
    return c.gather(sent), sparse_decompress(n, sent, itemsize)


def loops(ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """RedSync's binary-search probes (``rounds``: its counts and selections but the last) and the
    ``hits`` of each native selection, read from one call's operations."""
    return {"rounds": ops.count("count_nonzero") + selections(ops) - 1, **kept_hits(ops)}


CARD = Card("redsync", "compressors.redsync:RedSync", "sparse",
            Declared(redsync, sparse_wire, sent=1.5, sends_last_hits=True, fused=fused_selection,
                     eager_feedback=True), native_on_cpu=True, loops=loops)
"""RedSync."""
