"""Collective algorithms as step programs of link-level messages.

A :class:`Plan` is a list of :class:`Step` objects. Each step is a set of
point-to-point messages; when they use distinct links (a partial permutation, the usual case)
the link engine processes the step as one vector operation, otherwise
(``serial``) message by message in the listed order.
A message's size in bytes is ``coef · nbytes + mcoef · m[owner]`` (``uniform``: the
same ``coef`` for all and no ``m`` term; ``identity``: ``src`` is ``0 … len−1``), where
``nbytes`` is the collective's buffer and ``m`` the per-rank contributions of
an all-gather (sparse messages). A ``wait`` step makes every sender wait until it
has received everything sent to it in earlier steps (data dependency); a step
without ``wait`` only waits for the sender's previous gate (pipelined pushes).

Ranks: ``0 … p−1`` for flat topologies; for the two-level topology the global
rank is ``node·g + gpu`` and ``level="inter"`` steps address nodes (one
aggregated message per node NIC), ``level="intra"`` steps address global ranks.
Parameter-server plans with dedicated servers use ranks ``p … p+s−1`` for servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Step:
    """One round of messages: ``src[i] → dst[i]`` carrying ``coef[i]·n + mcoef[i]·m[owner[i]]`` bytes."""

    src: np.ndarray
    dst: np.ndarray
    coef: np.ndarray
    mcoef: np.ndarray
    owner: np.ndarray
    wait: bool = True
    level: str = "flat"
    serial: bool = False
    identity: bool = False
    uniform: float | None = None


Plan = tuple[Step, ...]


def _step(src, dst, coef=0.0, mcoef=0.0, owner=None, wait=True, level="flat") -> Step:
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    size = src.shape
    owner_arr = np.zeros(size, dtype=np.int64) if owner is None else np.asarray(owner, dtype=np.int64)
    serial = len(np.unique(src)) < len(src) or len(np.unique(dst)) < len(dst)
    coef_arr = np.broadcast_to(np.asarray(coef, dtype=float), size).copy()
    mcoef_arr = np.broadcast_to(np.asarray(mcoef, dtype=float), size).copy()
    identity = bool(np.array_equal(src, np.arange(len(src))))
    uniform = float(coef_arr[0]) if len(src) and not mcoef_arr.any() and (coef_arr == coef_arr[0]).all() else None
    return Step(src, dst, coef_arr, mcoef_arr, owner_arr, wait, level, serial, identity, uniform)


def ring_steps(p: int, rounds: int, coef: float, level: str = "flat", ranks: np.ndarray | None = None) -> list[Step]:
    """``rounds`` ring steps (rank r → r+1) of ``coef·n`` bytes among ``ranks`` (default 0…p−1)."""
    base = np.arange(p) if ranks is None else np.asarray(ranks)
    src = base.reshape(-1, p)
    dst = np.roll(src, -1, axis=1)
    return [_step(src.ravel(), dst.ravel(), coef, level=level) for _ in range(rounds)]


@lru_cache(maxsize=256)
def ring_allreduce(p: int) -> Plan:
    """Ring all-reduce: reduce-scatter then all-gather, 2(p−1) steps of n/p bytes."""
    return tuple(ring_steps(p, 2 * (p - 1), 1.0 / p)) if p > 1 else ()


@lru_cache(maxsize=256)
def ring_reduce_scatter(p: int) -> Plan:
    """Ring reduce-scatter (or all-gather of a full buffer n): p−1 steps of n/p bytes."""
    return tuple(ring_steps(p, p - 1, 1.0 / p)) if p > 1 else ()


@lru_cache(maxsize=256)
def ring_allgather(p: int) -> Plan:
    """Ring all-gather of per-rank blocks: at step s rank r forwards rank (r−s)'s block to r+1."""
    ranks = np.arange(p)
    return tuple(
        _step(ranks, (ranks + 1) % p, 0.0, 1.0, owner=(ranks - s) % p) for s in range(p - 1)
    )


def _hd_core(q: int) -> list[Step]:
    """Recursive halving (reduce-scatter) then doubling (all-gather) among ranks 0…q−1, q = 2^L."""
    ranks = np.arange(q)
    levels = q.bit_length() - 1
    steps = []
    for k in range(levels):
        dist = q >> (k + 1)
        steps.append(_step(ranks, ranks ^ dist, 1.0 / (2 << k)))
    for k in reversed(range(levels)):
        dist = q >> (k + 1)
        steps.append(_step(ranks, ranks ^ dist, 1.0 / (2 << k)))
    return steps


