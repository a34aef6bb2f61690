"""Per-operation calibration: the fit recovers each operation's α and efficiency, the store keeps
them, and the collective and iteration models apply each operation's own constants."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.collectives import ring_terms
from emulation.calibration import fit, fit_per_op
from pipeline import project
from results.store import Store
from sidco.cli import main
from simulator import Calibration, CompressionCost, CompressionProfile, Layer, Scenario, Workload, simulate
from simulator.calibration import OpFit

MB = 10**6
AR = OpFit(alpha_s=3e-4, efficiency=0.9)
AG = OpFit(alpha_s=1e-3, efficiency=0.6)
CAL = Calibration(5e-4, 8e-8, 0.8, {"allreduce": AR, "allgather": AG})


def collective_seconds(op: str, nbytes: float, workers: int, bandwidth_bps: float, alpha_s: float = 0.0,
                       efficiency: float = 1.0) -> float:
    """Ring α–β time (s) of ``op`` on ``nbytes`` bytes over a link of ``bandwidth_bps`` bits/s."""
    steps, volume = ring_terms(op, workers)
    return steps * alpha_s + volume * nbytes * 8.0 / (bandwidth_bps * efficiency)


def _measurements(truth: dict[str, OpFit], bandwidths=(20e6, 100e6), sizes=(65536, 1 << 20, 1 << 24), noise=None):
    rows = []
    for op, f in truth.items():
        for b in bandwidths:
            for i, n in enumerate(sizes):
                t = collective_seconds(op, n, 2, b, f.alpha_s, f.efficiency)
                if noise is not None:
                    t *= 1 + noise[i % len(noise)]
                rows.append({"op": op, "workers": 2, "nbytes": n, "bandwidth_bps": b, "seconds": t})
    return rows


@settings(max_examples=30, deadline=None)
@given(alpha_ar=st.floats(0, 2e-3), eff_ar=st.floats(0.3, 1.2), alpha_ag=st.floats(0, 2e-3), eff_ag=st.floats(0.3, 1.2))
def test_fit_per_op_recovers_each_operations_constants(alpha_ar, eff_ar, alpha_ag, eff_ag):
    truth = {"allreduce": OpFit(alpha_ar, eff_ar), "allgather": OpFit(alpha_ag, eff_ag)}
    fits = fit_per_op(_measurements(truth))
    assert set(fits) == {"allreduce", "allgather"}
    for op, f in fits.items():
        assert f.efficiency == pytest.approx(truth[op].efficiency, rel=1e-6)
        assert f.alpha_s == pytest.approx(truth[op].alpha_s, rel=1e-5, abs=1e-9)
        assert f.median_abs_error_pct == pytest.approx(0, abs=1e-6)


def test_pooled_fit_cannot_serve_two_operations_but_per_op_fits_can():
    rows = _measurements({"allreduce": AR, "allgather": AG})
    pooled = fit(rows)
    per_op = fit_per_op(rows)
    assert pooled.max_abs_error_pct > 10  # one efficiency for 0.9 and 0.6 misses both
    assert max(f.max_abs_error_pct for f in per_op.values()) < 1e-6
    assert per_op["allgather"].points == 6


def test_fit_error_is_the_median_relative_residual():
    noise = (0.05, -0.05, 0.0)
    (f,) = fit_per_op(_measurements({"allgather": AG}, bandwidths=(100e6,), noise=noise)).values()
    t = np.array([collective_seconds("allgather", n, 2, 100e6, AG.alpha_s, AG.efficiency) for n in (65536, 1 << 20, 1 << 24)])
    t *= 1 + np.array(noise)
    predicted = np.array([collective_seconds("allgather", n, 2, 100e6, f.alpha_s, f.efficiency)
                          for n in (65536, 1 << 20, 1 << 24)])
    assert f.median_abs_error_pct == pytest.approx(float(np.median(np.abs(predicted - t) / t * 100)), rel=1e-9)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter"])
def test_collective_time_applies_the_operations_own_fit(op, fidelity):
    p, n, bw, lat = 4, 8 * MB, 100e6, 1e-5
    own = CAL.fit_for(op)
    expected = simulator.collective_time(op, n, p, bw * own.efficiency, lat + own.alpha_s, fidelity=fidelity)
    assert simulator.collective_time(op, n, p, bw, lat, fidelity=fidelity, calibration=CAL) == pytest.approx(expected, rel=1e-9)
    if op == "reduce_scatter":  # not measured on its own: the pooled fit
        assert own == OpFit(CAL.alpha_s, CAL.efficiency)
    # closed form, by hand: ring all-gather of one rank's n bytes is (p-1)(α + n/B)
    if op == "allgather":
        assert expected == pytest.approx(3 * (lat + AG.alpha_s + n / (bw * AG.efficiency / 8)), rel=1e-6)


def _profile() -> CompressionProfile:
    return CompressionProfile({("topk", 0.1): CompressionCost(1e-4, 2e-10, 5e-5, 1e-10, (0.8, 0.8))}, "test")


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_iteration_uses_allreduce_fit_for_dense_and_allgather_fit_for_sparse(fidelity):
    wl = Workload(tuple(Layer(f"l{i}", 2 * MB, 0.002) for i in range(6)), 0.01, 0.002, 8)
    dense = Scenario(wl, 4, 50e6, 0.0, fidelity=fidelity, bucket_mode="single")
    sparse = replace(dense, compressor="topk", density=0.1, profile=_profile())
    only = {op: Calibration(f.alpha_s, 0.0, f.efficiency) for op, f in (("allreduce", AR), ("allgather", AG))}
    assert simulate(replace(dense, calibration=CAL))["iteration_s"] == pytest.approx(
        simulate(replace(dense, calibration=only["allreduce"]))["iteration_s"], rel=1e-9)
    assert simulate(replace(sparse, calibration=CAL))["iteration_s"] == pytest.approx(
        simulate(replace(sparse, calibration=only["allgather"]))["iteration_s"], rel=1e-9)
    # and the sparse exchange (counts, then padded values) is slower with the slower all-gather fit
    assert simulate(replace(sparse, calibration=CAL))["comm_s"] > simulate(replace(sparse, calibration=only["allreduce"]))["comm_s"]


def test_store_round_trip_latest_and_by_id(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        assert project.calibration(store) is None
        fit_row = {"alpha_s": 5e-4, "beta_s_per_byte": 8e-8, "efficiency": 0.8, "fit_error_pct": 7.0, "source": {}}
        first = store.insert_calibration(fit_row, {})
        second = store.insert_calibration(
            {**fit_row, "alpha_s": 4e-4},
            {"allreduce": {**fit_row, "alpha_s": AR.alpha_s, "efficiency": AR.efficiency, "fit_error_pct": 1.5,
                           "source": {"points": 6}},
             "allgather": {**fit_row, "alpha_s": AG.alpha_s, "efficiency": AG.efficiency, "fit_error_pct": 2.5,
                           "source": {"points": 6}}},
        )
        assert store.latest_calibration()["id"] == second
        latest = project.calibration(store)
        older = Calibration.from_rows(store.calibration_rows(first))
        assert store.calibration_rows(second + 1) == []  # a per-operation row is not a calibration id
    assert latest.calibration_id == second and latest.alpha_s == 4e-4
    assert latest.ops == {"allreduce": OpFit(AR.alpha_s, AR.efficiency, 1.5, 6),
                          "allgather": OpFit(AG.alpha_s, AG.efficiency, 2.5, 6)}
    assert older.ops == {} and older.alpha_s == 5e-4


def test_sidco_calibrate_stores_and_prints_a_fit_per_op(tmp_path, capsys):
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        with store.transaction() as cur:
            cur.execute("INSERT INTO emulations(created, kind, config_json, cores, status) "
                        "VALUES(0, 'collective', '{}', 2, 'done')")
        store.add_collective_measurements(1, _measurements({"allreduce": AR, "allgather": AG}))
    assert main(["calibrate", "--store", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ops"]["allgather"]["efficiency"] == pytest.approx(AG.efficiency, rel=1e-6)
    assert out["ops"]["allreduce"]["median_abs_error_pct"] == pytest.approx(0, abs=1e-6)
    with Store(path) as store:
        cal = project.calibration(store, required=True)
    assert cal.calibration_id == out["calibration_id"]
    assert cal.ops["allgather"].alpha_s == pytest.approx(AG.alpha_s, rel=1e-5)
    assert main(["calibrate", "--store", str(path)]) == 0
    text = capsys.readouterr().out
    assert "allgather" in text and "allreduce" in text and "fit error" in text


def test_calibrate_check_holds_out_an_emulation_and_compares(tmp_path, capsys):
    path = tmp_path / "r.sqlite"
    truth = {"allreduce": AR, "allgather": AG}
    with Store(path) as store:
        with store.transaction() as cur:
            for _ in range(2):
                cur.execute("INSERT INTO emulations(created, kind, config_json, cores, status) "
                            "VALUES(0, 'collective', '{}', 2, 'done')")
        store.add_collective_measurements(1, _measurements(truth))
        # the held-out run is 10 % slower than the fitted one: it must not move the fit
        held = [{**r, "seconds": r["seconds"] * 1.1} for r in _measurements(truth, bandwidths=(100e6,))]
        store.add_collective_measurements(2, held)
    assert main(["calibrate", "--store", str(path), "--check", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["emulation_ids"] == [1]
    assert len(out["check"]) == len(held)
    for c in out["check"]:
        assert c["calibrated_error_pct"] == pytest.approx(100 / 1.1 - 100, rel=1e-5)
    gather = [c for c in out["check"] if c["op"] == "allgather" and c["nbytes"] == 1 << 24][0]
    # uncalibrated ring all-gather of 16 MiB gathered on 2 ranks at 100 Mbit/s: 8 MiB one way
    assert gather["uncalibrated_s"] == pytest.approx((1 << 23) * 8 / 100e6, rel=1e-9)
    assert main(["calibrate", "--store", str(path), "--check", "7"]) == 2
    assert "--check" in capsys.readouterr().err


def test_fit_per_op_and_worker_count_where_counts_differ():
    two = _measurements({"allgather": AG})
    four = [{**r, "workers": 4, "seconds": collective_seconds("allgather", r["nbytes"], 4, r["bandwidth_bps"], 2e-4, 0.9)}
            for r in _measurements({"allgather": AG})]
    fits = fit_per_op(two + four)
    assert set(fits) == {"allgather", "allgather@2", "allgather@4"}
    assert fits["allgather@2"].efficiency == pytest.approx(0.6, rel=1e-6)
    assert fits["allgather@4"].efficiency == pytest.approx(0.9, rel=1e-6)
    cal = Calibration(5e-4, 8e-8, 0.8, {k: OpFit(f.alpha_s, f.efficiency) for k, f in fits.items()})
    assert cal.fit_for("allgather", 4).efficiency == pytest.approx(0.9, rel=1e-6)
    assert cal.fit_for("allgather", 8) == cal.ops["allgather"]  # unmeasured count: the op's own fit
    assert cal.fit_for("allreduce", 2) == OpFit(5e-4, 0.8)  # unmeasured op: pooled
    for p, f in ((2, AG), (4, OpFit(2e-4, 0.9))):
        assert simulator.collective_time("allgather", MB, p, 100e6, 0.0, fidelity="analytic", calibration=cal) == \
            pytest.approx((p - 1) * (f.alpha_s + MB * 8 / (100e6 * f.efficiency)), rel=1e-5)


def test_calibration_with_per_op_fits_stays_hashable():
    wl = Workload((Layer("a", MB, 0.001),), 0.0, 0.0, 1)
    assert hash(CAL) == hash(replace(CAL))
    assert Scenario(wl, 2, 1e8, 0.0, calibration=CAL) == Scenario(wl, 2, 1e8, 0.0, calibration=replace(CAL))
    assert CAL != Calibration(CAL.alpha_s, CAL.beta_s_per_byte, CAL.efficiency)  # the per-op fits count


def test_pipeline_resolves_the_calibration_with_its_per_op_fits(tmp_path):
    from pipeline.emulate import resolve_calibration

    fit_row = {"alpha_s": CAL.alpha_s, "beta_s_per_byte": CAL.beta_s_per_byte, "efficiency": CAL.efficiency,
               "fit_error_pct": 1.0, "source": {}}
    per_op = {op: {**fit_row, "alpha_s": f.alpha_s, "efficiency": f.efficiency, "source": {"points": 3}}
              for op, f in CAL.ops.items()}
    with Store(tmp_path / "r.sqlite") as store:
        assert resolve_calibration(store, "latest") == (None, None)
        stored = store.insert_calibration(fit_row, per_op)
        for choice in ("latest", stored):
            calibration_id, cal = resolve_calibration(store, choice)
            assert calibration_id == stored
            assert cal.ops["allgather"].efficiency == pytest.approx(AG.efficiency)
            assert cal.ops["allreduce"].alpha_s == pytest.approx(AR.alpha_s)
        with pytest.raises(ValueError, match="no calibration with id 99"):
            resolve_calibration(store, 99)


def test_pipeline_grid_rows_and_summary(tmp_path):
    import traces
    from pipeline.emulate import cells, summarize, validation_rows

    grid = cells([2, 4], [20e6], ["none", "topk", "fp16"], [0.1, 0.05])
    assert grid == [(2, 20e6, 0.1, ["none", "topk", "fp16"]), (2, 20e6, 0.05, ["topk"]),
                    (4, 20e6, 0.1, ["none", "topk", "fp16"]), (4, 20e6, 0.05, ["topk"])]
    trace = traces.synthetic(tmp_path / "run", "laplace", 20_000, workers=1, iterations=2, seed=0,
                             timings={"forward_s": 0.01, "backward_s": [0.02], "optimizer_s": 0.001,
                                      "batch_size": 8, "device": "cpu"})
    measured = [{"compressor": "none", "trace": str(trace.path), "measured_s": 0.05}]
    with Store(tmp_path / "r.sqlite") as store:
        store.register_trace(trace.path, trace.manifest)
        rows = validation_rows(store, 1, "synthetic", 2, 1e6, 0.1, measured, (7, CAL), ["analytic", "des"])
    assert sorted((r["fidelity"], r["calibrated"]) for r in rows) == [
        ("analytic", 0), ("analytic", 1), ("des", 0), ("des", 1)]
    for r in rows:
        projected = json.loads(r["detail_json"])["projected"]
        assert r["network_share"] == pytest.approx(projected["comm_s"] / projected["iteration_s"])
        assert r["error_pct"] == pytest.approx((r["projected_s"] - 0.05) / 0.05 * 100)
        assert json.loads(r["detail_json"])["calibration_id"] == (7 if r["calibrated"] else None)
    # 80 kB dense on a 1 Mbit/s link: the network dominates the iteration
    assert all(r["network_share"] > 0.3 for r in rows)
    summary = summarize(rows)
    analytic = [abs(r["error_pct"]) for r in rows if r["fidelity"] == "analytic" and not r["calibrated"]]
    assert summary["analytic uncalibrated, all cells: worst |error|"] == pytest.approx(max(analytic))
    assert summary["des calibrated, network share >= 30%: median |error|"] == pytest.approx(
        abs(next(r["error_pct"] for r in rows if r["fidelity"] == "des" and r["calibrated"])))
