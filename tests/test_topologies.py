"""Topologies as classes: the registry, the sharded collectives' closed forms (by hand and against
the link-level model), message counts read off the step plans, and a new topology as one class."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator import Layer, Scenario, Workload, collective_time, plans, simulate, topologies
from simulator.links import Level
from simulator.topologies import KINDS, REGISTRY, Phase, Topology


def test_the_registry_is_the_command_lines_choice():
    assert simulator.TOPOLOGIES == tuple(REGISTRY) == ("ring", "halving-doubling", "tree", "ps", "hierarchical")
    for name, cls in REGISTRY.items():
        assert cls.name == name and "allreduce" in cls.kinds and set(cls.kinds) <= set(KINDS)
    with pytest.raises(ValueError, match="unknown topology 'star'; choose from ring"):
        topologies.get("star")
    with pytest.raises(ValueError, match="has no allgather"):
        topologies.Tree(4).collective("allgather", 1e6, Level(1e9, 0.0))


# Hand-computed: p = 4 ranks, n = 1 MB, B = 1 GB/s (1 ns a byte), α = 10 µs.
# Ring reduce-scatter: 3 steps of 250 kB: 3·(10 µs + 250 µs) = 780 µs; all-gather of 250 kB blocks
# (1 MB gathered): the same 780 µs; all-reduce 1560 µs.
# Two-level, N = 2 nodes × g = 4 GPUs (P = 8), intra α_i = 1 µs, B_i = 10 GB/s:
# reduce-scatter of n = 1 MB: intra 3·(1 µs + 25 µs) = 78 µs, inter 1·(10 µs + 500 µs) = 510 µs: 588 µs;
# all-gather of 125 kB blocks (1 MB gathered): inter 510 µs then intra 78 µs: 588 µs; all-reduce 1176 µs.
# All-to-all of n = 1 MB a rank, pairwise: 3 rounds of 250 kB on the ring, 780 µs; two-level (ZeRO++'s two
# hops): 3 intra rounds of 1 MB/4 = 250 kB, 3·(1 µs + 25 µs) = 78 µs, then the 250 kB each GPU summed, the
# node's 4 GPUs' as one 1 MB message, half of it to the other node: 1·(10 µs + 500 µs) = 510 µs: 588 µs.
# P = 3 nodes × g = 5 GPUs: intra 4·(1 µs + 200 kB / 10 GB/s = 20 µs) = 84 µs, inter 2·(10 µs + 1 MB/3 at
# 1 GB/s = 333.3 µs) = 686.7 µs: 770.7 µs.
HAND = [
    ("reduce_scatter", "ring", 4, 1e6, {}, 780e-6),
    ("allgather", "ring", 4, 250e3, {}, 780e-6),
    ("allreduce", "ring", 4, 1e6, {}, 1560e-6),
    ("reduce_scatter", "hierarchical", 2, 1e6, {"gpus_per_node": 4}, 588e-6),
    ("allgather", "hierarchical", 2, 125e3, {"gpus_per_node": 4}, 588e-6),
    ("allreduce", "hierarchical", 2, 1e6, {"gpus_per_node": 4}, 1176e-6),
    ("alltoall", "ring", 4, 1e6, {}, 780e-6),
    ("alltoall", "hierarchical", 2, 1e6, {"gpus_per_node": 4}, 588e-6),
    ("alltoall", "hierarchical", 3, 1e6, {"gpus_per_node": 5}, 84e-6 + 2 * (10e-6 + 1e6 / 3 / 1e9)),
]
INTRA = {"intra_bandwidth_bps": 80e9, "intra_latency_s": 1e-6}


@pytest.mark.parametrize("op,alg,p,n,kw,expected", HAND, ids=[f"{h[0]}-{h[1]}" for h in HAND])
@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_sharded_collectives_by_hand(op, alg, p, n, kw, expected, fidelity):
    got = collective_time(op, n, p, 8e9, 10e-6, alg, fidelity, **kw, **INTRA)
    assert got == pytest.approx(expected, rel=1e-9)


def _two_level(op: str, n: float, N: int, g: int, B: float, a: float, Bi: float, ai: float) -> float:
    """The two-level forms, written out: n the full buffer (reduce-scatter) or gathered output."""
    intra = (g - 1) * (ai + n / (g * Bi))
    inter = (N - 1) * (a + n / (N * B))
    return intra + inter


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 9), g=st.integers(1, 8), n=st.floats(0, 1e8), bw=st.sampled_from([1e9, 25e9, 100e9]),
       lat=st.sampled_from([0.0, 5e-6, 5e-5]))
def test_two_level_sharded_collectives_agree_with_closed_form_and_link_model(N, g, n, bw, lat):
    kw = {"gpus_per_node": g, "intra_bandwidth_bps": 1.2e12, "intra_latency_s": 3e-6}
    expected = _two_level("reduce_scatter", n, N, g, bw / 8, lat, 1.2e12 / 8, 3e-6)
    block = n / (N * g)
    for fidelity in ("analytic", "des"):
        rs = collective_time("reduce_scatter", n, N, bw, lat, "hierarchical", fidelity, **kw)
        ag = collective_time("allgather", block, N, bw, lat, "hierarchical", fidelity, **kw)
        ar = collective_time("allreduce", n, N, bw, lat, "hierarchical", fidelity, **kw)
        a2a = collective_time("alltoall", n, N, bw, lat, "hierarchical", fidelity, **kw)
        assert rs == pytest.approx(expected, rel=1e-6, abs=1e-15)
        assert a2a == pytest.approx(expected, rel=1e-6, abs=1e-15)
        assert ag == pytest.approx(expected, rel=1e-6, abs=1e-15)
        assert ar == pytest.approx(rs + ag, rel=1e-6, abs=1e-15)  # all-reduce = reduce-scatter + all-gather


@pytest.mark.parametrize("p", [1, 2, 3, 7, 16])
def test_ring_sharded_collectives_agree_with_link_model(p):
    for n, bw, lat in itertools.product([0.0, 1e3, 4e7], [1e9, 100e9], [0.0, 5e-5]):
        for op, per in (("reduce_scatter", n), ("allgather", n / p), ("alltoall", n)):
            expected = (p - 1) * lat + (p - 1) / p * n / (bw / 8)
            for fidelity in ("analytic", "des"):
                assert collective_time(op, per, p, bw, lat, "ring", fidelity) == pytest.approx(expected, rel=1e-6,
                                                                                            abs=1e-15)


@pytest.mark.parametrize("nodes,gpus", [(1, 1), (1, 4), (4, 1), (3, 5), (2, 8)])
def test_the_all_to_all_sends_each_rank_its_chunk_once(nodes, gpus):
    """Conservation in the step program: on each level every ordered pair of a group exchanges once,
    a GPU sends (g−1)/g of its n bytes inside the node and a node (N−1)/N of the n/g each of its GPUs
    summed, so a GPU's share of the bytes sent is (p−1)/p·n, the reduce-scatter's."""
    topo = topologies.Hierarchical(nodes, gpus=gpus, intra=Level(1e11, 1e-6))
    phase = topo.collective("alltoall", 1.0, Level(1e9, 1e-5))
    sent = {"intra": np.zeros(nodes * gpus), "inter": np.zeros(nodes)}
    pairs = {"intra": [], "inter": []}
    for step in phase.plan:
        np.add.at(sent[step.level], step.src, step.coef)
        pairs[step.level] += list(zip(step.src.tolist(), step.dst.tolist()))
    want_intra = [(a, b) for a in range(nodes * gpus) for b in range(nodes * gpus) if a != b and a // gpus == b // gpus]
    assert sorted(pairs["intra"]) == want_intra
    assert sorted(pairs["inter"]) == [(a, b) for a in range(nodes) for b in range(nodes) if a != b]
    assert np.allclose(sent["intra"], (gpus - 1) / gpus) and np.allclose(sent["inter"], (nodes - 1) / nodes)
    p = nodes * gpus
    assert sent["intra"][0] + sent["inter"][0] / gpus == pytest.approx((p - 1) / p)


def test_hierarchical_all_gather_takes_one_block_size():
    with pytest.raises(ValueError, match="one block size"):
        collective_time("allgather", 0, 2, 1e9, 0.0, "hierarchical", sizes=[1.0, 2.0], gpus_per_node=2)


def _plan_messages(phases: list[Phase]) -> int:
    return sum(len(step.src) for phase in phases for step in phase.plan)


@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize("nodes", [1, 2, 5, 8])
def test_message_counts_are_the_plans(name, nodes):
    """:meth:`Topology.messages` (the ``des`` work limit) counts what the step plans send."""
    gpus = 3 if name == "hierarchical" else 1
    link = Level(1e9, 1e-5)
    for servers in ([0, min(2, nodes)] if name == "ps" else [0]):
        topo = topologies.get(name)(nodes, gpus=gpus, servers=servers, intra=Level(1e11, 1e-6))
        wire = np.linspace(1e3, 2e3, topo.workers)
        assert topo.messages() == _plan_messages([topo.dense_phase(1e6, link)])
        for padded, counts in itertools.product((True, False), repeat=2):
            assert topo.messages(True, padded, counts) == _plan_messages(
                topo.sparse_phases(1e6, wire, link, padded, counts))


class Direct(Topology):
    """A new topology, as docs/extending.md adds one: every rank sends its 1/p shard straight to its
    owner in p−1 permutation rounds (reduce-scatter), then the reduced shards back (all-gather)."""

    name = "direct"

    def collective(self, kind, nbytes, link, sizes=None, padded=True):
        self.check(kind)
        p = self.nodes
        ranks = np.arange(p)
        plan = plans.Plan((2 * (p - 1), lambda i: plans.step(ranks, (ranks + i % (p - 1) + 1) % p, 1.0 / p)))
        seconds = 2 * (p - 1) * (link.latency_s + nbytes / (p * link.bandwidth_Bps))
        return Phase(plan, nbytes, None, seconds, link)

    def dense_messages(self):
        return 2 * (self.nodes - 1) * self.nodes


def test_a_new_topology_is_one_class(monkeypatch):
    monkeypatch.setitem(REGISTRY, "direct", Direct)
    wl = Workload(tuple(Layer(f"l{i}", 2_000_000, 0.002) for i in range(6)), 0.01, 0.002, 16)
    for p in (1, 4, 6):
        ring = simulate(Scenario(wl, p, 10e9, 2e-5))
        for fidelity in ("analytic", "des"):
            direct = simulate(Scenario(wl, p, 10e9, 2e-5, topology="direct", fidelity=fidelity))
            assert direct["iteration_s"] == pytest.approx(ring["iteration_s"], rel=1e-9)
        assert collective_time("allreduce", 1e6, p, 10e9, 2e-5, "direct", "des") == pytest.approx(
            collective_time("allreduce", 1e6, p, 10e9, 2e-5, "ring", "analytic"), rel=1e-9)
