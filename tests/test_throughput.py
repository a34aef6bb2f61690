"""The compute rule fitted to published training throughput (profiles/throughput.json), --precision, error bands."""

from __future__ import annotations

import dataclasses
import json

import pytest

from costs import devices, throughput
from pipeline import project as projection
from results.store import Store
from sidco.cli import main
from simulator.band import BAND_KEYS


def test_the_table_has_several_harnesses_on_three_gpus_each_row_citing_its_source():
    rows = throughput.load()
    harnesses = {r.harness for r in rows}
    assert len(rows) >= 30 and len(harnesses) >= 5
    assert {r.device for r in rows} == {"v100", "a100", "h100"}
    assert {r.layout for r in rows} >= {"resnet50", "bert-base", "bert-large", "gpt2"}
    for layout in ("resnet50", "bert-large", "gpt2"):
        assert len({r.harness for r in rows if r.layout == layout}) >= 2, layout
    assert all("https://github.com/" in r.source and r.run_by for r in rows)


def test_each_harness_is_predicted_by_a_fit_that_never_saw_it():
    held = throughput.leave_one_harness_out()
    rows = throughput.load()
    assert [r for r, _, _ in held] == list(rows)
    harness = "dle-tensorflow"
    rule = throughput.fit([r for r in rows if r.harness != harness])
    for row, predicted, err in held:
        if row.harness == harness:
            assert predicted == pytest.approx(rule.samples_per_s(row), rel=1e-6)
            assert err == pytest.approx(predicted / row.samples_per_s - 1)


def test_the_band_holds_nine_in_ten_rows_sized_without_their_own_harness():
    """The coverage computed afresh from the shipped table: each harness's rows predicted by a
    fit without it, the band sized from the other harnesses' ratios alone (issue 33)."""
    held = throughput._held_out(throughput.load(), lambda r: r.harness)
    ratios = [p / r.samples_per_s for r, p in zip(throughput.load(), held)]
    trim = throughput.coverage()["trim"]
    inside = 0
    for harness in {r.harness for r in throughput.load()}:
        others = [x for r, x in zip(throughput.load(), ratios) if r.harness != harness]
        low, high = throughput.trimmed(others, trim)
        inside += sum(low <= x <= high for r, x in zip(throughput.load(), ratios) if r.harness == harness)
    assert inside / len(ratios) >= 0.9
    low, high = throughput.band()
    assert sum(low <= x <= high for x in ratios) / len(ratios) >= 0.9
    k = throughput.coverage()["k"]
    assert (low, high) == (min(1.0, sorted(ratios)[k]), max(1.0, sorted(ratios)[-1 - k]))
    assert low < 1 < high and throughput.coverage()["out_of_harness"] == pytest.approx(inside / len(ratios))


def test_the_fit_recovers_the_constants_that_made_its_rows():
    """Rows made by a known rule are fitted back to that rule (the least squares is exact there)."""
    truth = dataclasses.replace(throughput.fitted(), simt=0.5, tensor={"cnn": 0.2, "transformer": 0.35})
    rows = [dataclasses.replace(r, samples_per_s=truth.samples_per_s(r)) for r in throughput.load()]
    again = throughput.fit(rows)
    assert again.simt == pytest.approx(0.5, rel=1e-6)
    assert again.tensor == pytest.approx(truth.tensor, rel=1e-6)


def test_published_rows_come_out_of_simulate_as_the_rule_predicts(tmp_path):
    """A single-GPU simulate of a table row's layout and batch gives the rule's samples/s (the
    simulator adds nothing to compute on one node without compression)."""
    for row in [r for r in throughput.load() if r.tokens is None][:6]:
        asked = projection.resolve(projection.Request(projection.Cluster(1, 10e9, 50e-6), layout=row.layout,
                                                      device=row.device, batch_size=row.batch_size,
                                                      precision=row.precision))
        with Store(tmp_path / "r.sqlite") as store:
            [result] = projection.project(store, asked)
        assert result["samples_per_s"] == pytest.approx(throughput.fitted().samples_per_s(row), rel=1e-6)


