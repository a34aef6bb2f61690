"""Collectives: both fidelities against closed forms written out here, over a grid."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import collective_time

NODES = [1, 2, 3, 4, 5, 8, 16, 64]
SIZES = [0.0, 1e3, 1e6, 3.3e7]
BANDWIDTHS = [1e9, 10e9, 100e9]  # bits/s
LATENCIES = [0.0, 5e-6, 50e-6]  # s
GRID = list(itertools.product(NODES, SIZES, BANDWIDTHS, LATENCIES))


def closed_form(op: str, alg: str, n: float, p: int, bw_bps: float, a: float, **kw) -> float:
    """The formulas of docs/model.md, restated independently of simulator.collectives."""
    B = bw_bps / 8
    if p == 1 and alg != "hierarchical":
        return 0.0
    if (op, alg) == ("allreduce", "ring"):
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n / B
    if (op, alg) == ("allreduce", "halving-doubling"):
        q = 2 ** int(math.floor(math.log2(p)))
        extra = 2 * (a + n / B) if q != p else 0.0
        return extra + 2 * math.log2(q) * a + 2 * (q - 1) / q * n / B
    if (op, alg) == ("allreduce", "tree"):
        return 2 * math.ceil(math.log2(p)) * (a + n / B)
    if (op, alg) == ("reduce_scatter", "ring"):
        return (p - 1) * a + (p - 1) / p * n / B
    if (op, alg) == ("allgather", "ring"):
        return (p - 1) * a + (p - 1) * n / B
    if (op, alg) == ("ps", "sharded"):
        return 2 * a + 2 * (p - 1) / p * n / B
    if (op, alg) == ("ps", "dedicated"):
        s = kw["servers"]
        return 2 * a + 2 * max(n / B, p * n / (s * B))
    if (op, alg) == ("allreduce", "hierarchical"):
        g, Bi, ai = kw["gpus_per_node"], kw["intra_bandwidth_bps"] / 8, kw["intra_latency_s"]
        intra = 2 * (g - 1) * ai + 2 * (g - 1) / g * n / Bi
        return intra + (2 * (p - 1) * a + 2 * (p - 1) / p * n / B if p > 1 else 0.0)
    raise AssertionError(op)


CASES = [
    ("allreduce", "ring", {}),
    ("allreduce", "halving-doubling", {}),
    ("allreduce", "tree", {}),
    ("reduce_scatter", "ring", {}),
    ("allgather", "ring", {}),
    ("ps", "sharded", {}),
    ("allreduce", "hierarchical", {"gpus_per_node": 4, "intra_bandwidth_bps": 1.2e12, "intra_latency_s": 3e-6}),
]


@pytest.mark.parametrize("op,alg,kw", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_both_fidelities_match_closed_form(op, alg, kw):
    worst = 0.0
    for p, n, bw, lat in GRID:
        if alg == "tree" and p & (p - 1):
            continue
        expected = closed_form(op, alg, n, p, bw, lat, **kw)
        for fidelity in ("analytic", "des"):
            got = collective_time(op, n, p, bw, lat, algorithm=alg, fidelity=fidelity, **kw)
            if expected == 0:
                assert got == 0
            else:
                worst = max(worst, abs(got - expected) / expected)
    assert worst < 1e-6


@pytest.mark.parametrize("p,servers", [(2, 1), (4, 2), (8, 2), (8, 8), (16, 4)])
def test_dedicated_parameter_servers(p, servers):
    for n, bw, lat in itertools.product([1e5, 4e7], [1e9, 25e9], [0.0, 5e-5]):
        expected = closed_form("ps", "dedicated", n, p, bw, lat, servers=servers)
        for fidelity in ("analytic", "des"):
            got = collective_time("ps", n, p, bw, lat, "dedicated", fidelity, servers=servers)
            assert got == pytest.approx(expected, rel=1e-6)


def test_tree_is_an_upper_bound_off_powers_of_two():
    for p in (3, 5, 6, 7, 12):
        des = collective_time("allreduce", 1e6, p, 1e10, 5e-5, "tree", "des")
        assert 0 < des <= closed_form("allreduce", "tree", 1e6, p, 1e10, 5e-5) * (1 + 1e-9)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=24),
    bw=st.sampled_from(BANDWIDTHS),
    lat=st.sampled_from(LATENCIES),
)
@settings(max_examples=60, deadline=None)
def test_uneven_allgather_des_matches_recurrence_and_bounds(sizes, bw, lat):
    p = len(sizes)
    m = np.asarray(sizes, dtype=float)
    des = collective_time("allgather", 0, p, bw, lat, "ring", "des", sizes=m, padded=False)
    analytic = collective_time("allgather", 0, p, bw, lat, "ring", "analytic", sizes=m, padded=False)
    assert des == pytest.approx(analytic, rel=1e-9, abs=1e-15)
    if p > 1:
        bound = (p - 1) * lat + max(m.sum() - m[j] for j in range(p)) / (bw / 8)
        padded = collective_time("allgather", 0, p, bw, lat, "ring", "des", sizes=m, padded=True)
        assert bound * (1 - 1e-9) <= des <= padded * (1 + 1e-9)
        assert padded == pytest.approx((p - 1) * (lat + m.max() / (bw / 8)), rel=1e-9, abs=1e-15)


@given(
    p=st.integers(min_value=1, max_value=40),
    n=st.floats(min_value=0, max_value=1e9),
    bw=st.floats(min_value=1e6, max_value=1e12),
    lat=st.floats(min_value=0, max_value=1e-3),
)
@settings(max_examples=60, deadline=None)
def test_ring_allreduce_agrees_everywhere(p, n, bw, lat):
    des = collective_time("allreduce", n, p, bw, lat, "ring", "des")
    assert des == pytest.approx(closed_form("allreduce", "ring", n, p, bw, lat), rel=1e-6, abs=1e-12)


@pytest.mark.parametrize(
    "args,message",
    [
        (("allreduce", 1e6, 0, 1e9, 1e-6), "nodes"),
        (("allreduce", 1e6, 4, 0.0, 1e-6), "bandwidth"),
        (("allreduce", 1e6, 4, -1e9, 1e-6), "bandwidth"),
        (("allreduce", 1e6, 4, 1e9, -1.0), "latency"),
        (("broadcast", 1e6, 4, 1e9, 1e-6), "op"),
        (("allreduce", -5, 4, 1e9, 1e-6), "nbytes"),
    ],
)
def test_bad_arguments_name_the_problem(args, message):
    with pytest.raises(ValueError, match=message):
        collective_time(*args)
    with pytest.raises(ValueError, match="algorithm"):
        collective_time("allgather", 1e6, 4, 1e9, 1e-6, algorithm="tree")


def test_des_scales_to_1024_nodes():
    t = collective_time("allreduce", 1e8, 1024, 1e10, 1e-5, "ring", "des")
    assert t == pytest.approx(closed_form("allreduce", "ring", 1e8, 1024, 1e10, 1e-5), rel=1e-6)


def test_ring_terms_are_the_closed_form_coefficients():
    from simulator.collectives import ring_terms

    assert ring_terms("allreduce", 4) == (6, pytest.approx(1.5))
    assert ring_terms("reduce_scatter", 4) == (3, pytest.approx(0.75))
    assert ring_terms("allgather", 2) == (1, pytest.approx(0.5))
    assert ring_terms("allreduce", 1) == (0, 0.0)
    with pytest.raises(ValueError, match="unknown ring collective"):
        ring_terms("broadcast", 2)
    with pytest.raises(ValueError, match="ranks"):
        ring_terms("allreduce", 0)


@pytest.mark.parametrize("op", ["allreduce", "allgather"])
def test_calibration_model_is_the_simulators_ring(op):
    """The emulation's fit (steps·α + volume·n·8/(e·B)) and the simulator's ring collective with
    α as latency and e·B as the link give the same time: one α–β form, two users."""
    from emulation.calibration import fit

    alpha, efficiency = 2e-4, 0.8
    rows = []
    for p, n, bw in itertools.product((2, 3, 4, 8), (64e3, 1e6), (50e6, 1e9)):
        per_rank = n if op == "allreduce" else n / p  # the emulation's all-gather n is the gathered output
        seconds = collective_time(op, per_rank, p, efficiency * bw, alpha, "ring", "analytic")
        rows.append({"op": op, "workers": p, "nbytes": n, "bandwidth_bps": bw, "seconds": seconds})
    result = fit(rows)
    assert result.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert result.efficiency == pytest.approx(efficiency, rel=1e-9)
    assert result.max_abs_error_pct < 1e-7
