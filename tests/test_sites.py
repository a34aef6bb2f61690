"""Sites joined by a WAN: the two-level all-reduce and sparse exchange across sites by hand, the
link-level model against the closed forms, the RTT paid by every dependent round, and the splits
refused."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressors.messages.wire import COUNT_BYTES
from costs import CompressionCost, CompressionProfile
from simulator import Layer, Scenario, Workload, simulate
from simulator.iteration import prepare
from simulator.links import Fabric, Level
from simulator.topologies import Sites, check_sites

# Hand-computed: B = 1 GB/s (1 ns a byte), α = 10 µs inside a site; the WAN 100 MB/s (10 ns a
# byte) with a 20 ms round trip (α_w = 10 ms one way); n = 1 MB.
LINK, WAN, INTRA = Level(1e9, 10e-6), Level(100e6, 10e-3), Level(10e9, 1e-6)


def test_all_reduce_across_two_sites_of_two_nodes_by_hand():
    # inside each site (2 nodes): reduce-scatter 1·(10 µs + 500 µs) = 510 µs, all-gather the same;
    # across the 2 sites: 2·(10 ms + 0.5 MB · 10 ns) = 30 ms; in all 31.02 ms
    topo = Sites(4, sites=2, wan=WAN)
    assert topo.collective("allreduce", 1e6, LINK).analytic_s == pytest.approx(31.02e-3, rel=1e-12)


def test_all_reduce_across_two_sites_of_one_node_of_four_gpus_by_hand():
    # intra-node reduce-scatter 3·(1 µs + 25 µs) = 78 µs, all-gather the same; one node per site:
    # no inter-node round; the WAN's 30 ms: 30.156 ms
    topo = Sites(2, sites=2, wan=WAN, gpus=4, intra=INTRA, inside="hierarchical")
    assert topo.collective("allreduce", 1e6, LINK).analytic_s == pytest.approx(30.156e-3, rel=1e-12)


def test_sparse_exchange_across_sites_by_hand():
    # 4 ranks in 2 sites, messages of 1, 2, 3 and 4 kB padded to M = 4 kB: inside 10 µs + 4 µs,
    # across 10 ms + 2·4 kB · 10 ns = 10.08 ms, the bundle received inside 10 µs + 4 µs: 10.108 ms;
    # the counts first (8 bytes each): 10 µs + 8 ns, 10 ms + 160 ns, 10 µs + 8 ns
    topo = Sites(4, sites=2, wan=WAN)
    counts, messages = topo.sparse_phases(4e6, np.array([1e3, 2e3, 3e3, 4e3]), LINK, padded=True)
    assert COUNT_BYTES == 8
    assert counts.analytic_s == pytest.approx(2 * (10e-6 + 8e-9) + 10e-3 + 160e-9, rel=1e-12)
    assert messages.analytic_s == pytest.approx(10.108e-3, rel=1e-12)
    (unpadded,) = topo.sparse_phases(4e6, np.array([1e3, 2e3, 3e3, 4e3]), LINK, padded=False)
    assert unpadded.analytic_s == messages.analytic_s


def _des(topo: Sites, phases, link: Level) -> float:
    fabric = Fabric(topo.workers, link, gpus=topo.gpus, intra=topo.intra, sites=topo.sites, wan=topo.wan)
    entry = np.zeros(topo.workers)
    for phase in phases:
        entry = fabric.run(phase.plan, phase.nbytes, entry, phase.sizes, link=phase.link)
    return float(entry.max())


@settings(max_examples=40, deadline=None)
@given(sites=st.integers(2, 4), per_site=st.integers(1, 3), gpus=st.integers(1, 4),
       nbytes=st.floats(1e3, 1e8), wan_Bps=st.floats(1e6, 1e10), rtt=st.floats(0.0, 0.2),
       wire=st.lists(st.floats(1.0, 1e6), min_size=1, max_size=4), padded=st.booleans())
def test_the_link_level_model_agrees_with_the_closed_forms(sites, per_site, gpus, nbytes, wan_Bps, rtt, wire, padded):
    wan = Level(wan_Bps, rtt / 2)
    topo = Sites(sites * per_site, sites=sites, wan=wan, gpus=gpus, intra=INTRA,
                 inside="hierarchical" if gpus > 1 else "ring")
    dense = topo.collective("allreduce", nbytes, LINK)
    assert _des(topo, [dense], LINK) == pytest.approx(dense.analytic_s, rel=1e-9)
    sparse = topo.sparse_phases(nbytes, np.resize(np.array(wire), topo.workers), LINK, padded)
    assert _des(topo, sparse, LINK) == pytest.approx(sum(p.analytic_s for p in sparse), rel=1e-9)


WORKLOAD = Workload(tuple(Layer(f"l{i}", 4 * 200 * 100, 0.002, (200, 100)) for i in range(4)), 0.01, 0.002, 8)
PROFILE = CompressionProfile({
    ("topk", 0.01): CompressionCost(1e-4, 1e-9, 1e-4, 1e-9, (0.08,)),
    ("powersgd", 1.0): CompressionCost(1e-4, 1e-9, 1e-4, 1e-9, (0.1,)),
    ("fp16", 1.0): CompressionCost(1e-5, 1e-10, 1e-5, 1e-10, (2.0,)),
    ("int8", 1.0): CompressionCost(1e-5, 1e-10, 1e-5, 1e-10, (1 + 4 / 256,)),
})


def _scenario(compressor: str, fidelity: str = "analytic", **extra) -> Scenario:
    density = None if compressor == "none" else 0.01 if compressor == "topk" else 1.0
    options = {"sites": 2, "wan_bandwidth_bps": 1e9, "wan_rtt_s": 0.03, **extra}
    return Scenario(WORKLOAD, 4, 100e9, 50e-6, compressor, density, topology="hierarchical", gpus_per_node=2,
                    profile=None if compressor == "none" else PROFILE, bucket_mode="layer", fidelity=fidelity,
                    **options)


@pytest.mark.parametrize("compressor", ["none", "fp16", "powersgd", "topk"])
def test_an_iteration_across_sites_agrees_at_both_fidelities(compressor):
    analytic = simulate(_scenario(compressor))
    des = simulate(_scenario(compressor, "des"))
    for key in ("iteration_s", "exposed_comm_s", "comm_s"):
        assert des[key] == pytest.approx(analytic[key], rel=1e-9)
    alone = simulate(_scenario(compressor, sites=1, wan_bandwidth_bps=None, wan_rtt_s=None))
    assert analytic["iteration_s"] > alone["iteration_s"]


@pytest.mark.parametrize("compressor, rounds", [("none", 2), ("fp16", 2), ("powersgd", 4), ("topk", 2)])
def test_the_round_trip_enters_every_dependent_round(compressor, rounds):
    """Per bucket, a dense all-reduce across 2 sites has 2 WAN rounds; PowerSGD's two sequential
    all-reduces (P, then Q) 4; a padded sparse all-gather 1 for the counts and 1 for the messages:
    each pays the one-way delay, half the round trip."""
    slow, fast = prepare(_scenario(compressor)), prepare(_scenario(compressor, wan_rtt_s=0.0))
    for a, b in zip(slow.phases, fast.phases):
        extra = sum(p.analytic_s for p in a) - sum(p.analytic_s for p in b)
        assert extra == pytest.approx(rounds * 0.015, rel=1e-9)


def test_one_site_is_the_topology_alone():
    one = _scenario("topk", sites=1, wan_bandwidth_bps=None, wan_rtt_s=None)
    assert simulate(one) == simulate(replace(one, sites=1))
    assert type(prepare(one).phases[0][0].plan) is type(prepare(_scenario("topk")).phases[0][0].plan)


@pytest.mark.parametrize("nodes, sites, inside, message", [
    (3, 2, "ring", "3 nodes do not split evenly across 2 sites"),
    (2, 4, "ring", "4 sites need at least 4 nodes, got 2"),
    (4, 2, "tree", "sites need a ring or hierarchical topology inside each site, got tree"),
    (4, 0, "ring", "sites"),
])
def test_uneven_splits_are_refused_in_one_line(nodes, sites, inside, message):
    with pytest.raises(ValueError, match=message):
        check_sites(nodes, sites, inside)


def test_sites_need_the_wan():
    with pytest.raises(ValueError, match="2 sites need the WAN between them"):
        _scenario("none", wan_rtt_s=None)
    with pytest.raises(ValueError, match="WAN round-trip time -1"):
        _scenario("none", wan_rtt_s=-1.0)


def test_the_whatif_page_projects_sites_as_sidco_simulate_does(capsys, tmp_path):
    from dashboard import projection
    from results.store import Store
    from sidco.cli import main

    store = tmp_path / "r.sqlite"
    wan = {"sites": "2", "wan_bandwidth": "1Gbit", "wan_rtt": "30ms"}
    controls = projection.parse_controls("layout:gpt2", ["none", "topk"], "0.01", "4", "10Gbit", "50us", "ring", **wan)
    with Store(store) as s:
        page = {row["compressor"]: row for row in projection.project(s, controls, "analytic")}
    for name in ("none", "topk"):
        capsys.readouterr()
        assert main(["simulate", "--layout", "gpt2", "--nodes", "4", "--bandwidth", "10Gbit", "--sites", "2",
                     "--wan-bandwidth", "1Gbit", "--wan-rtt", "30ms", "--compressor", name,
                     *(["--density", "0.01"] if name != "none" else []), "--fidelity", "analytic",
                     "--store", str(store), "--json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        assert all(page[name][key] == cli[key] for key in projection.RESULT_KEYS)
    one = projection.parse_controls("layout:gpt2", ["none"], "0.01", "4", "10Gbit", "50us", "ring", sites="")
    assert one.cluster.options == {}
    for bad, message in (({"sites": "2"}, "--sites 2 needs --wan-bandwidth and --wan-rtt"),
                         ({"sites": "0"}, "--sites must be"), ({**wan, "wan_rtt": "-1"}, "WAN round trip"),
                         ({"wan_rtt": "30ms"}, "give --sites 2 or more")):
        with pytest.raises(projection.ProjectionError, match=message):
            projection.parse_controls("layout:gpt2", ["none"], "0.01", "4", "10Gbit", "50us", "ring", **bad)


def test_the_message_budget_counts_the_plans_across_sites():
    from simulator.limits import estimate

    for sparse, compressor, counts in ((False, "none", True), (True, "topk", True), (True, "int8", False)):
        sc = _scenario(compressor, "des")
        topo = Sites(4, sites=2, wan=WAN, gpus=2, intra=INTRA, inside="hierarchical")
        phases = prepare(sc).phases
        steps = sum(len(step.src) for bucket in phases for phase in bucket for step in phase.plan)
        assert topo.messages(sparse, True, counts) * len(phases) == steps
        _, work = estimate(sc)
        assert work == steps + (len(phases) * topo.messages() if sparse else 0)
