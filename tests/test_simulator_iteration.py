"""The iteration model: hand-worked DDP timelines, both fidelities, breakdown, timeline, inputs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator import Calibration, CompressionCost, CompressionProfile, Layer, Scenario, Workload, simulate

MB = 10**6
BW = 8e9  # bits/s = 1e9 bytes/s, so a byte takes 1 ns
LAT = 1e-5


def ring(n: float, p: int, bw_bps: float = BW, a: float = LAT) -> float:
    return 2 * (p - 1) * a + 2 * (p - 1) / p * n / (bw_bps / 8)


def sum_of_parts(r: dict) -> float:
    return sum(r[k] for k in ("forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s", "optimizer_s"))


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_one_bucket_no_overlap(fidelity):
    wl = Workload((Layer("a", 8 * MB, 0.010), Layer("b", 24 * MB, 0.030)), forward_s=0.02, optimizer_s=0.005,
                  batch_size=16)
    sc = Scenario(wl, 4, BW, LAT, bucket_mode="single", fidelity=fidelity, timeline=True)
    r = simulate(sc)
    comm = ring(32 * MB, 4)
    assert r["iteration_s"] == pytest.approx(0.02 + 0.04 + comm + 0.005, rel=1e-9)
    assert r["exposed_comm_s"] == pytest.approx(comm, rel=1e-9)
    assert r["idle_s"] == 0 and r["compress_s"] == 0 and r["speedup"] == 1.0
    assert r["samples_per_s"] == pytest.approx(4 * 16 / r["iteration_s"])
    assert sum_of_parts(r) == pytest.approx(r["iteration_s"], rel=1e-9)
    names = [e["name"] for e in r["timeline"] if e["worker"] == 0]
    assert names == ["forward", "backward b0", "all-reduce b0", "optimizer"]


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_full_overlap_except_the_last_small_bucket(fidelity):
    # parameter order: tiny layer first, big layer last; backward produces the big one first.
    wl = Workload((Layer("small", 400_000, 0.200), Layer("big", 40 * MB, 0.010)), 0.0, 0.0, 8)
    sc = Scenario(wl, 8, BW, LAT, bucket_cap_bytes=MB, first_bucket_bytes=MB, fidelity=fidelity, timeline=True)
    r = simulate(sc)
    big, small = ring(40 * MB, 8), ring(400_000, 8)
    assert big < 0.200  # the big bucket's all-reduce hides behind the small layer's backward
    assert r["iteration_s"] == pytest.approx(0.010 + 0.200 + small, rel=1e-9)
    assert r["exposed_comm_s"] == pytest.approx(small, rel=1e-9)
    comm = [e for e in r["timeline"] if e["worker"] == 3 and e["stream"] == "comm"]
    assert comm[0]["start_s"] == pytest.approx(0.010) and comm[0]["end_s"] == pytest.approx(0.010 + big)
    assert comm[1]["start_s"] == pytest.approx(0.210)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_interference_slows_compute_that_overlaps_a_transfer(fidelity):
    wl = Workload((Layer("small", 400_000, 0.200), Layer("big", 40 * MB, 0.010)), 0.0, 0.0, 8)
    sc = Scenario(wl, 8, BW, LAT, bucket_cap_bytes=MB, first_bucket_bytes=MB, fidelity=fidelity, interference=0.5)
    r = simulate(sc)
    big, small = ring(40 * MB, 8), ring(400_000, 8)
    # the small layer's 200 ms of backward runs 1.5× slower during the big all-reduce: over
    # those `big` seconds it does big/1.5 of work, so it ends big·(1 − 1/1.5) later
    assert r["iteration_s"] == pytest.approx(0.010 + 0.200 + big * (1 - 1 / 1.5) + small, rel=1e-9)
    assert r["backward_s"] == pytest.approx(0.210)
    assert sum_of_parts(r) == pytest.approx(r["iteration_s"], rel=1e-9)


@given(
    sizes=st.lists(st.integers(1, 20_000_000), min_size=1, max_size=10),
    times=st.lists(st.floats(0, 0.05), min_size=10, max_size=10),
    slowdown=st.floats(0, 2),
)
@settings(max_examples=30, deadline=None)
def test_interference_agrees_across_fidelities_and_only_slows(sizes, times, slowdown):
    wl = Workload(tuple(Layer(f"l{i}", s, times[i]) for i, s in enumerate(sizes)), 0.01, 0.001, 4)
    sc = Scenario(wl, 4, BW, LAT, "sidco-e", 0.001, profile=_profile(), bucket_mode="layer", interference=slowdown)
    a = simulate(sc)["iteration_s"]
    assert simulate(replace(sc, fidelity="des"))["iteration_s"] == pytest.approx(a, rel=1e-9, abs=1e-12)
    assert a >= simulate(replace(sc, interference=0.0))["iteration_s"] * (1 - 1e-12)


def test_straggler_delays_everyone_and_shows_as_idle():
    wl = Workload((Layer("a", 10 * MB, 0.040),), forward_s=0.020, optimizer_s=0.010, batch_size=8)
    base = Scenario(wl, 4, BW, LAT, stragglers=1, straggler_slowdown=2.0, fidelity="analytic")
    r = simulate(base)
    comm = ring(10 * MB, 4)
    # the straggler computes 2 × (20 + 40) ms, then everyone all-reduces, the straggler's optimizer takes 20 ms.
    assert r["iteration_s"] == pytest.approx(0.120 + comm + 0.020, rel=1e-9)
    # fast workers wait (0.06 + 0.01) s for it: idle averaged over 4 workers.
    assert r["idle_s"] == pytest.approx(3 * 0.070 / 4, rel=1e-9)
    assert sum_of_parts(r) == pytest.approx(r["iteration_s"], rel=1e-9)
    des = simulate(replace(base, fidelity="des"))
    # link level: fast ranks pre-send their first chunks, so the straggler's collective is no slower.
    assert 0.120 + comm / 2 + 0.020 < des["iteration_s"] <= r["iteration_s"] * (1 + 1e-9)
    assert des["idle_s"] > 0.03


def test_jitter_is_seeded_and_slows_the_iteration():
    wl = Workload(tuple(Layer(f"l{i}", MB, 0.002) for i in range(20)), 0.01, 0.001, 8)
    sc = Scenario(wl, 16, BW, LAT, jitter=0.2, seed=7)
    a, b = simulate(sc), simulate(sc)
    assert a == b
    assert simulate(replace(sc, seed=8))["iteration_s"] != a["iteration_s"]
    assert a["iteration_s"] > simulate(replace(sc, jitter=0.0))["iteration_s"]


def _profile(wire=(0.01, 0.01)) -> CompressionProfile:
    return CompressionProfile(
        {("sidco-e", 0.001): CompressionCost(1e-4, 2e-10, 5e-5, 1e-10, wire),
         ("randomk", 0.001): CompressionCost(1e-4, 1e-10, 5e-5, 1e-10, (0.004, 0.004))},
        "test",
    )


def _workload() -> Workload:
    return Workload(tuple(Layer(f"l{i}", 3 * MB, 0.003 + 0.0001 * i) for i in range(24)), 0.03, 0.004, 32)


@pytest.mark.parametrize("topology", ["ring", "halving-doubling", "tree", "ps", "hierarchical"])
@pytest.mark.parametrize("compressor", ["none", "sidco-e", "randomk"])
def test_fidelities_agree_without_contention(topology, compressor):
    gpus = 2 if topology == "hierarchical" else 1
    sc = Scenario(_workload(), 8, BW, LAT, compressor, None if compressor == "none" else 0.001, topology=topology,
                  profile=None if compressor == "none" else _profile(), gpus_per_node=gpus)
    a = simulate(sc)
    d = simulate(replace(sc, fidelity="des"))
    # in a binomial tree the leaves finish the broadcast early: per-worker exposure differs
    keys = ("iteration_s", "speedup") if topology == "tree" else ("iteration_s", "exposed_comm_s", "compress_s",
                                                                  "idle_s", "speedup")
    for key in keys:
        assert d[key] == pytest.approx(a[key], rel=1e-6, abs=1e-12), key


def test_compression_on_compute_stream_delays_later_layers():
    wl = Workload((Layer("a", 4 * MB, 0.01), Layer("b", 4 * MB, 0.01)), 0.0, 0.0, 1)
    prof = _profile()
    sc = Scenario(wl, 4, BW, LAT, "sidco-e", 0.001, profile=prof, bucket_mode="layer", timeline=True)
    r = simulate(sc)
    comp = prof.cost("sidco-e", 0.001).compress_s(1 * MB)
    events = {e["name"]: e for e in r["timeline"] if e["worker"] == 0}
    assert events["compress b0"]["end_s"] == pytest.approx(0.01 + comp)
    assert events["backward b1"]["end_s"] == pytest.approx(0.02 + comp)
    on_comm = simulate(replace(sc, compress_on="comm"))
    assert on_comm["backward_s"] == r["backward_s"]
    assert on_comm["iteration_s"] < r["iteration_s"]


def test_sparse_allgather_pads_to_the_largest_worker():
    wl = Workload((Layer("a", 40 * MB, 0.01),), 0.0, 0.0, 1)
    uneven = _profile(wire=(0.004, 0.04))
    padded = simulate(Scenario(wl, 4, BW, LAT, "sidco-e", 0.001, profile=uneven, bucket_mode="single"))
    small = simulate(Scenario(wl, 4, BW, LAT, "sidco-e", 0.001, profile=_profile((0.04, 0.04)), bucket_mode="single"))
    assert padded["iteration_s"] == pytest.approx(small["iteration_s"], rel=1e-9)
    unpadded = simulate(Scenario(wl, 4, BW, LAT, "sidco-e", 0.001, profile=uneven, bucket_mode="single", padded=False))
    assert unpadded["iteration_s"] < padded["iteration_s"]


def test_calibration_and_oversubscription_slow_the_links():
    wl = Workload((Layer("a", 20 * MB, 0.001),), 0.0, 0.0, 1)
    sc = Scenario(wl, 4, BW, LAT, bucket_mode="single")
    base = simulate(sc)["exposed_comm_s"]
    calibrated = simulate(replace(sc, calibration=Calibration(2e-5, 1e-9, 0.5)))["exposed_comm_s"]
    assert calibrated == pytest.approx(ring(20 * MB, 4, BW * 0.5, LAT + 2e-5), rel=1e-9)
    assert simulate(replace(sc, oversubscription=2.0))["exposed_comm_s"] == pytest.approx(
        ring(20 * MB, 4, BW / 2, LAT), rel=1e-9)
    assert base == pytest.approx(ring(20 * MB, 4), rel=1e-9)


def test_ddp_buckets_follow_the_cap_rule():
    wl = Workload(tuple(Layer(f"l{i}", 600_000, 0.001) for i in range(100)), 0.0, 0.0, 1)
    buckets = wl.buckets("ddp", cap_bytes=25 * MB, first_bytes=MB)
    assert buckets[0].layers == (99, 98)
    assert all(b.nbytes >= 25 * MB for b in buckets[1:-1])
    assert sorted(i for b in buckets for i in b.layers) == list(range(100))
    assert len(wl.buckets("single")) == 1 and len(wl.buckets("layer")) == 100
    with pytest.raises(ValueError, match="bucket mode"):
        wl.buckets("random")


@given(
    sizes=st.lists(st.integers(1, 20_000_000), min_size=1, max_size=12),
    times=st.lists(st.floats(0, 0.05), min_size=12, max_size=12),
    nodes=st.integers(1, 33),
    jitter=st.floats(0, 0.5),
    mode=st.sampled_from(["ddp", "single", "layer"]),
    fidelity=st.sampled_from(["analytic", "des"]),
)
@settings(max_examples=40, deadline=None)
def test_breakdown_sums_to_the_iteration(sizes, times, nodes, jitter, mode, fidelity):
    wl = Workload(tuple(Layer(f"l{i}", s, times[i]) for i, s in enumerate(sizes)), times[-1], times[-2], 4)
    sc = Scenario(wl, nodes, BW, LAT, "sidco-e", 0.001, profile=_profile(), bucket_mode=mode, jitter=jitter,
                  fidelity=fidelity)
    r = simulate(sc)
    assert min(r[k] for k in ("forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s")) >= 0
    assert sum_of_parts(r) == pytest.approx(r["iteration_s"], rel=1e-6)
    assert r["speedup"] == pytest.approx(r["baseline_iteration_s"] / r["iteration_s"])


def test_timeline_events_and_chrome_trace(tmp_path):
    sc = Scenario(_workload(), 4, BW, LAT, "sidco-e", 0.001, profile=_profile(), fidelity="des", timeline=True)
    events = simulate(sc)["timeline"]
    assert {e["worker"] for e in events} == {0, 1, 2, 3}
    for w in range(4):
        for stream in ("compute", "comm"):
            mine = sorted((e for e in events if e["worker"] == w and e["stream"] == stream), key=lambda e: e["start_s"])
            assert all(a["end_s"] <= b["start_s"] + 1e-12 for a, b in zip(mine, mine[1:]))
    path = simulator.write_chrome_trace(tmp_path / "t.json", events, {"nodes": 4})
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(events) and all(e["dur"] > 0 for e in spans)
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"} == {"compute", "comm"}


def test_profile_from_replay_rows_fits_times_and_keeps_per_worker_k():
    rows = []
    for worker, ratio in ((0, 0.001), (1, 0.002)):
        for numel in (1000, 3000):
            rows.append({"compressor": "topk", "density": 0.001, "error_feedback": 1, "worker": worker,
                         "numel": numel, "compress_s": 1e-4 + 1e-8 * numel, "decompress_s": 2e-9 * numel,
                         "wire_bytes": int(8 * ratio * numel)})
    rows.append(dict(rows[0], error_feedback=0, compress_s=1.0))
    prof = CompressionProfile.from_replay_rows(rows)
    cost = prof.cost("topk", 0.001)
    assert cost.compress_s(10_000) == pytest.approx(1e-4 + 1e-4, rel=1e-6)
    assert cost.decompress_s(10_000) == pytest.approx(2e-5, rel=1e-6)
    assert list(cost.wire_bytes(1e6, 3)) == pytest.approx([8000, 16000, 8000])
    assert CompressionProfile.from_json(prof.to_json()) == prof
    with pytest.raises(ValueError, match="no compression profile for dgc"):
        prof.cost("dgc", 0.001)


def test_profile_measured_on_a_trace_and_workload_from_trace(tmp_path):
    import traces

    trace = traces.synthetic(tmp_path / "t", "laplace", 20_000, workers=2, iterations=2, seed=1,
                             layers=[("w", (100, 150)), ("b", (5000,))],
                             timings={"forward_s": 0.01, "backward_s": [0.004, 0.001], "optimizer_s": 0.002,
                                      "batch_size": 16, "device": "cpu"})
    wl = simulator.workload_from_trace(trace)
    assert wl.compute_cv == 0.0
    assert [(layer.name, layer.nbytes) for layer in wl.layers] == [("w", 60_000), ("b", 20_000)]
    assert (wl.forward_s, wl.backward_s, wl.optimizer_s, wl.batch_size) == (0.01, 0.005, 0.002, 16)
    from traces.replay import replay

    prof = CompressionProfile.from_replay_rows(replay(trace, ["topk", "sidco-e"], [0.01]), source="replay")
    cost = prof.cost("topk", 0.01)
    assert cost.source == "replay"
    assert cost.wire_per_element == pytest.approx((0.08, 0.08))
    assert cost.compress_per_element_s > 0
    r = simulate(Scenario(wl, 8, 1e9, 5e-5, "topk", 0.01, profile=prof))
    assert r["wire_bytes"] == pytest.approx(0.08 * 20_000)


def test_compute_variation_measured_in_the_trace(tmp_path):
    import traces

    passes = [{"iteration": 1, "worker": w, "forward_s": f, "backward_s": b}
              for w, (f, b) in enumerate([(0.010, 0.020), (0.012, 0.024), (0.011, 0.019)])]
    trace = traces.synthetic(tmp_path / "t", "laplace", 1000, workers=3, iterations=1, seed=1,
                             timings={"forward_s": 0.011, "backward_s": [0.021], "optimizer_s": 0.0,
                                      "batch_size": 4, "device": "cpu", "passes": 3, "per_pass": passes})
    totals = np.array([0.030, 0.036, 0.030])
    assert simulator.workload_from_trace(trace).compute_cv == pytest.approx(totals.std(ddof=1) / totals.mean())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"nodes": 0}, "nodes"),
        ({"bandwidth_bps": 0.0}, "bandwidth"),
        ({"latency_s": -1e-6}, "latency"),
        ({"topology": "mesh"}, "topology"),
        ({"fidelity": "exact"}, "fidelity"),
        ({"compressor": "topk", "density": 0.01}, "profile"),
        ({"gpus_per_node": 4}, "hierarchical"),
        ({"oversubscription": 0.5}, "oversubscription"),
        ({"stragglers": 9}, "stragglers"),
    ],
)
def test_bad_scenarios_name_the_problem(kwargs, message):
    base = {"workload": _workload(), "nodes": 8, "bandwidth_bps": BW, "latency_s": LAT}
    with pytest.raises(ValueError, match=message):
        Scenario(**{**base, **kwargs})


def test_des_64_nodes_50_buckets_and_1024_nodes_run():
    wl = Workload(tuple(Layer(f"l{i}", MB, 0.001) for i in range(50)), 0.01, 0.001, 8)
    r = simulate(Scenario(wl, 64, BW, LAT, bucket_mode="layer", fidelity="des"))
    assert r["buckets"] == 50
    big = simulate(Scenario(Workload((Layer("a", 4 * MB, 0.001),), 0, 0, 1), 1024, BW, LAT, fidelity="des"))
    assert big["exposed_comm_s"] == pytest.approx(ring(4 * MB, 1024), rel=1e-6)
    assert np.isfinite(big["samples_per_s"])
