"""Collective costs: closed forms (``analytic``) and link-level runs (``des``).

Closed forms (α–β model; Thakur, Rabenseifner & Gropp 2005), with p ranks, n bytes,
α latency per message (s) and B link bandwidth (bytes/s):

========================  =========================================================
ring all-reduce           2(p−1)·α + 2(p−1)/p · n/B
halving-doubling          2·log2(q)·α + 2(q−1)/q · n/B, q = p a power of two; else
                          q = 2^⌊log2 p⌋ and 2(α + n/B) more (extra ranks fold in/out)
tree (binomial)           2⌈log2 p⌉ · (α + n/B)  (exact for p a power of two, an upper
                          bound otherwise: latency-optimal, not bandwidth-optimal)
ring reduce-scatter       (p−1)·α + (p−1)/p · n/B
ring all-gather, padded   (p−1)·(α + max_j m_j/B)
ring all-gather, uneven   max-plus recurrence of the ring pipeline (below); ≥ (p−1)·α +
                          max_j Σ_{i≠j} m_i/B and equal to the padded form for equal m
PS sharded on workers     2α + 2(p−1)/p · n/B
PS on s ≤ p servers       2α + 2·max(n/B, p·n/(s·B))
two-level (N nodes × g)   2(g−1)(α_i + n/(g·B_i)) + 2(N−1)(α + n/(N·B))
========================  =========================================================

The ring rows are ``steps·α + volume·n/B`` with ``(steps, volume)`` from :func:`ring_terms`
(``n`` the full buffer, or for an all-gather the gathered output ``p·m``); the emulation's
calibration fits α and the link efficiency to measured times with the same two numbers.

The ``des`` fidelity runs the same algorithm as link-level messages on a
:class:`~simulator.links.Fabric`; with no contention it agrees with the closed form to
rounding (tests check 1e-6 relative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simulator import plans
from simulator.calibration import Calibration
from simulator.limits import check_collective
from simulator.links import Fabric, Level
from units import check_count

OPS = ("allreduce", "reduce_scatter", "allgather", "ps")
ALGORITHMS = {
    "allreduce": ("ring", "halving-doubling", "tree", "hierarchical"),
    "reduce_scatter": ("ring",),
    "allgather": ("ring",),
    "ps": ("sharded", "dedicated"),
}
FIDELITIES = ("analytic", "des")
RING_OPS = ("allreduce", "reduce_scatter", "allgather")


def ring_terms(op: str, p: int) -> tuple[int, float]:
    """The α–β coefficients ``(steps, volume)`` of a ring ``op`` over ``p`` ranks.

    The collective takes ``steps·α + volume·n/B`` seconds (α per message in s, B link bytes/s)
    where ``n`` (bytes) is the full buffer of an all-reduce or reduce-scatter and the gathered
    output (``p`` blocks) of an all-gather: all-reduce ``(2(p−1), 2(p−1)/p)``, reduce-scatter
    and all-gather ``(p−1, (p−1)/p)``. ``volume`` is the bytes each rank sends per byte of ``n``.
    """
    if op not in RING_OPS:
        raise ValueError(f"unknown ring collective {op!r}; choose from {', '.join(RING_OPS)}")
    check_count(p, "a collective's number of ranks")
    share = (p - 1) / p
    if op == "allreduce":
        return 2 * (p - 1), 2 * share
    return p - 1, share


def ring_allgather_uneven(d: np.ndarray, alpha: float) -> float:
    """Completion time (s) of a ring all-gather where rank r's block takes ``d[r]`` s per link.

    Link r→r+1 carries block (r−s) mod p at step s; it starts when the link is free and
    the block has arrived: S[r,0] = 0, S[r,s] = max(S[r,s−1] + d[r−s+1], S[r−1,s−1] + d[r−s] + α).
    """
    p = len(d)
    if p <= 1:
        return 0.0
    r = np.arange(p)
    start = np.zeros(p)
    for s in range(1, p - 1):
        prev_block = d[(r - s + 1) % p]
        arrived = np.roll(start + prev_block, 1) + alpha
        start = np.maximum(start + prev_block, arrived)
    return float(np.max(start + d[(r - (p - 2)) % p] + alpha))


def analytic_time(
    op: str,
    nbytes: float,
    p: int,
    bandwidth_Bps: float,
    alpha: float,
    algorithm: str,
    *,
    sizes: np.ndarray | None = None,
    padded: bool = True,
    gpus: int = 1,
    intra: Level | None = None,
    servers: int = 0,
) -> float:
    """Closed-form time (s) of one collective; see the module table. ``p`` = ranks (nodes
    for the two-level form); ``sizes`` per-rank (per-node) bytes of an all-gather."""
    B = bandwidth_Bps
    if op == "allreduce":
        if algorithm == "hierarchical":
            return _hier_intra(nbytes, gpus, intra) + _ring("allreduce", nbytes, p, B, alpha)
        if p <= 1:
            return 0.0
        if algorithm == "ring":
            return _ring(op, nbytes, p, B, alpha)
        if algorithm == "halving-doubling":
            q = 1 << (p.bit_length() - 1)
            fold = 2 * (alpha + nbytes / B) if q < p else 0.0
            return fold + 2 * math.log2(q) * alpha + 2 * (q - 1) / q * nbytes / B
        if algorithm == "tree":
            return 2 * (p - 1).bit_length() * (alpha + nbytes / B)
    if op == "reduce_scatter" and algorithm == "ring":
        return _ring(op, nbytes, p, B, alpha)
    if op == "allgather":
        m = np.full(p, float(nbytes)) if sizes is None else np.asarray(sizes, dtype=float)
        if p <= 1:
            return 0.0
        if padded or sizes is None:
            return _ring(op, p * float(m.max()), p, B, alpha)
        return ring_allgather_uneven(m / B, alpha)
    if op == "ps":
        if algorithm == "sharded":
            if p <= 1:
                return 0.0
            if sizes is None:
                return 2 * alpha + 2 * (p - 1) / p * nbytes / B
            m = np.asarray(sizes, dtype=float)
            push = max(float(m.max()) * (p - 1) / p, float((m.sum() - m.min()) / p)) / B
            return 2 * alpha + push + (p - 1) / p * nbytes / B
        if algorithm == "dedicated":
            bottleneck = max(nbytes / B, p * nbytes / (servers * B))
            if sizes is None:
                return 2 * alpha + 2 * bottleneck
            m = np.asarray(sizes, dtype=float)
            push = max(float(m.max()), float(m.sum()) / servers) / B
            return 2 * alpha + push + bottleneck
    raise ValueError(f"unknown collective {op!r} with algorithm {algorithm!r}")


def _ring(op: str, nbytes: float, p: int, B: float, alpha: float) -> float:
    steps, volume = ring_terms(op, p)
    return steps * alpha + volume * nbytes / B


def _hier_intra(nbytes: float, gpus: int, intra: Level | None) -> float:
    if gpus <= 1 or intra is None:
        return 0.0
    return 2 * (gpus - 1) * (intra.latency_s + nbytes / (gpus * intra.bandwidth_Bps))


def plan_for(op: str, p: int, algorithm: str, *, sparse: bool = False, gpus: int = 1, servers: int = 0) -> plans.Plan:
    """The step program of a collective (see :mod:`simulator.plans`)."""
    if op == "allreduce":
        if algorithm == "ring":
            return plans.ring_allreduce(p)
        if algorithm == "halving-doubling":
            return plans.halving_doubling_allreduce(p)
        if algorithm == "tree":
            return plans.tree_allreduce(p)
        if algorithm == "hierarchical":
            return plans.hierarchical_allreduce(p, gpus, False)
    if op == "reduce_scatter" and algorithm == "ring":
        return plans.ring_reduce_scatter(p)
    if op == "allgather" and algorithm == "ring":
        return plans.ring_allgather(p)
    if op == "ps":
        if algorithm == "sharded":
            return plans.ps_sharded(p, sparse)
        if algorithm == "dedicated":
            return plans.ps_dedicated(p, servers, sparse)
    raise ValueError(f"unknown collective {op!r} with algorithm {algorithm!r}")


def check_args(op: str, algorithm: str, nodes: int, bandwidth_bps: float, latency_s: float, fidelity: str) -> None:
    """Raise ValueError naming the first invalid argument."""
    if op not in OPS:
        raise ValueError(f"unknown collective op {op!r}; choose from {', '.join(OPS)}")
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"algorithm {algorithm!r} not available for {op}; choose from {', '.join(ALGORITHMS[op])}")
    if fidelity not in FIDELITIES:
        raise ValueError(f"unknown fidelity {fidelity!r}; choose analytic or des")
    check_count(nodes, "nodes")
    if not bandwidth_bps > 0 or not math.isfinite(bandwidth_bps):
        raise ValueError(f"bandwidth must be > 0 bits/s, got {bandwidth_bps!r}")
    if not latency_s >= 0 or not math.isfinite(latency_s):
        raise ValueError(f"latency must be >= 0 s, got {latency_s!r}")


def collective_time(
    op: str,
    nbytes: float,
    nodes: int,
    bandwidth_bps: float,
    latency_s: float,
    algorithm: str = "ring",
    fidelity: str = "des",
    *,
    sizes: Sequence[float] | None = None,
    padded: bool = True,
    gpus_per_node: int = 1,
    intra_bandwidth_bps: float = 2.4e12,
    intra_latency_s: float = 2e-6,
    servers: int = 0,
    calibration: Calibration | None = None,
) -> float:
    """Time in seconds of one collective on an idle cluster.

    ``op``: ``allreduce`` | ``reduce_scatter`` | ``allgather`` | ``ps`` (push + pull);
    ``nbytes``: the full buffer (bytes) for allreduce/reduce_scatter/ps (for a sparse ``ps``
    the aggregated buffer pulled back), one rank's contribution for allgather; ``sizes``:
    bytes per rank of an all-gather or of sparse ``ps`` pushes; ``nodes``: ranks (nodes of ``gpus_per_node`` GPUs for
    ``hierarchical``); ``bandwidth_bps``: per-link bandwidth in bits/s; ``latency_s``: per
    message (s); ``padded``: all-gather pads every block to the largest (as gloo needs);
    ``servers``: dedicated parameter servers (``ps`` with ``algorithm="dedicated"``);
    ``calibration``: fitted constants; ``op``'s own α (added to ``latency_s``) and efficiency
    (× ``bandwidth_bps``) at ``nodes`` ranks apply to the inter-node links (see
    :meth:`Calibration.fit_for`: else ``op``'s fit, else the pooled one).
    """
    check_args(op, algorithm, nodes, bandwidth_bps, latency_s, fidelity)
    if calibration is not None:
        bandwidth_bps = calibration.bandwidth(bandwidth_bps, op, nodes)
        latency_s = calibration.latency(latency_s, op, nodes)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if op == "ps" and algorithm == "dedicated" and not 1 <= servers <= nodes:
        raise ValueError(f"dedicated parameter servers must be 1..nodes, got {servers}")
    B = bandwidth_bps / 8.0
    gpus = gpus_per_node if algorithm == "hierarchical" else 1
    intra = Level(intra_bandwidth_bps / 8.0, intra_latency_s)
    m = None if sizes is None else np.asarray(sizes, dtype=float)
    if m is not None and len(m) != nodes:
        raise ValueError(f"sizes must give one size per rank ({nodes}), got {len(m)}")
    ranks = nodes * gpus + (servers if algorithm == "dedicated" else 0)
    check_collective(ranks, 0 if fidelity == "des" or padded else nodes)
    if fidelity == "analytic":
        return analytic_time(op, nbytes, nodes, B, latency_s, algorithm, sizes=m, padded=padded,
                             gpus=gpus, intra=intra, servers=servers)
    sparse = op == "allgather" or (op == "ps" and m is not None)
    plan = plan_for(op, nodes, algorithm, sparse=sparse, gpus=gpus, servers=servers)
    check_collective(ranks, len(plan))
    fabric = Fabric(ranks, Level(B, latency_s), gpus=gpus, intra=intra)
    if op == "allgather" and m is None:
        m = np.full(nodes, float(nbytes))
    if op == "allgather" and padded:
        m = np.full(nodes, float(m.max()))
    finish = fabric.run(plan, nbytes, np.zeros(ranks), m)
    return float(finish.max())
