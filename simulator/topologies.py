"""Topologies: one class per collective algorithm, each holding its step plans, closed forms and phases.

A :class:`Topology` answers, for a cluster of ``nodes`` machines (``gpus`` workers each with the
two-level topology, plus ``servers`` dedicated parameter servers), what one collective of a
*kind* costs (:data:`KINDS`: ``allreduce``, ``reduce_scatter``, ``allgather``, ``alltoall``) as a
:class:`Phase`: its step program for the link engine (:mod:`simulator.plans`, the ``des``
fidelity), the buffer and per-rank sizes that program reads, and its closed form (the
``analytic`` fidelity). On top of that each topology says how a training bucket travels on it:
:meth:`Topology.dense_phases` (an all-reduce of the whole bucket) and
:meth:`Topology.sparse_phases` (compressed messages), what decompressing the messages a worker
receives costs, and how many link-level messages its collectives take (:mod:`simulator.limits`).
:data:`REGISTRY` holds the classes by name (the ``--topology`` choices): adding a topology is one
class and its line there.

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
two-level reduce-scatter  (g−1)(α_i + n/(g·B_i)) + (N−1)(α + n/(N·B))
two-level all-gather      (N−1)(α + n/(N·B)) + (g−1)(α_i + n/(g·B_i)), n = N·g·m
all-to-all (pairwise)     (p−1)·(α + n/(p·B)), n the bytes a rank sends (n/p to each)
two-level all-to-all      (g−1)(α_i + n/(g·B_i)) + (N−1)(α + n/(N·B)) (ZeRO++'s 2 hops)
========================  =========================================================

The ring rows are ``steps·α + volume·n/B`` with ``(steps, volume)`` from :func:`ring_terms`
(``n`` the full buffer, or for an all-gather the gathered output ``p·m``); the emulation's
calibration fits α and the link efficiency to measured times with the same two numbers. The
two-level forms are the ring's on each level: intra-node links (α_i, B_i) joining a node's g
GPUs, one NIC per node (α, B) carrying the node's g rails as one aggregated message.

The all-to-all (``alltoall``) is a reduce-scatter done by all-to-all, as ZeRO++'s qgZ does it
(Wang et al. 2023, arXiv 2306.10209, §3.3; DeepSpeed's ``all_to_all_quant_reduce``): every rank
sends each rank its chunk and sums the chunks it receives, so its messages need not be summable
in flight (block-quantized codes whose scales differ from rank to rank). On one level it is the
pairwise exchange (Thakur, Rabenseifner & Gropp 2005: p−1 rounds, rank r sending to r+i and
receiving from r−i), the ring reduce-scatter's α and β terms. On two levels it takes ZeRO++'s two
hops: an all-to-all among a node's g GPUs, each GPU summing the g chunks it received (n/g of its
n bytes), then an all-to-all of that n/g among the N nodes between the GPUs of one local index
(DeepSpeed's ``local_i`` and ``global_j`` groups), the NIC carrying its g GPUs' n/g each as one
aggregated message: n/N to each other node, 1/g of a GPU's data across the nodes where a flat
all-to-all would send (p−g)/p of it. Bytes one GPU sends: (g−1)/g·n + (N−1)/N·n/g = (p−1)/p·n.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from compressors.messages.wire import COUNT_BYTES
from simulator import plans
from simulator.links import Level
from units import check_count

KINDS = ("allreduce", "reduce_scatter", "allgather", "alltoall")
"""The collectives a topology may offer: all-reduce, the sharded pair whose sum it is, and the
reduce-scatter done by all-to-all (the module docstring)."""


@dataclass(frozen=True)
class Phase:
    """One collective (or one phase of a two-phase exchange) of a bucket.

    ``plan``/``nbytes``/``sizes`` drive the link engine (``nbytes``: the buffer the plan's
    ``coef`` terms scale, bytes; ``sizes``: per-rank (per-node) bytes its ``mcoef`` terms read);
    ``analytic_s`` is the closed form (s); ``link``: the flat (inter-node) links as this
    operation sees them (its calibration's α and efficiency applied), ``None`` for the
    scenario's flat level; ``gap_s``: compute (s) that must run after the previous phase and
    before this one (PowerSGD's orthogonalisation and ``Q = Mᵀ·P`` between the all-reduces of P
    and Q).
    """

    plan: plans.Plan
    nbytes: float
    sizes: np.ndarray | None
    analytic_s: float
    link: Level | None = None
    gap_s: float = 0.0


def ring_terms(op: str, p: int) -> tuple[int, float]:
    """The α–β coefficients ``(steps, volume)`` of a ring ``op`` over ``p`` ranks.

    The collective takes ``steps·α + volume·n/B`` seconds (α per message in s, B link bytes/s)
    where ``n`` (bytes) is the full buffer of an all-reduce or reduce-scatter and the gathered
    output (``p`` blocks) of an all-gather: all-reduce ``(2(p−1), 2(p−1)/p)``, reduce-scatter
    and all-gather ``(p−1, (p−1)/p)``. ``volume`` is the bytes each rank sends per byte of ``n``.
    The pairwise all-to-all of ``n`` bytes a rank (not a ring: p−1 rounds of n/p to rank r+i) has
    the reduce-scatter's terms.
    """
    if op not in KINDS:
        raise ValueError(f"unknown ring collective {op!r}; choose from {', '.join(KINDS)}")
    check_count(p, "a collective's number of ranks")
    share = (p - 1) / p
    if op == "allreduce":
        return 2 * (p - 1), 2 * share
    return p - 1, share


def ring_seconds(op: str, nbytes: float, p: int, link: Level) -> float:
    """Closed-form time (s) of a ring ``op`` over ``p`` ranks of ``nbytes`` bytes (:func:`ring_terms`)
    on ``link``."""
    steps, volume = ring_terms(op, p)
    return steps * link.latency_s + volume * nbytes / link.bandwidth_Bps


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


def ring_allgather_seconds(nbytes: float, p: int, link: Level, sizes: np.ndarray | None = None,
                           padded: bool = True) -> float:
    """Closed-form time (s) of a ring all-gather over ``p`` ranks of ``nbytes`` bytes each, or of
    ``sizes`` bytes per rank: padded to the largest block, or the uneven ring's recurrence."""
    m = np.full(p, float(nbytes)) if sizes is None else np.asarray(sizes, dtype=float)
    if p <= 1:
        return 0.0
    if padded or sizes is None:
        return ring_seconds("allgather", p * float(m.max()), p, link)
    return ring_allgather_uneven(m / link.bandwidth_Bps, link.latency_s)


class Topology:
    """The collectives of one cluster shape (the module docstring); subclasses set :attr:`name`,
    :attr:`kinds` and implement :meth:`collective`.

    ``nodes``: machines; ``gpus``: workers per machine (``> 1`` only where :attr:`levels` is 2);
    ``servers``: dedicated parameter servers (only where :attr:`takes_servers`); ``intra``: the
    intra-node links (bytes/s, s) of a two-level topology.
    """

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]] = ("allreduce",)
    levels: ClassVar[int] = 1
    """1: one worker per machine on flat links; 2: ``gpus`` workers per machine on intra-node links."""
    takes_servers: ClassVar[bool] = False
    dense_label: ClassVar[str] = "all-reduce"
    sparse_label: ClassVar[str] = "all-gather"

    def __init__(self, nodes: int, *, gpus: int = 1, servers: int = 0, intra: Level | None = None) -> None:
        self.nodes = nodes
        self.gpus = gpus
        self.servers = servers
        self.intra = intra

    @property
    def workers(self) -> int:
        """Data-parallel workers: nodes × GPUs per node."""
        return self.nodes * self.gpus

    @property
    def extra_ranks(self) -> int:
        """Ranks of the fabric beyond the workers (dedicated servers)."""
        return self.servers

    def calibration_op(self, kind: str) -> str:
        """The operation whose calibration (α, efficiency) applies to a ``kind`` collective here."""
        return kind

    def check(self, kind: str) -> None:
        """Raise ValueError unless this topology offers collectives of ``kind``."""
        if kind not in self.kinds:
            raise ValueError(f"the {self.name} topology has no {kind}; it offers {', '.join(self.kinds)}")

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        """One ``kind`` collective on ``link`` (the flat/inter-node level) as a :class:`Phase`.

        ``nbytes``: the full buffer (bytes) of an all-reduce, reduce-scatter or all-to-all (what
        each rank holds for all), one rank's block of an all-gather; ``sizes``: bytes per rank of an all-gather (or of a parameter server's
        sparse pushes); ``padded``: an all-gather pads every block to the largest.
        """
        raise NotImplementedError

    def dense_phase(self, nbytes: float, link: Level) -> Phase:
        """The all-reduce of a dense bucket of ``nbytes`` bytes."""
        return self.collective("allreduce", nbytes, link)

    def sparse_phases(self, dense: float, wire: np.ndarray, link: Level, padded: bool,
                      counts: bool = True) -> list[Phase]:
        """How the compressed messages of a bucket (``wire``: bytes per worker; ``dense``: the
        bucket's bytes) travel: a ring all-gather, padded (the counts, ``COUNT_BYTES`` each, first
        where ``counts``, then every message padded to the largest) or uneven. ``counts`` is
        ``False`` for messages whose size every rank knows
        (:func:`compressors.messages.wire.counts_first`)."""
        p = self.nodes
        if not padded:
            return [ring_allgather_phase(0.0, p, link, wire, padded=False)]
        first = [ring_allgather_phase(COUNT_BYTES, p, link)] if counts else []
        return [*first, ring_allgather_phase(float(wire.max()), p, link)]

    def sparse_decompress_s(self, decompress_s: Callable[[float], float], numel: float, shard: float) -> float:
        """Seconds a worker spends decompressing what it receives of a bucket of ``numel``
        elements (``shard`` per GPU): here every worker's whole-bucket message."""
        return self.workers * decompress_s(numel)

    def messages(self, sparse: bool = False, padded: bool = True, counts: bool = True) -> int:
        """Link-level messages of one bucket's collective(s) (``des`` work): dense, or sparse
        through :meth:`sparse_phases`."""
        p = self.workers
        if sparse:
            return (p - 1) * p * (2 if padded and counts else 1)
        return self.dense_messages()

    def dense_messages(self) -> int:
        """Link-level messages of one dense all-reduce."""
        raise NotImplementedError

    def recurrence_cells(self, sparse: bool, padded: bool) -> int:
        """Cells of the uneven all-gather recurrence one bucket's closed form takes (``analytic``
        work), else the workers (one closed form each)."""
        return self.nodes * self.nodes if sparse and not padded else self.workers


