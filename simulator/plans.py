"""Collective algorithms as step programs of link-level messages.

A :class:`Plan` is a sequence of :class:`Step` objects, made one at a time while the
link engine walks it, so a plan of p ranks never holds more than one step's O(p) arrays
(a ring all-reduce has 2(p−1) steps: materialised, that would be p² entries). Each step is
a set of point-to-point messages; when they use distinct links (a partial permutation, the usual case)
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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike


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


class Plan(Sequence):
    """Steps made on demand: segments of ``(count, make)`` where ``make(i)`` returns step ``i``
    of its segment. Memory is that of one step, whatever the number of steps."""

    def __init__(self, *segments: tuple[int, Callable[[int], Step]]) -> None:
        self.segments = tuple((int(n), make) for n, make in segments if n > 0)
        self._len = sum(n for n, _ in self.segments)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Step:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("plan step out of range")
        for n, make in self.segments:
            if index < n:
                return make(index)
            index -= n
        raise IndexError("plan step out of range")

    def __iter__(self) -> Iterator[Step]:
        for n, make in self.segments:
            for i in range(n):
                yield make(i)

    def __add__(self, other: Plan) -> Plan:
        return Plan(*self.segments, *other.segments)


EMPTY = Plan()


def repeat(step: Step, count: int) -> Plan:
    """``count`` copies of one step (the same object: no memory per copy)."""
    return Plan((count, lambda _i: step))


def step(src: ArrayLike, dst: ArrayLike, coef: ArrayLike = 0.0, mcoef: ArrayLike = 0.0, owner: ArrayLike | None = None,
         wait: bool = True, level: str = "flat", serial: bool | None = None) -> Step:
    """A step of messages ``src[i] → dst[i]`` of ``coef·n + mcoef·m[owner]`` bytes (scalars or one per
    message); ``serial`` is found by checking for repeated senders or receivers unless given."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    size = src.shape
    owner_arr = np.zeros(size, dtype=np.int64) if owner is None else np.asarray(owner, dtype=np.int64)
    if serial is None:
        serial = len(np.unique(src)) < len(src) or len(np.unique(dst)) < len(dst)
    coef_arr = np.broadcast_to(np.asarray(coef, dtype=float), size)
    mcoef_arr = np.broadcast_to(np.asarray(mcoef, dtype=float), size)
    identity = len(src) > 0 and src[0] == 0 and src[-1] == len(src) - 1 and bool(np.array_equal(src, np.arange(len(src))))
    uniform = float(coef) if len(src) and np.ndim(coef) == 0 and np.ndim(mcoef) == 0 and not mcoef else None
    return Step(src, dst, coef_arr, mcoef_arr, owner_arr, wait, level, serial, identity, uniform)


def ring_steps(p: int, rounds: int, coef: float, level: str = "flat", ranks: np.ndarray | None = None) -> Plan:
    """``rounds`` ring steps (rank r → r+1) of ``coef·n`` bytes among ``ranks`` (default 0…p−1)."""
    base = np.arange(p) if ranks is None else np.asarray(ranks)
    src = base.reshape(-1, p)
    dst = np.roll(src, -1, axis=1)
    return repeat(step(src.ravel(), dst.ravel(), coef, level=level, serial=False), rounds)


def pairwise_steps(p: int, coef: float, level: str = "flat", ranks: np.ndarray | None = None) -> Plan:
    """A pairwise-exchange all-to-all among each consecutive group of ``p`` of ``ranks`` (default
    0…p−1): p−1 steps, at step i the j-th rank of a group sends ``coef·n`` bytes (its chunk for
    that rank) to the ((j + i) mod p)-th and receives from the ((j − i) mod p)-th, each step after
    the previous one's messages have arrived (Thakur, Rabenseifner & Gropp 2005's pairwise exchange)."""
    if p <= 1:
        return EMPTY
    src = (np.arange(p) if ranks is None else np.asarray(ranks)).reshape(-1, p)
    return Plan((p - 1, lambda i: step(src.ravel(), np.roll(src, -(i + 1), axis=1).ravel(), coef, level=level,
                                       serial=False)))


@lru_cache(maxsize=256)
def pairwise_alltoall(p: int) -> Plan:
    """All-to-all of a buffer of n bytes per rank (n/p for each rank) by pairwise exchange:
    p−1 steps of n/p bytes (:func:`pairwise_steps`)."""
    return pairwise_steps(p, 1.0 / p)


@lru_cache(maxsize=256)
def ring_allreduce(p: int) -> Plan:
    """Ring all-reduce: reduce-scatter then all-gather, 2(p−1) steps of n/p bytes."""
    return ring_steps(p, 2 * (p - 1), 1.0 / p) if p > 1 else EMPTY


@lru_cache(maxsize=256)
def ring_reduce_scatter(p: int) -> Plan:
    """Ring reduce-scatter (or all-gather of a full buffer n): p−1 steps of n/p bytes."""
    return ring_steps(p, p - 1, 1.0 / p) if p > 1 else EMPTY


