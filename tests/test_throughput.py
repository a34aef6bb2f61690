"""The compute rule fitted to published training throughput (profiles/throughput.json), --precision, error bands."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline import project as projection
from results.store import Store
from sidco.cli import main
from simulator import devices, throughput
from simulator.band import BAND_KEYS


def test_the_table_has_three_layouts_on_three_gpus_each_row_citing_its_source():
    rows = throughput.load()
    assert {r.layout for r in rows} >= {"resnet50", "bert-base", "bert-large"}
    assert {r.device for r in rows} == {"v100", "a100", "h100"}
    for layout in {r.layout for r in rows}:
        assert {r.device for r in rows if r.layout == layout} == {"v100", "a100", "h100"}
    assert all("https://github.com/" in r.source and "PyTorch" in r.source for r in rows)


def test_every_published_row_is_reproduced_within_15_percent():
    errors = [err for _, _, err in throughput.reproduction()]
    assert len(errors) == len(throughput.load()) and max(map(abs, errors)) <= 0.15


def test_each_row_predicted_from_the_others_is_within_30_percent():
    errors = [err for _, _, err in throughput.leave_one_out()]
    assert len(errors) == len(throughput.load()) and max(map(abs, errors)) <= 0.30
    low, high = throughput.band()
    assert low == pytest.approx(1 + min(errors)) and high == pytest.approx(1 + max(errors))


def test_the_fit_recovers_the_constants_that_made_its_rows():
    """Rows made by a known rule are fitted back to that rule (the least squares is exact there)."""
    truth = dataclasses.replace(throughput.fitted(), simt=0.5, tensor={"resnet50": 0.2, "bert-base": 0.3,
                                                                       "bert-large": 0.4},
                                device={"a100": 1.0, "v100": 0.9, "h100": 0.6},
                                bytes_per_flop={"cnn": 0.02, "transformer": 0.002})
    rows = [dataclasses.replace(r, samples_per_s=truth.samples_per_s(r)) for r in throughput.load()]
    again = throughput.fit(rows)
    assert again.simt == pytest.approx(0.5, rel=1e-4)
    assert again.tensor == pytest.approx(truth.tensor, rel=1e-4) and again.device == pytest.approx(truth.device, rel=1e-4)
    assert again.bytes_per_flop == pytest.approx(truth.bytes_per_flop, rel=1e-3)


def test_published_rows_come_out_of_simulate_as_the_rule_predicts(tmp_path):
    """A single-GPU simulate of a table row's layout and batch gives the rule's samples/s (the
    simulator adds nothing to compute on one node without compression)."""
    for row in [r for r in throughput.load() if r.tokens is None]:
        source = projection.layout_source(row.layout, device=row.device, batch_size=row.batch_size,
                                          precision=row.precision)
        with Store(tmp_path / "r.sqlite") as store:
            [result] = projection.project(store, source, projection.Cluster(1, 10e9, 50e-6), ["none"], None)
        assert result["samples_per_s"] == pytest.approx(throughput.fitted().samples_per_s(row), rel=1e-6)
        assert result["samples_per_s"] == pytest.approx(row.samples_per_s, rel=0.15)


def test_v100_amp_runs_at_the_fp16_tensor_core_peak(capsys):
    fit, v100 = throughput.fitted(), devices.get("v100")
    eta = fit.tensor["resnet50"] * fit.device["v100"]
    expected = 1 / (1 / (eta * 125e12) + fit.bytes_per_flop["cnn"] / v100.memory_bandwidth_Bps)
    rule = throughput.compute(v100, "amp", "cnn", "resnet50")
    assert rule.flops_per_s == pytest.approx(expected, rel=1e-12) and "fp16 peak 125 TFLOP/s" in rule.note
    fp32 = throughput.compute(v100, "fp32", "cnn", "resnet50")
    assert "fp32 peak 15.7 TFLOP/s" in fp32.note and fp32.flops_per_s < rule.flops_per_s / 2
    assert throughput.compute(v100, "tf32", "cnn", "resnet50").flops_per_s == fp32.flops_per_s  # no TF32 units
    argv = ["simulate", "--layout", "resnet50", "--device", "v100", "--nodes", "1", "--bandwidth", "10Gbit",
            "--batch-size", "256", "--fidelity", "analytic", "--json", "--store", ":memory:"]
    assert main(argv + ["--precision", "amp"]) == 0
    amp = json.loads(capsys.readouterr().out)
    assert main(argv + ["--precision", "fp32"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert amp["precision"] == "amp" and "fp16 peak 125 TFLOP/s" in amp["compute_source"]
    published = {r.precision: r.samples_per_s for r in throughput.load() if (r.device, r.layout) == ("v100", "resnet50")}
    assert amp["samples_per_s"] == pytest.approx(published["amp"], rel=0.15)
    assert single["samples_per_s"] == pytest.approx(published["fp32"], rel=0.15)


def test_unmeasured_inputs_widen_the_compute_band():
    anchored = throughput.compute(devices.get("h100"), "amp", "transformer", "bert-base")
    new_gpu = throughput.compute(devices.get("h200"), "amp", "transformer", "bert-base")
    both = throughput.compute(devices.get("h200"), "amp", "transformer", "gpt2")
    assert anchored.unmeasured == () and len(new_gpu.unmeasured) == 1 and len(both.unmeasured) == 2
    assert both.low < new_gpu.low < anchored.low < 1 < anchored.high < new_gpu.high < both.high
    assert (anchored.low, anchored.high) == throughput.band()


def test_bands_contain_the_point_and_widen_with_unmeasured_inputs(tmp_path):
    with Store(tmp_path / "r.sqlite") as store:
        def one(device: str, layout: str, flops: float | None = None) -> dict:
            source = projection.layout_source(layout, device=device, device_flops_per_s=flops)
            return projection.project(store, source, projection.Cluster(8, 10e9, 50e-6), ["none", "topk"], 0.01)

        for none, topk in (one("h100", "bert-base"), one("h200", "gpt2")):
            for result in (none, topk):
                assert set(BAND_KEYS) <= set(result)
                assert result["iteration_s_low"] <= result["iteration_s"] <= result["iteration_s_high"]
                assert result["speedup_low"] <= result["speedup"] <= result["speedup_high"]
            assert none["speedup_low"] == none["speedup_high"] == 1.0
            assert none["iteration_s_low"] < none["iteration_s"] < none["iteration_s_high"]
        # no compression: compute's band alone (compression bands differ by device, kind of kernel by kind)
        anchored, unmeasured = one("h100", "bert-base")[0], one("h200", "bert-base")[0]
        width = lambda r: r["iteration_s_high"] / r["iteration_s_low"]  # noqa: E731
        assert width(unmeasured) > width(anchored)
        given_none, given = one("h100", "bert-base", flops=100e12)  # compute as given: only the costs' band
        assert given_none["iteration_s_low"] == given_none["iteration_s"] == given_none["iteration_s_high"]
        assert given["iteration_s_low"] < given["iteration_s"] < given["iteration_s_high"]


def test_precision_is_checked_in_one_line(capsys):
    argv = ["simulate", "--layout", "resnet50", "--nodes", "1", "--bandwidth", "10Gbit", "--precision", "fp8"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "fp8" in capsys.readouterr().err


def test_the_shipped_solution_is_current_and_equals_a_fresh_fit():
    """profiles/throughput-fit.json answers for the table and devices as they are (its key
    matches), and holds what SciPy's least squares solves now: every constant and every
    leave-one-out error. A stale file is not used (``python -m simulator.throughput`` rewrites it)."""
    problem, cache = throughput._shipped()
    assert cache is not None, "profiles/throughput-fit.json is stale: run python -m simulator.throughput"
    fresh = throughput._solve(problem)
    shipped = throughput.fitted()
    assert shipped.simt == pytest.approx(fresh.simt, rel=1e-6)
    for name in ("tensor", "device", "bytes_per_flop"):
        assert getattr(shipped, name) == pytest.approx(getattr(fresh, name), rel=1e-6), name
    solved = throughput._solve_leave_one_out(problem.rows)
    assert [err for _, _, err in throughput.leave_one_out()] == pytest.approx([err for _, _, err in solved],
                                                                                rel=1e-5, abs=1e-9)


def test_a_changed_input_is_solved_afresh_not_read_from_the_shipped_file():
    problem = throughput._problem(throughput.load())
    changed = dataclasses.replace(problem.rows[0], samples_per_s=problem.rows[0].samples_per_s * 1.5)
    assert throughput._problem((changed, *problem.rows[1:])).key() != problem.key()