def ring_allgather_phase(nbytes: float, p: int, link: Level, sizes: np.ndarray | None = None,
                         padded: bool = True) -> Phase:
    """A ring all-gather over ``p`` ranks as a :class:`Phase` (:func:`ring_allgather_seconds`): the
    link engine reads each rank's block from the phase's sizes (padded: all the largest)."""
    m = np.full(p, float(nbytes)) if sizes is None else np.asarray(sizes, dtype=float)
    if padded:
        m = np.full(p, float(m.max()))
    return Phase(plans.ring_allgather(p), 0.0, m, ring_allgather_seconds(nbytes, p, link, sizes, padded), link)


class Ring(Topology):
    """Ring collectives (Patarasuk & Yuan 2009): all-reduce = reduce-scatter + all-gather, each
    p−1 steps of n/p bytes to the next rank; the all-to-all by pairwise exchange, p−1 steps of
    n/p bytes to rank r+i."""

    name = "ring"
    kinds = KINDS

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        self.check(kind)
        p = self.nodes
        if kind == "allgather":
            return ring_allgather_phase(nbytes, p, link, sizes, padded)
        if kind == "reduce_scatter":
            return Phase(plans.ring_reduce_scatter(p), nbytes, None, ring_seconds(kind, nbytes, p, link), link)
        if kind == "alltoall":
            return Phase(plans.pairwise_alltoall(p), nbytes, None, ring_seconds(kind, nbytes, p, link), link)
        seconds = 0.0 if p <= 1 else ring_seconds(kind, nbytes, p, link)
        return Phase(plans.ring_allreduce(p), nbytes, None, seconds, link)

    def dense_messages(self) -> int:
        p = self.workers
        return 2 * (p - 1) * p