def _ring_gather(p: int, level: str = "flat") -> Plan:
    """Ring all-gather of per-rank blocks: at step s rank r forwards rank (r−s)'s block to r+1."""
    ranks = np.arange(p)
    succ = (ranks + 1) % p
    return Plan((p - 1, lambda s: step(ranks, succ, 0.0, 1.0, owner=(ranks - s) % p, level=level, serial=False)))


@lru_cache(maxsize=256)
def ring_allgather(p: int) -> Plan:
    """Ring all-gather of per-rank blocks: at step s rank r forwards rank (r−s)'s block to r+1."""
    return _ring_gather(p)


def _hd_core(q: int) -> Plan:
    """Recursive halving (reduce-scatter) then doubling (all-gather) among ranks 0…q−1, q = 2^L."""
    ranks = np.arange(q)
    levels = q.bit_length() - 1

    def halving(k: int) -> Step:
        return step(ranks, ranks ^ (q >> (k + 1)), 1.0 / (2 << k), serial=False)

    return Plan((levels, halving), (levels, lambda i: halving(levels - 1 - i)))


@lru_cache(maxsize=256)
def halving_doubling_allreduce(p: int) -> Plan:
    """Rabenseifner all-reduce; for p not a power of two the r = p − 2^⌊log2 p⌋ extra ranks
    first send their full buffer to a partner and receive the result at the end."""
    if p <= 1:
        return EMPTY
    q = 1 << (p.bit_length() - 1)
    extra = np.arange(q, p)
    if not len(extra):
        return _hd_core(q)
    fold_in = step(extra, extra - q, 1.0, serial=False)
    fold_out = step(extra - q, extra, 1.0, serial=False)
    return repeat(fold_in, 1) + _hd_core(q) + repeat(fold_out, 1)


@lru_cache(maxsize=256)
def tree_allreduce(p: int) -> Plan:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: 2⌈log2 p⌉ rounds of n bytes."""
    if p <= 1:
        return EMPTY
    levels = (p - 1).bit_length()
    ranks = np.arange(p)

    def reduce(k: int) -> Step:
        send = ranks[(ranks % (2 << k)) == (1 << k)]
        return step(send, send - (1 << k), 1.0, serial=False)

    def broadcast(i: int) -> Step:
        k = levels - 1 - i
        send = ranks[((ranks % (2 << k)) == 0) & (ranks + (1 << k) < p)]
        return step(send, send + (1 << k), 1.0, serial=False)

    return Plan((levels, reduce), (levels, broadcast))


@lru_cache(maxsize=256)
def ps_sharded(p: int, sparse: bool) -> Plan:
    """Parameter server sharded over the p workers: push 1/p of the buffer to every other
    worker in p−1 permutation rounds, then pull the reduced shards back the same way.

    Sparse variant: pushes carry ``m[src]/p`` bytes (a worker's sparse message split by
    index range); pulls carry ``coef·n`` with n the aggregated (union) size.
    """
    if p <= 1:
        return EMPTY
    ranks = np.arange(p)

    def push(i: int) -> Step:
        dst = (ranks + i + 1) % p
        if sparse:
            return step(ranks, dst, 0.0, 1.0 / p, owner=ranks, wait=False, serial=False)
        return step(ranks, dst, 1.0 / p, wait=False, serial=False)

    def pull(i: int) -> Step:
        return step(ranks, (ranks + i + 1) % p, 1.0 / p, wait=(i == 0), serial=False)

    return Plan((p - 1, push), (p - 1, pull))


@lru_cache(maxsize=256)
def ps_dedicated(p: int, servers: int, sparse: bool) -> Plan:
    """Parameter server on ``servers`` dedicated ranks p…p+s−1: every worker pushes 1/s of its
    buffer to every server, each server then sends its reduced 1/s back to every worker."""
    workers = np.arange(p)
    srv = np.arange(servers)

    def push(j: int) -> Step:
        dst = p + (workers + j) % servers
        if sparse:
            return step(workers, dst, 0.0, 1.0 / servers, owner=workers, wait=False, serial=servers < p)
        return step(workers, dst, 1.0 / servers, wait=False, serial=servers < p)

    def pull(j: int) -> Step:
        return step(p + srv, (srv + j) % p, 1.0 / servers, wait=(j == 0), serial=False)

    return Plan((servers, push), (p, pull))


@lru_cache(maxsize=256)
def hierarchical_allreduce(nodes: int, gpus: int, sparse: bool) -> Plan:
    """Two-level all-reduce: intra-node ring reduce-scatter, inter-node all-reduce of n/g per
    GPU (the g rails share the node NIC, so one aggregated message per node), intra all-gather.

    Sparse variant: the inter-node phase is a ring all-gather of each node's compressed shards
    (``m[node]`` bytes, the sum over its GPUs).
    """
    ranks = np.arange(nodes * gpus)
    intra = ring_steps(gpus, gpus - 1, 1.0 / gpus, "intra", ranks) if gpus > 1 else EMPTY
    if nodes <= 1:
        inter = EMPTY
    elif sparse:
        inter = _ring_gather(nodes, "inter")
    else:
        inter = ring_steps(nodes, 2 * (nodes - 1), 1.0 / nodes, "inter")
    return intra + inter + intra
