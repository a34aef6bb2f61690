"""Limits: scenarios are bounded by what the model can compute, checked before any allocation;
collective plans never hold p × p arrays; the CLI and the dashboard refuse in one line."""

from __future__ import annotations

import time
import tracemalloc
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import simulator
from sidco.cli import main
from simulator import limits, plans
from simulator.links import Fabric, Level
from units import PLAIN_COUNT_BELOW, format_count, parse_list


@pytest.fixture(scope="module")
def resnet50():
    return simulator.workload_from_layout("resnet50")


def test_a_billion_nodes_is_refused_before_any_allocation(resnet50):
    tracemalloc.start()
    try:
        for fidelity in ("analytic", "des"):
            with pytest.raises(ValueError, match=r"needs ~[\d,.]+ GiB of memory \(limit 1 GiB\): at most [\d,]+ nodes fit"):
                simulator.Scenario(resnet50, 10**9, 10e9, 50e-6, fidelity=fidelity)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_the_largest_node_count_named_in_the_message_fits_and_one_more_does_not(resnet50):
    with pytest.raises(ValueError) as info:
        simulator.Scenario(resnet50, 50_000, 10e9, 50e-6, fidelity="des")
    largest = int(str(info.value).split("at most ")[1].split(" nodes")[0].replace(",", ""))
    assert "messages" in str(info.value) and "--fidelity analytic" in str(info.value)
    simulator.Scenario(resnet50, largest, 10e9, 50e-6, fidelity="des")
    with pytest.raises(ValueError):
        simulator.Scenario(resnet50, largest + 1, 10e9, 50e-6, fidelity="des")
    simulator.Scenario(resnet50, 50_000, 10e9, 50e-6, fidelity="analytic")


def test_des_message_estimate_counts_the_link_engine_messages():
    """The work estimate is exactly the messages the plans send (ring, tree, hd, ps, hierarchical)."""
    cases = [("ring", plans.ring_allreduce(12), {}), ("tree", plans.tree_allreduce(12), {}),
             ("halving-doubling", plans.halving_doubling_allreduce(12), {}),
             ("ps", plans.ps_sharded(12, False), {}), ("ps", plans.ps_dedicated(12, 3, False), {"servers": 3}),
             ("hierarchical", plans.hierarchical_allreduce(12, 4, False), {"gpus": 4})]
    for topology, plan, extra in cases:
        sent = sum(len(step.src) if step.level != "intra" else len(step.src) for step in plan)
        assert limits.collective_messages(topology, 12, **extra) == sent, topology
    gathered = sum(len(step.src) for step in plans.ring_allgather(12))
    assert limits.collective_messages("ring", 12, sparse=True, padded=False) == gathered


def test_plans_hold_one_step_whatever_the_node_count():
    p = 200_000
    tracemalloc.start()
    try:
        plan = plans.ring_allreduce(p)
        assert len(plan) == 2 * (p - 1)
        first, last = plan[0], plan[-1]
        gather = plans.ring_allgather(p)
        step = gather[7]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        plans.ring_allreduce.cache_clear()
        plans.ring_allgather.cache_clear()
    assert first is last
    np.testing.assert_array_equal(step.owner[:3], (np.arange(3) - 7) % p)
    assert peak < 40 * 8 * p  # a few O(p) arrays, not 2(p-1) of them


def test_lazy_plans_give_the_closed_form_times():
    """The link engine over lazy plans still matches the α–β forms (ring, tree, hd, all-gather)."""
    B, a, n = 1.25e9, 5e-5, 8e6
    for p in (5, 8, 13):
        fab = Fabric(p, Level(B, a))
        t = fab.run(plans.ring_allreduce(p), n, np.zeros(p)).max()
        assert t == pytest.approx(2 * (p - 1) * (a + n / (p * B)), rel=1e-9)
        fab = Fabric(p, Level(B, a))
        m = np.full(p, 1e5)
        t = fab.run(plans.ring_allgather(p), 0.0, np.zeros(p), m).max()
        assert t == pytest.approx((p - 1) * (a + 1e5 / B), rel=1e-9)
    for algorithm in ("tree", "halving-doubling"):
        des = simulator.collective_time("allreduce", n, 8, 8 * B, a, algorithm, "des")
        closed = simulator.collective_time("allreduce", n, 8, 8 * B, a, algorithm, "analytic")
        assert des == pytest.approx(closed, rel=1e-9)


def test_analytic_is_linear_in_nodes(resnet50):
    times = {}
    for p in (1024, 16384):
        sc = simulator.Scenario(resnet50, p, 10e9, 50e-6, fidelity="analytic")
        start = time.perf_counter()
        simulator.simulate(sc)
        times[p] = time.perf_counter() - start
    assert times[16384] < 1.0