class HalvingDoubling(Topology):
    """Rabenseifner's all-reduce: recursive halving (reduce-scatter), then recursive doubling
    (all-gather); ranks beyond the largest power of two fold in first and out last."""

    name = "halving-doubling"

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        self.check(kind)
        p, B, alpha = self.nodes, link.bandwidth_Bps, link.latency_s
        seconds = 0.0
        if p > 1:
            q = 1 << (p.bit_length() - 1)
            fold = 2 * (alpha + nbytes / B) if q < p else 0.0
            seconds = fold + 2 * math.log2(q) * alpha + 2 * (q - 1) / q * nbytes / B
        return Phase(plans.halving_doubling_allreduce(p), nbytes, None, seconds, link)

    def dense_messages(self) -> int:
        p = self.workers
        q = 1 << (p.bit_length() - 1)
        return 2 * (q.bit_length() - 1) * q + 2 * (p - q)


class Tree(Topology):
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: 2⌈log2 p⌉ rounds of n bytes."""

    name = "tree"

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        self.check(kind)
        p = self.nodes
        seconds = 0.0 if p <= 1 else 2 * (p - 1).bit_length() * (link.latency_s + nbytes / link.bandwidth_Bps)
        return Phase(plans.tree_allreduce(p), nbytes, None, seconds, link)

    def dense_messages(self) -> int:
        return 2 * max(self.workers - 1, 0)


class ParameterServer(Topology):
    """A parameter server: sharded over the workers (``servers`` = 0) or on ``servers`` dedicated
    ranks; every worker pushes its gradient's shards and pulls the reduced ones back. Sparse:
    pushes carry each worker's compressed message (``sizes``), pulls the aggregated buffer."""

    name = "ps"
    takes_servers = True
    dense_label = "ps push/pull"
    sparse_label = "ps push/pull"

    def calibration_op(self, kind: str) -> str:
        return "ps"

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        self.check(kind)
        p, s, B, alpha = self.nodes, self.servers, link.bandwidth_Bps, link.latency_s
        m = None if sizes is None else np.asarray(sizes, dtype=float)
        if s:
            bottleneck = max(nbytes / B, p * nbytes / (s * B))
            if m is None:
                seconds = 2 * alpha + 2 * bottleneck
            else:
                seconds = 2 * alpha + max(float(m.max()), float(m.sum()) / s) / B + bottleneck
            return Phase(plans.ps_dedicated(p, s, m is not None), nbytes, m, seconds, link)
        if p <= 1:
            seconds = 0.0
        elif m is None:
            seconds = 2 * alpha + 2 * (p - 1) / p * nbytes / B
        else:
            push = max(float(m.max()) * (p - 1) / p, float((m.sum() - m.min()) / p)) / B
            seconds = 2 * alpha + push + (p - 1) / p * nbytes / B
        return Phase(plans.ps_sharded(p, m is not None), nbytes, m, seconds, link)

    def sparse_phases(self, dense: float, wire: np.ndarray, link: Level, padded: bool,
                      counts: bool = True) -> list[Phase]:
        """Push every worker's message, pull the aggregate (at most the dense bucket): no counts."""
        return [self.collective("allreduce", min(float(wire.sum()), dense), link, wire)]

    def sparse_decompress_s(self, decompress_s: Callable[[float], float], numel: float, shard: float) -> float:
        """A server's share of every worker's message, then the pulled aggregate."""
        servers = self.servers or self.workers
        return self.workers * decompress_s(numel / servers) + decompress_s(numel)

    def messages(self, sparse: bool = False, padded: bool = True, counts: bool = True) -> int:
        p, s = self.workers, self.servers
        return 2 * s * p if s else 2 * (p - 1) * p

    def recurrence_cells(self, sparse: bool, padded: bool) -> int:
        return self.workers


