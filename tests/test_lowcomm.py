"""Low-communication strategies across sites: DiLoCo's and Streaming DiLoCo's time per inner step by
hand, the smallest H that hides the link, fragments as whole layers, both fidelities, and the
rows and one-line errors of ``sidco compare``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidco.cli import main
from simulator import Layer, Scenario, Workload
from simulator.lowcomm import Strategy, amortised_s, fragments_of, hiding_sync_every, one_site, project

# Hand-computed: 2 nodes of one GPU in 2 sites (one node per site: the inner step exchanges
# nothing), 4 layers of 1 MB; forward 10 ms, backward 4 × 2 ms, optimizer 2 ms: t_in = 20 ms.
# The WAN 1 Gbit/s (125 MB/s), 30 ms round trip (15 ms one way): the outer all-reduce of the
# 4 MB pseudo-gradient across 2 sites is 2·(15 ms + 2 MB / 125 MB/s) = 2·(15 + 16) ms = 62 ms;
# of a 2 MB fragment 2·(15 + 8) ms = 46 ms.
WORKLOAD = Workload(tuple(Layer(f"l{i}", 1_000_000, 0.002) for i in range(4)), 0.010, 0.002, 8)
SC = Scenario(WORKLOAD, 2, 10e9, 50e-6, sites=2, wan_bandwidth_bps=1e9, wan_rtt_s=0.030)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_diloco_pays_the_outer_all_reduce_once_every_h_steps(fidelity):
    r = project(replace(SC, fidelity=fidelity), Strategy("diloco", 10), None)
    assert r["inner_step_s"] == pytest.approx(0.020, rel=1e-12)
    assert r["outer_exchange_s"] == pytest.approx(0.062, rel=1e-9)
    assert r["iteration_s"] == pytest.approx(0.020 + 0.062 / 10, rel=1e-9)
    assert r["wan_exposed_s"] == pytest.approx(0.0062, rel=1e-9)
    assert r["utilization"] == pytest.approx(0.020 / 0.0262, rel=1e-9)
    assert r["hiding_sync_every"] == 4  # ⌈62 / 20⌉
    assert r["outer_wire_bytes"] == WORKLOAD.nbytes


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_streaming_overlaps_each_fragment_with_the_next_inner_steps(fidelity):
    sc = replace(SC, fidelity=fidelity)
    hidden = project(sc, Strategy("streaming", 10, 2), None)
    assert hidden["fragment_s"] == pytest.approx([0.046, 0.046], rel=1e-9)
    # a window of 10/2 inner steps (100 ms) holds each 46 ms exchange: nothing exposed
    assert hidden["iteration_s"] == pytest.approx(0.020, rel=1e-9) and hidden["utilization"] == pytest.approx(1.0)
    assert hidden["hiding_sync_every"] == 5  # ⌈2 · 46 / 20⌉
    # H = 4: a window of 2 inner steps (40 ms); each fragment waits 6 ms, twice every 4 steps
    exposed = project(sc, Strategy("streaming", 4, 2), None)
    assert exposed["iteration_s"] == pytest.approx(0.020 + 2 * 0.006 / 4, rel=1e-9)
    assert exposed["wan_exposed_s"] == pytest.approx(0.003, rel=1e-9)


def test_the_amortised_forms():
    assert amortised_s(1.0, [3.0], 4, overlapped=False) == pytest.approx(1.75)
    assert amortised_s(1.0, [3.0], 4, overlapped=True) == 1.0
    assert amortised_s(1.0, [3.0, 1.0], 4, overlapped=True) == pytest.approx(1.0 + 1.0 / 4)
    assert hiding_sync_every(1.0, [3.0, 1.0]) == 6
    assert hiding_sync_every(1.0, [2.0]) == 2
    assert hiding_sync_every(0.0, [2.0]) is None


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 10**7), min_size=1, max_size=30), data=st.data())
def test_fragments_are_contiguous_groups_of_whole_layers(sizes, data):
    wl = Workload(tuple(Layer(f"l{i}", n, 0.001) for i, n in enumerate(sizes)), 0.01, 0.001, 4)
    f = data.draw(st.integers(1, len(sizes)))
    parts = fragments_of(wl, f)
    assert len(parts) == f and all(part.layers for part in parts)
    assert [layer.name for part in parts for layer in part.layers] == [layer.name for layer in wl.layers]
    assert all(part.forward_s == part.optimizer_s == part.backward_s == 0 for part in parts)
    if f == 2 and len(sizes) == 2:
        assert [p.nbytes for p in parts] == sizes


def test_bad_strategies_are_refused():
    with pytest.raises(ValueError, match="--fragments 5 is more than the workload's 4 layers"):
        fragments_of(WORKLOAD, 5)
    with pytest.raises(ValueError, match="--sync-every"):
        Strategy("diloco", 0)
    with pytest.raises(ValueError, match="streaming takes --fragments"):
        Strategy("diloco", 10, 2)
    with pytest.raises(ValueError, match="give --sites 2 or more"):
        project(one_site(SC), Strategy("diloco", 10), None)


CLUSTER = ["--layout", "gpt2", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8", "--bandwidth", "100Gbit"]
WAN = ["--sites", "2", "--wan-bandwidth", "1Gbit", "--wan-rtt", "30ms"]


def test_compare_ranks_per_step_and_diloco_rows_together(capsys, tmp_path):
    assert main(["compare", *CLUSTER, *WAN, "--compressors", "none,bf16,topk,sidco-e,diloco", "--densities", "0.01",
                 "--sync-every", "50", "--store", str(tmp_path / "r.sqlite"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in out["rows"]}
    assert {"none", "bf16", "topk@0.01", "sidco-e@0.01", "diloco H=50"} <= set(rows)
    assert all({"utilization", "wan_exposed_s", "sync_every", "fragments", "outer_compressor"} <= set(r)
               for r in out["rows"])
    diloco = rows["diloco H=50"]
    assert diloco["sync_every"] == 50 and diloco["outer_compressor"] == "none"
    assert diloco["iteration_s"] == pytest.approx(diloco["inner_step_s"] + diloco["outer_exchange_s"] / 50)
    assert rows["topk@0.01"]["sync_every"] == 1 and rows["topk@0.01"]["wan_exposed_s"] > 0
    assert [r["rank"] for r in out["rows"]] == list(range(1, len(out["rows"]) + 1))
    assert "loss penalty against synchronous training at equal tokens unmeasured" in out["verdict"]["text"]
    assert rows["diloco H=50"]["loss_penalty"] is None
    assert out["verdict"]["lowcomm"] == ["diloco H=50"]


@pytest.mark.parametrize("extra, message", [
    (["--wan-rtt", "-1"], "--wan-rtt: invalid duration '-1': negative"),
    (["--sync-every", "0"], "--sync-every must be an integer >= 1, got 0"),
    (["--sites", "3"], "3 sites need at least 3 nodes, got 2"),
    (["--fragments", "1000"], "--fragments 1000 is more than the workload's 148 layers"),
])
def test_compare_bad_input_is_one_line(capsys, tmp_path, extra, message):
    assert main(["compare", *CLUSTER, *WAN, "--compressors", "diloco,streaming", *extra,
                 "--store", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.timeout(300)
def test_the_verdict_weighs_a_measured_diloco_penalty(tmp_path, capsys):
    """Where the store holds a DiLoCo run of the trace's configuration at the strategy's H (and a
    synchronous run, whose trace is compared), the verdict states its measured loss penalty."""
    store = str(tmp_path / "s.sqlite")
    common = ["converge", "--workload", "transformer", "--width", "0.125", "--workers", "2", "--batch-size", "2",
              "--iterations", "8", "--eval-every", "4", "--eval-samples", "8", "--data", "synthetic",
              "--threads", "1", "--store", store, "--optimizer", "adamw", "--lr", "3e-3", "--json"]
    assert main([*common, "--compressors", "none"]) == 0
    trace_id = json.loads(capsys.readouterr().out)["trace_id"]
    assert main([*common, "--sync-every", "4", "--no-replay"]) == 0
    diloco_id = json.loads(capsys.readouterr().out)["convergence_id"]
    from results.store import Store

    with Store(store) as s:
        trace = s.trace(trace_id)["path"]
    cluster = ["--trace", trace, "--nodes", "2", "--bandwidth", "10Gbit", "--sites", "2", "--wan-bandwidth",
               "100Mbit", "--wan-rtt", "20ms", "--compressors", "diloco,streaming", "--densities", "0.01",
               "--store", store, "--json"]
    assert main(["compare", *cluster, "--sync-every", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in out["rows"]}
    penalty = rows["diloco H=4"]["loss_penalty"]
    assert penalty["convergence_ids"] == [diloco_id] and penalty["tokens"] == 8 * 2 * 2 * 64
    text = out["verdict"]["text"]
    assert f"measured loss penalty {penalty['penalty']:+.4f} nats" in text
    assert "loss penalty of its fragments unmeasured; DiLoCo's at this H measured" in text
    assert main(["compare", *cluster, "--sync-every", "8"]) == 0  # no run at H = 8
    out = json.loads(capsys.readouterr().out)
    assert all(r.get("loss_penalty") is None for r in out["rows"])
    assert "loss penalty against synchronous training at equal tokens unmeasured" in out["verdict"]["text"]