@lru_cache(maxsize=256)
def halving_doubling_allreduce(p: int) -> Plan:
    """Rabenseifner all-reduce; for p not a power of two the r = p − 2^⌊log2 p⌋ extra ranks
    first send their full buffer to a partner and receive the result at the end."""
    if p <= 1:
        return ()
    q = 1 << (p.bit_length() - 1)
    extra = np.arange(q, p)
    steps = []
    if len(extra):
        steps.append(_step(extra, extra - q, 1.0))
    steps += _hd_core(q)
    if len(extra):
        steps.append(_step(extra - q, extra, 1.0))
    return tuple(steps)


@lru_cache(maxsize=256)
def tree_allreduce(p: int) -> Plan:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: 2⌈log2 p⌉ rounds of n bytes."""
    if p <= 1:
        return ()
    levels = (p - 1).bit_length()
    ranks = np.arange(p)
    steps = []
    for k in range(levels):
        send = ranks[(ranks % (2 << k)) == (1 << k)]
        steps.append(_step(send, send - (1 << k), 1.0))
    for k in reversed(range(levels)):
        send = ranks[((ranks % (2 << k)) == 0) & (ranks + (1 << k) < p)]
        steps.append(_step(send, send + (1 << k), 1.0))
    return tuple(steps)


@lru_cache(maxsize=256)
def ps_sharded(p: int, sparse: bool) -> Plan:
    """Parameter server sharded over the p workers: push 1/p of the buffer to every other
    worker in p−1 permutation rounds, then pull the reduced shards back the same way.

    Sparse variant: pushes carry ``m[src]/p`` bytes (a worker's sparse message split by
    index range); pulls carry ``coef·n`` with n the aggregated (union) size.
    """
    if p <= 1:
        return ()
    ranks = np.arange(p)
    steps = []
    for s in range(1, p):
        if sparse:
            steps.append(_step(ranks, (ranks + s) % p, 0.0, 1.0 / p, owner=ranks, wait=False))
        else:
            steps.append(_step(ranks, (ranks + s) % p, 1.0 / p, wait=False))
    for s in range(1, p):
        steps.append(_step(ranks, (ranks + s) % p, 1.0 / p, wait=(s == 1)))
    return tuple(steps)


@lru_cache(maxsize=256)
def ps_dedicated(p: int, servers: int, sparse: bool) -> Plan:
    """Parameter server on ``servers`` dedicated ranks p…p+s−1: every worker pushes 1/s of its
    buffer to every server, each server then sends its reduced 1/s back to every worker."""
    workers = np.arange(p)
    steps = []
    for j in range(servers):
        dst = p + (workers + j) % servers
        if sparse:
            steps.append(_step(workers, dst, 0.0, 1.0 / servers, owner=workers, wait=False))
        else:
            steps.append(_step(workers, dst, 1.0 / servers, wait=False))
    srv = np.arange(servers)
    for j in range(p):
        steps.append(_step(p + srv, (srv + j) % p, 1.0 / servers, wait=(j == 0)))
    return tuple(steps)


@lru_cache(maxsize=256)
def hierarchical_allreduce(nodes: int, gpus: int, sparse: bool) -> Plan:
    """Two-level all-reduce: intra-node ring reduce-scatter, inter-node all-reduce of n/g per
    GPU (the g rails share the node NIC, so one aggregated message per node), intra all-gather.

    Sparse variant: the inter-node phase is a ring all-gather of each node's compressed shards
    (``m[node]`` bytes, the sum over its GPUs).
    """
    steps: list[Step] = []
    ranks = np.arange(nodes * gpus)
    if gpus > 1:
        steps += ring_steps(gpus, gpus - 1, 1.0 / gpus, "intra", ranks)
    if nodes > 1:
        if sparse:
            node = np.arange(nodes)
            steps += [
                _step(node, (node + 1) % nodes, 0.0, 1.0, owner=(node - s) % nodes, level="inter")
                for s in range(nodes - 1)
            ]
        else:
            steps += ring_steps(nodes, 2 * (nodes - 1), 1.0 / nodes, "inter")
    if gpus > 1:
        steps += ring_steps(gpus, gpus - 1, 1.0 / gpus, "intra", ranks)
    return tuple(steps)