class Hierarchical(Topology):
    """Two levels: ``gpus`` GPUs per node on intra-node links, one NIC per node. All-reduce:
    intra-node ring reduce-scatter, inter-node ring all-reduce of n/g per GPU (the g rails share
    the NIC: one aggregated message per node), intra-node ring all-gather. Reduce-scatter and
    all-gather are its two halves (intra then inter, inter then intra); the all-to-all is ZeRO++'s
    two hops (the module docstring): pairwise exchange among a node's GPUs, then among the nodes
    of n/g per GPU."""

    name = "hierarchical"
    kinds = KINDS
    levels = 2
    dense_label = "hier. all-reduce"
    sparse_label = "hier. all-gather"

    def _intra_s(self, rounds: int, nbytes: float) -> float:
        """``rounds`` intra-node rings (or pairwise exchanges) of g−1 steps of ``nbytes``/g bytes each (s)."""
        g, intra = self.gpus, self.intra
        if g <= 1 or intra is None:
            return 0.0
        return rounds * (g - 1) * (intra.latency_s + nbytes / (g * intra.bandwidth_Bps))

    def _intra_plan(self, rounds: int) -> plans.Plan:
        g = self.gpus
        if g <= 1:
            return plans.EMPTY
        return plans.ring_steps(g, rounds * (g - 1), 1.0 / g, "intra", np.arange(self.nodes * g))

    def _inter_plan(self, rounds: int) -> plans.Plan:
        n = self.nodes
        return plans.ring_steps(n, rounds * (n - 1), 1.0 / n, "inter") if n > 1 else plans.EMPTY

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        self.check(kind)
        N = self.nodes
        if kind == "allreduce":
            seconds = self._intra_s(2, nbytes) + ring_seconds("allreduce", nbytes, N, link)
            return Phase(plans.hierarchical_allreduce(N, self.gpus, False), nbytes, None, seconds, link)
        if kind == "reduce_scatter":
            seconds = self._intra_s(1, nbytes) + ring_seconds("reduce_scatter", nbytes, N, link)
            return Phase(self._intra_plan(1) + self._inter_plan(1), nbytes, None, seconds, link)
        if kind == "alltoall":
            g = self.gpus
            intra = plans.pairwise_steps(g, 1.0 / g, "intra", np.arange(N * g))
            plan = intra + plans.pairwise_steps(N, 1.0 / N, "inter")
            seconds = self._intra_s(1, nbytes) + ring_seconds("alltoall", nbytes, N, link)
            return Phase(plan, nbytes, None, seconds, link)
        if sizes is not None:
            raise ValueError("the hierarchical all-gather takes one block size for every GPU (nbytes), not sizes")
        output = self.workers * float(nbytes)
        seconds = ring_seconds("allgather", output, N, link) + self._intra_s(1, output)
        return Phase(self._inter_plan(1) + self._intra_plan(1), output, None, seconds, link)

    def sparse_phases(self, dense: float, wire: np.ndarray, link: Level, padded: bool,
                      counts: bool = True) -> list[Phase]:
        """Intra-node reduce-scatter of the dense bucket, inter-node ring all-gather of each
        node's compressed shards (the sum over its GPUs), intra-node all-gather (no counts)."""
        p, g = self.nodes, self.gpus
        node = wire.reshape(p, g).sum(axis=1)
        if padded:
            node = np.full(p, float(node.max()))
        inter = ring_allgather_seconds(0.0, p, link, node, padded)
        return [Phase(plans.hierarchical_allreduce(p, g, True), dense, node, self._intra_s(2, dense) + inter, link)]

    def sparse_decompress_s(self, decompress_s: Callable[[float], float], numel: float, shard: float) -> float:
        """Every node's message of its GPU's shard."""
        return self.nodes * decompress_s(shard)

    def messages(self, sparse: bool = False, padded: bool = True, counts: bool = True) -> int:
        n, g = self.nodes, self.gpus
        intra = 2 * (g - 1) * n * g if g > 1 else 0
        return intra + (n - 1) * n * (1 if sparse else 2)