def test_collective_time_refuses_too_many_ranks():
    with pytest.raises(ValueError, match="GiB of memory"):
        simulator.collective_time("allgather", 1e6, 10**9, 10e9, 1e-5, fidelity="analytic")
    with pytest.raises(ValueError, match="link-level messages"):
        simulator.collective_time("allreduce", 1e6, 100_000, 10e9, 1e-5, fidelity="des")


def test_empty_list_items_are_rejected():
    assert parse_list("4, 8", int) == [4, 8]
    for text in ("4,,8", "4,", ",4", ","):
        with pytest.raises(ValueError):
            parse_list(text, int)


def test_jobs_are_bounded():
    limits.check_jobs(1)
    with pytest.raises(ValueError, match="at most"):
        limits.check_jobs(10**6)


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--layout", "resnet50", "--nodes", "1000000000", "--bandwidth", "10Gbit"], "at most"),
    (["simulate", "--layout", "resnet50", "--nodes", "1000000000", "--bandwidth", "10Gbit", "--fidelity",
      "analytic"], "GiB of memory"),
    (["sweep", "--layout", "resnet50", "--nodes", "4,,8", "--bandwidth", "10Gbit", "--compressors", "none"],
     "empty item"),
    (["sweep", "--layout", "resnet50", "--nodes", "4,100000000", "--bandwidth", "10Gbit", "--compressors", "none"],
     "at most"),
    (["sweep", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10Gbit", "--compressors", "none",
      "--jobs", "100000"], "--jobs"),
    (["sweep", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10Gbit", "--compressors", "none",
      "--chunk-size", "10000000"], "--chunk-size"),
])
def test_cli_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    store = tmp_path / "r.sqlite"
    start = time.perf_counter()
    assert main(argv + ["--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert time.perf_counter() - start < 10
    assert not store.exists() or "scenarios" not in err


def test_dashboard_refuses_and_stays_fast(tmp_path):
    from dashboard import projection
    from results.store import Store

    with Store(tmp_path / "r.sqlite") as store:
        for nodes, fidelity in (("20000", "des"), ("1000000000", "analytic")):
            controls = projection.parse_controls("layout:resnet50", ["none"], "0.01", nodes, "10Gbit", "50us", "ring")
            start = time.perf_counter()
            with pytest.raises(projection.ProjectionError, match="at most"):
                projection.project(store, controls, fidelity)
            assert time.perf_counter() - start < 1.0
        controls = projection.parse_controls("layout:resnet50", ["none"], "0.01", "4000", "10Gbit", "50us", "ring")
        with pytest.raises(projection.ProjectionError, match="limit 5e\\+07"):
            projection.project(store, controls, "des")
        assert projection.project(store, controls, "analytic")[0]["iteration_s"] > 0


def test_dashboard_sweep_form_refuses_beyond_the_limits_before_writing(tmp_path):
    from dashboard import sweep_runner
    from results.store import Store

    spec = sweep_runner.parse_spec("layout:resnet50", ["topk"], "0.01", "4,100000000", "10Gbit", "50us", "ring")
    path = tmp_path / "r.sqlite"
    Store(path).close()
    with pytest.raises(ValueError, match="at most"):
        sweep_runner.run(path, spec)
    with Store(path) as store:
        assert store.query("SELECT COUNT(*) FROM sweeps")[0][0] == 0


def test_emulated_workers_are_bounded(tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    assert main(["emulate", "--no-shaping", "--workers", f"2,{limits.max_jobs() + 1}", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "emulated workers fit" in err
    assert not store.exists()


def test_a_node_count_of_1e308_is_named_as_1e308_not_309_digits(resnet50):
    for nodes in (10**308, int(1e308)):
        with pytest.raises(ValueError) as info:
            simulator.Scenario(resnet50, nodes, 10e9, 50e-6, fidelity="analytic")
        message = str(info.value)
        assert message.startswith("1e308 nodes × ") and len(message) < 200, message[:300]
        assert "e302 GiB of memory" in message


@given(st.one_of(st.integers(min_value=-(10**400), max_value=10**400),
                 st.floats(allow_nan=False, allow_infinity=False)))
def test_a_count_prints_in_full_below_1e15_and_in_exponent_form_above(value):
    text = format_count(value)
    if abs(value) < PLAIN_COUNT_BELOW:
        assert float(text.replace(",", "")) == pytest.approx(round(value), abs=0.5)
    else:
        assert "e" in text and len(text) <= 10
        assert abs(Decimal(text) / Decimal(value) - 1) < Decimal("5e-3")
