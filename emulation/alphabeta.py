"""The α–β cost forms of the collectives measured here (ring algorithms; see cost-model.md).

For ``p`` workers, ``n`` bytes and a link of ``B`` bytes/s, a collective takes
``latency_terms(op, p)·α + volume_factor(op, p)·n/B`` seconds. For ``allgather`` ``n`` is
the gathered (output) size.
"""

from __future__ import annotations

OPS = ("allreduce", "allgather")


def latency_terms(op: str, workers: int) -> float:
    """Number of α (per-message latency) terms of a ring ``op`` over ``workers`` ranks."""
    _check(op, workers)
    return float(2 * (workers - 1) if op == "allreduce" else workers - 1)


def volume_factor(op: str, workers: int) -> float:
    """Bytes each rank sends per byte of ``n`` in a ring ``op`` over ``workers`` ranks."""
    _check(op, workers)
    share = (workers - 1) / workers
    return 2 * share if op == "allreduce" else share


def collective_seconds(
    op: str, nbytes: float, workers: int, bandwidth_bps: float, alpha_s: float = 0.0, efficiency: float = 1.0
) -> float:
    """Ring α–β time (seconds) of ``op`` on ``nbytes`` bytes, link ``bandwidth_bps`` bits/s."""
    link_bytes_per_s = bandwidth_bps / 8.0 * efficiency
    return latency_terms(op, workers) * alpha_s + volume_factor(op, workers) * nbytes / link_bytes_per_s


def _check(op: str, workers: int) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}: choose from {', '.join(OPS)}")
    if workers < 2:
        raise ValueError(f"a collective needs at least 2 workers, got {workers}")