def _ring_blocks(p: int, rounds: int, mcoef: float, level: str, ranks: np.ndarray) -> plans.Plan:
    """``rounds`` ring steps (r → r+1) among each consecutive group of ``p`` of ``ranks`` carrying
    ``mcoef`` blocks of the phase's (padded) block size ``m`` each (bytes: ``mcoef·m``)."""
    if p <= 1 or rounds <= 0 or mcoef <= 0:
        return plans.EMPTY
    src = np.asarray(ranks).reshape(-1, p)
    dst = np.roll(src, -1, axis=1)
    return plans.repeat(plans.step(src.ravel(), dst.ravel(), 0.0, mcoef, level=level, serial=False), rounds)


class Sites(Topology):
    """``sites`` sites of ``nodes/sites`` nodes each, every site a ring (one GPU per node) or a
    hierarchical (``gpus`` per node) cluster on its own fabric, the sites joined by one WAN link
    per site and direction (``wan``: bandwidth in bytes/s, ``latency_s`` the one-way delay, half
    the round trip). Collectives across sites are hierarchical, one aggregated flow per site:

    - all-reduce of n bytes: inside every site a reduce-scatter (intra-node, then inter-node ring
      over the site's N_s nodes), a ring all-reduce of the site's n bytes across the S sites on
      the WAN (2(S−1) dependent rounds, each paying the WAN's one-way delay), then the site's
      all-gather: ``2(g−1)(α_i + n/(g·B_i)) + 2(N_s−1)(α + n/(N_s·B)) + 2(S−1)(α_w + n/(S·B_w))``;
    - sparse messages (padded to the largest unit message M: a rank's, or a node's sum over its
      GPUs with ``gpus`` > 1): inside every site a ring all-gather of the units' messages, a ring
      all-gather of the site bundles (N_s·M) across the sites, and the bundles received, striped
      over the site's units, all-gathered inside the site:
      ``(N_s−1)(α + M/B) + (S−1)(α_w + N_s·M/B_w) + (N_s−1)(α + (S−1)·M/B)``, after the counts
      (M = ``COUNT_BYTES`` per rank) the same way when padded; with ``gpus`` > 1 the dense bucket
      is reduce-scattered inside the node first and all-gathered there last, as
      :class:`Hierarchical` does.

    Every dependent round pays its level's latency, so PowerSGD's sequential all-reduces and a
    sparse all-gather's count exchange each pay the WAN's delay.
    """

    name = "sites"
    inner: ClassVar[tuple[str, ...]] = ("ring", "hierarchical")
    """The topologies a site may have (those whose all-reduce splits into reduce-scatter and all-gather)."""

    def __init__(self, nodes: int, *, sites: int, wan: Level, gpus: int = 1, intra: Level | None = None,
                 inside: str = "ring") -> None:
        check_sites(nodes, sites, inside)
        super().__init__(nodes, gpus=gpus, intra=intra)
        self.sites = sites
        self.wan = wan
        self.site = get(inside)(nodes // sites, gpus=gpus, intra=intra)
        self.whole = get(inside)(nodes, gpus=gpus, intra=intra)
        self.levels = self.site.levels
        self.dense_label = f"{self.site.dense_label} across sites"
        self.sparse_label = f"{self.site.sparse_label} across sites"

    @property
    def unit_level(self) -> str:
        """The level a site's ring runs on: ``flat`` between ranks (one GPU per node), ``inter``
        between nodes (``gpus`` > 1)."""
        return "inter" if self.gpus > 1 else "flat"

    def _intra(self, nbytes: float) -> tuple[plans.Plan, float]:
        """One intra-node ring round (reduce-scatter or all-gather) of ``nbytes``: plan and seconds."""
        g, intra = self.gpus, self.intra
        if g <= 1 or intra is None:
            return plans.EMPTY, 0.0
        seconds = (g - 1) * (intra.latency_s + nbytes / (g * intra.bandwidth_Bps))
        return plans.ring_steps(g, g - 1, 1.0 / g, "intra", np.arange(self.workers)), seconds

    def collective(self, kind: str, nbytes: float, link: Level, sizes: np.ndarray | None = None,
                   padded: bool = True) -> Phase:
        self.check(kind)
        n_s, S = self.nodes // self.sites, self.sites
        units = np.arange(self.nodes)
        site_ring = plans.ring_steps(n_s, n_s - 1, 1.0 / n_s, self.unit_level, units) if n_s > 1 else plans.EMPTY
        wan = plans.ring_steps(S, 2 * (S - 1), 1.0 / S, "wan")
        intra_plan, intra_s = self._intra(nbytes)
        plan = intra_plan + site_ring + wan + site_ring + intra_plan
        seconds = (2 * intra_s + 2 * ring_seconds("reduce_scatter", nbytes, n_s, link)
                   + ring_seconds("allreduce", nbytes, S, self.wan))
        return Phase(plan, nbytes, None, seconds, link)

    def _bundle_phase(self, dense: float, unit: float, link: Level, intra: bool) -> Phase:
        """The sparse exchange of units' messages of ``unit`` bytes each (padded), with the
        intra-node reduce-scatter and all-gather of the ``dense`` bucket around it when ``intra``."""
        n_s, S = self.nodes // self.sites, self.sites
        units = np.arange(self.nodes)
        level = self.unit_level
        plan = (_ring_blocks(n_s, n_s - 1, 1.0, level, units) + _ring_blocks(S, S - 1, float(n_s), "wan", np.arange(S))
                + _ring_blocks(n_s, n_s - 1, float(S - 1), level, units))
        seconds = ((n_s - 1) * (link.latency_s + unit / link.bandwidth_Bps)
                   + (S - 1) * (self.wan.latency_s + n_s * unit / self.wan.bandwidth_Bps)
                   + (n_s - 1) * (link.latency_s + (S - 1) * unit / link.bandwidth_Bps))
        if intra:
            intra_plan, intra_s = self._intra(dense)
            plan, seconds = intra_plan + plan + intra_plan, seconds + 2 * intra_s
        return Phase(plan, dense if intra else 0.0, np.full(self.nodes, float(unit)), seconds, link)

    def sparse_phases(self, dense: float, wire: np.ndarray, link: Level, padded: bool,
                      counts: bool = True) -> list[Phase]:
        """The counts (when ``padded`` and ``counts``), then the messages padded to the largest
        unit's (the class docstring); unpadded, the largest bounds every message (no counts)."""
        g = self.gpus
        unit = float(np.asarray(wire, dtype=float).reshape(self.nodes, g).sum(axis=1).max())
        phases = [self._bundle_phase(dense, float(g * COUNT_BYTES), link, False)] if padded and counts else []
        return [*phases, self._bundle_phase(dense, unit, link, g > 1)]

    def sparse_decompress_s(self, decompress_s: Callable[[float], float], numel: float, shard: float) -> float:
        """What a site's topology would decompress on the whole cluster: every unit's message."""
        return self.whole.sparse_decompress_s(decompress_s, numel, shard)

    def messages(self, sparse: bool = False, padded: bool = True, counts: bool = True) -> int:
        n_s, S, g = self.nodes // self.sites, self.sites, self.gpus
        intra = 2 * (g - 1) * self.workers if g > 1 else 0
        if sparse:
            return (1 + (padded and counts)) * (2 * (n_s - 1) * self.nodes + (S - 1) * S) + intra
        return intra + 2 * (n_s - 1) * self.nodes + 2 * (S - 1) * S


def check_sites(nodes: int, sites: int, inside: str = "ring") -> None:
    """Raise ValueError (one line) unless ``sites`` (≥ 1) divides ``nodes`` evenly and each site's
    topology ``inside`` is one a site may have (:attr:`Sites.inner`) when there is more than one."""
    check_count(sites, "sites")
    if sites > nodes:
        raise ValueError(f"{sites} sites need at least {sites} nodes, got {nodes}")
    if nodes % sites:
        raise ValueError(f"{nodes} nodes do not split evenly across {sites} sites")
    if sites > 1 and inside not in Sites.inner:
        raise ValueError(f"sites need a {' or '.join(Sites.inner)} topology inside each site, got {inside}")


REGISTRY: dict[str, type[Topology]] = {cls.name: cls for cls in (Ring, HalvingDoubling, Tree, ParameterServer,
                                                                  Hierarchical)}
"""The topologies by name, in the order the command line offers them."""

NAMES = tuple(REGISTRY)


def get(name: str) -> type[Topology]:
    """The topology class called ``name``; ValueError listing the known names otherwise."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown topology {name!r}; choose from {', '.join(NAMES)}")
    return REGISTRY[name]