def test_v100_amp_runs_at_the_fp16_tensor_core_peak(capsys):
    fit, v100 = throughput.fitted(), devices.get("v100")
    rule = throughput.compute(v100, "amp", "cnn", "resnet50")
    assert rule.flops_per_s == pytest.approx(fit.tensor["cnn"] * 125e12, rel=1e-12) and "fp16 peak 125 TFLOP/s" in rule.note
    fp32 = throughput.compute(v100, "fp32", "cnn", "resnet50")
    assert fp32.flops_per_s == pytest.approx(fit.simt * 15.7e12, rel=1e-12) and "fp32 peak 15.7 TFLOP/s" in fp32.note
    assert fp32.flops_per_s < rule.flops_per_s / 2
    assert throughput.compute(v100, "tf32", "cnn", "resnet50").flops_per_s == fp32.flops_per_s  # no TF32 units
    argv = ["simulate", "--layout", "resnet50", "--device", "v100", "--nodes", "1", "--bandwidth", "10Gbit",
            "--batch-size", "256", "--fidelity", "analytic", "--json", "--store", ":memory:"]
    assert main(argv + ["--precision", "amp"]) == 0
    amp = json.loads(capsys.readouterr().out)
    assert main(argv + ["--precision", "fp32"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert amp["precision"] == "amp" and "fp16 peak 125 TFLOP/s" in amp["compute_source"]
    low, high = throughput.band()
    for result, precision in ((amp, "amp"), (single, "fp32")):
        assert result["samples_per_s"] == pytest.approx(
            fit.samples_per_s(throughput.Row("v100", "resnet50", precision, 256, 1.0, "-", "-")), rel=1e-6)
        published = [r for r in throughput.load() if (r.device, r.layout, r.precision) == ("v100", "resnet50", precision)]
        assert len(published) >= 3 and all(low <= fit.samples_per_s(r) / r.samples_per_s <= high for r in published)


def test_unmeasured_inputs_widen_the_compute_band_by_the_measured_factors():
    anchored = throughput.compute(devices.get("h100"), "amp", "transformer", "bert-base")
    new_gpu = throughput.compute(devices.get("h200"), "amp", "transformer", "bert-base")
    both = throughput.compute(devices.get("h200"), "amp", "cnn", "vgg19")
    assert anchored.unmeasured == () and len(new_gpu.unmeasured) == 1 and len(both.unmeasured) == 2
    assert both.low < new_gpu.low < anchored.low < 1 < anchored.high < new_gpu.high < both.high
    assert (anchored.low, anchored.high) == throughput.band()
    widen = throughput.widening()
    assert 1 < widen["device"] < 2 and 1 < widen["layout"] < 2
    assert new_gpu.high == pytest.approx(anchored.high * widen["device"])
    assert both.low == pytest.approx(anchored.low / (widen["device"] * widen["layout"]))
    fp32 = throughput.compute(devices.get("a100"), "fp32", "cnn", "resnet50")
    assert fp32.unmeasured == ("fp32 on a100 (no published row: the fp32 efficiency of other GPUs)",)


def test_bands_contain_the_point_and_widen_with_unmeasured_inputs(tmp_path):
    with Store(tmp_path / "r.sqlite") as store:
        def one(device: str, layout: str, flops: float | None = None) -> dict:
            asked = projection.resolve(projection.Request(projection.Cluster(8, 10e9, 50e-6), ("none", "topk"),
                                                          (0.01,), layout=layout, device=device,
                                                          device_flops_per_s=flops))
            return projection.project(store, asked)

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
    matches), and holds what SciPy's least squares solves now: every constant, every
    leave-one-harness-out prediction and the widening factors. A stale file is not used
    (``python -m costs.throughput`` rewrites it)."""
    assert throughput.shipped_is_current(), "profiles/throughput-fit.json is stale: run python -m costs.throughput"
    problem, shipped = throughput._solution()
    fresh = throughput._solve_all(problem)
    assert shipped["constants"] == pytest.approx(fresh["constants"], rel=1e-6)
    assert shipped["leave_one_harness_out"] == pytest.approx(fresh["leave_one_harness_out"], rel=1e-5)
    assert shipped["widening"] == pytest.approx(fresh["widening"], rel=1e-5)


def test_a_changed_input_is_solved_afresh_not_read_from_the_shipped_file():
    problem = throughput._problem(throughput.load())
    changed = dataclasses.replace(problem.rows[0], samples_per_s=problem.rows[0].samples_per_s * 1.5)
    assert throughput._problem((changed, *problem.rows[1:])).key() != problem.key()


def test_a_row_without_its_harness_or_source_is_refused_naming_the_row(tmp_path):
    good = {"device": "v100", "layout": "resnet50", "precision": "amp", "batch_size": 256, "samples_per_s": 1000.0,
            "harness": "h", "source": "https://github.com/x/y"}
    for bad in ({k: v for k, v in good.items() if k != "harness"}, {**good, "source": " "}, {**good, "batch_size": 0}):
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"rows": [good, bad]}))
        with pytest.raises(ValueError, match="row 1"):
            throughput.load(str(path))
