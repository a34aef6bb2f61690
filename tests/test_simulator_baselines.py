"""The dense and low-rank baselines in the simulator: fp16/bf16 halve the all-reduce; PowerSGD is
all-reduce(rest), all-reduce(P), compute, all-reduce(Q) per bucket; rank is a scenario axis."""

from __future__ import annotations

import pytest

from simulator import CompressionCost, CompressionProfile, Layer, Scenario, Workload, simulate
from simulator.iteration import lowrank_elements
from simulator.sweep import Grid, SweepContext, run_chunk, scenario_key

BW = 8e9      # bits/s: 1e9 bytes/s, a byte takes 1 ns
LAT = 1e-5
P = 4
RATE = 1e-9   # compress / decompress seconds per element


def ring(nbytes: float) -> float:
    return 2 * (P - 1) * LAT + 2 * (P - 1) / P * nbytes / 1e9


WORKLOAD = Workload((Layer("w", 4 * 1000 * 500, 0.010, (1000, 500)), Layer("b", 4 * 1000, 0.001, (1000,))),
                    forward_s=0.02, optimizer_s=0.005, batch_size=8)
NUMEL = 1000 * 500 + 1000
PROFILE = CompressionProfile({
    (name, 1.0): CompressionCost(0.0, RATE, 0.0, RATE, (wire,)) for name, wire in
    (("fp16", 2.0), ("bf16", 2.0), ("powersgd", 4.0))
})


def scenario(compressor: str, fidelity: str, **extra) -> Scenario:
    return Scenario(WORKLOAD, P, BW, LAT, compressor, None if compressor == "none" else 1.0,
                    profile=None if compressor == "none" else PROFILE, bucket_mode="single", fidelity=fidelity,
                    **extra)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_16_bit_casts_halve_the_all_reduce(fidelity, name):
    compute = 0.02 + 0.011
    none = simulate(scenario("none", fidelity))
    assert none["iteration_s"] == pytest.approx(compute + ring(4 * NUMEL) + 0.005, rel=1e-12)
    r = simulate(scenario(name, fidelity))
    cast = RATE * NUMEL
    # cast on the compute stream, all-reduce of 2 bytes per element, cast back, optimizer
    assert r["iteration_s"] == pytest.approx(compute + cast + ring(2 * NUMEL) + cast + 0.005, rel=1e-12)
    assert r["wire_bytes"] == 2 * NUMEL and r["dense_bytes"] == 4 * NUMEL
    assert r["speedup"] == pytest.approx(none["iteration_s"] / r["iteration_s"])


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
@pytest.mark.parametrize("rank", [1, 4, 16])
def test_powersgd_is_rest_p_compute_q(fidelity, rank):
    r = simulate(scenario("powersgd", fidelity, rank=rank, timeline=True))
    compress = RATE * NUMEL
    rest, p_bytes, q_bytes = 4 * 1000, 4 * 1000 * rank, 4 * 500 * rank
    expected = (0.031 + compress / 2                      # backward, then P = M·Q on the compute stream
                + ring(rest) + ring(p_bytes)              # all-reduce the 1-D bias, then P
                + compress / 2                            # orthogonalise P, Q = Mᵀ·P
                + ring(q_bytes)                           # all-reduce Q
                + RATE * NUMEL                            # P·Qᵀ
                + 0.005)
    assert r["iteration_s"] == pytest.approx(expected, rel=1e-12)
    assert r["wire_bytes"] == rest + p_bytes + q_bytes
    names = [e["name"] for e in r["timeline"] if e["worker"] == 0 and e["stream"] == "comm"]
    assert any("P, Q" in n for n in names)


def test_lowrank_elements_follow_the_layer_shapes_and_pytorch_rule():
    wl = Workload((Layer("conv", 4 * 64 * 27, 0.0, (64, 3, 3, 3)), Layer("bias", 4 * 64, 0.0, (64,)),
                   Layer("tiny", 4 * 100, 0.0, (10, 10)), Layer("flat", 4 * 1000, 0.0)), 0.0, 0.0, 1)
    (bucket,) = wl.buckets("single", 1, 1)
    # conv (64, 27) at rank 4: (64 + 27)·4·2 < 1728 -> P 256, Q 108; tiny (10, 10) is not worth it
    assert lowrank_elements(wl, bucket, 4) == (64 + 100 + 1000, 64 * 4, 27 * 4)
    assert lowrank_elements(wl, bucket, 64) == (64 * 27 + 64 + 100 + 1000, 0, 0)


def test_rank_is_validated():
    with pytest.raises(ValueError, match="rank"):
        scenario("powersgd", "analytic", rank=0)


def test_sweep_runs_powersgd_over_ranks():
    grid = Grid(nodes=(P,), bandwidths_bps=(BW,), latencies_s=(LAT,), compressors=("none", "fp16", "powersgd"),
                densities=(1.0,), ranks=(1, 8))
    points = list(grid.points())
    assert len(grid) == len(points) == 4
    assert [p.get("rank") for p in points] == [None, None, 1, 8]
    assert scenario_key(points[3]).endswith("|powersgd|d=1|r=8")
    rows = run_chunk(SweepContext(WORKLOAD, PROFILE, options={"bucket_mode": "single"}), points)
    by_key = {r["scenario_key"]: r for r in rows}
    low, high = by_key[scenario_key(points[2])], by_key[scenario_key(points[3])]
    assert "rank" not in low and low["iteration_s"] < high["iteration_s"]      # rank 8 sends 8× P and Q
    assert high["iteration_s"] - low["iteration_s"] == pytest.approx(
        ring(4 * 1000 * 8) + ring(4 * 500 * 8) - ring(4 * 1000) - ring(4 * 500), rel=1e-9)
    with pytest.raises(ValueError, match="ranks"):
        Grid(nodes=(P,), bandwidths_bps=(BW,), latencies_s=(LAT,), compressors=("powersgd",), densities=(1.0,),
             ranks=(0,))


def test_cli_rejects_a_bad_rank(capsys, tmp_path):
    from sidco.cli import main

    store = str(tmp_path / "r.sqlite")
    assert main(["simulate", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10Gbit", "--compressor",
                 "powersgd", "--density", "1", "--rank", "0", "--store", store]) == 2
    assert "--rank" in capsys.readouterr().err
    assert main(["sweep", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10Gbit", "--compressors",
                 "powersgd", "--densities", "1", "--rank", "2,x", "--store", store]) == 2
    assert "--rank" in capsys.readouterr().err
