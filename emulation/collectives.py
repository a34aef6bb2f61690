"""Collective micro-benchmarks: real gloo processes on shaped links (or loopback)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from typing import Any

from emulation.launch import run_workers
from emulation.network import shaped_links
from simulator.collectives import ring_terms

OPS = ("allreduce", "allgather")
"""The collectives measured here; an all-gather's ``nbytes`` is its gathered output."""

LOOPBACK_BPS = 10e9  # nominal rate used only to size timeouts of unshaped runs (bits/s)


def _timeout_s(ops: Sequence[str], sizes: Sequence[int], workers: int, bandwidth_bps: float, rounds: int) -> float:
    expected = sum(ring_terms(op, workers)[1] * n * 8.0 / bandwidth_bps for op in ops for n in sizes)
    return 60.0 + 4.0 * rounds * expected


def measure_collectives(
    workers: int,
    bandwidth_bps: float | None,
    ops: Sequence[str],
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    warmup: int = 1,
    compute_load_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Time ``ops`` × ``sizes`` (bytes) over ``workers`` ranks on links of ``bandwidth_bps``.

    ``bandwidth_bps`` (bits/s) of ``None`` runs on loopback without namespaces or shaping.
    ``compute_load_s``: seconds of compute every rank does before each timed collective (the
    CPU contention of training). Returns one dict per (op, nbytes): ``op, workers, nbytes,
    bandwidth_bps, seconds`` where ``seconds`` is the mean over repeats of the span from the
    last rank's start to the last rank's end (the expected time: gloo's all-gather between two
    ranks runs at one of two speeds, a coin toss per call, and a median would keep one), plus
    ``repeats_s``.
    """
    for op in ops:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}: choose from {', '.join(OPS)}")
    if workers < 2:
        raise ValueError(f"collective benchmarks need at least 2 workers, got {workers}")
    if repeats < 1 or warmup < 0 or compute_load_s < 0:
        raise ValueError("repeats must be >= 1, warmup and compute load >= 0")
    args = [
        "--ops", ",".join(ops), "--bytes", ",".join(str(int(n)) for n in sizes),
        "--repeats", str(repeats), "--warmup", str(warmup), "--compute-load", str(compute_load_s),
    ]
    rounds = repeats + warmup + 1
    timeout = _timeout_s(ops, sizes, workers, bandwidth_bps or LOOPBACK_BPS, rounds) + 4.0 * rounds * compute_load_s * len(ops) * len(sizes)
    with shaped_links(workers, bandwidth_bps) as plan:
        per_rank = run_workers("emulation.collective_worker", args, workers, plan, timeout)
    return list(_combine(per_rank, workers, bandwidth_bps))


def _combine(per_rank: list[dict[str, Any]], workers: int, bandwidth_bps: float | None) -> Iterator[dict[str, Any]]:
    for index, first in enumerate(per_rank[0]["results"]):
        spans = [
            max(rank["results"][index]["end"][r] for rank in per_rank)
            - max(rank["results"][index]["start"][r] for rank in per_rank)
            for r in range(len(first["start"]))
        ]
        yield {
            "op": first["op"],
            "workers": workers,
            "nbytes": int(first["nbytes"]),
            "bandwidth_bps": bandwidth_bps,
            "seconds": statistics.fmean(spans),
            "repeats_s": spans,
        }
