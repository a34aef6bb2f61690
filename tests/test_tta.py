"""Time to target: the arithmetic against a hand-made convergence table, unreached targets, and
``sidco tta`` / ``sidco sweep --convergence`` end to end over a store holding such a table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.replay
import traces
from convergence.tta import iterations_to_target, time_to_target
from pipeline import project
from pipeline.tta import verdict
from results.store import Store
from sidco.cli import main

# Hand-made convergence table: evaluations every 10 iterations up to 40.
ACCURACY = {
    ("none", 1.0): [0.30, 0.50, 0.62, 0.70],
    ("topk", 0.01): [0.20, 0.40, 0.55, 0.61],
    ("sidco-e", 0.01): [0.25, 0.45, 0.60, 0.66],
    ("dgc", 0.01): [0.10, 0.20, 0.30, 0.40],
}


def _rows() -> list[dict]:
    rows = []
    for (compressor, density), accuracies in ACCURACY.items():
        for iteration in range(1, 41):
            evaluated = iteration % 10 == 0
            accuracy = accuracies[iteration // 10 - 1] if evaluated else None
            rows.append({"compressor": compressor, "density": density, "iteration": iteration,
                         "loss": 2.0 - iteration / 40, "eval_loss": (1.0 - accuracy) * 3 if evaluated else None,
                         "accuracy": accuracy})
    return rows


def test_time_to_target_arithmetic_against_a_hand_made_table():
    seconds = {("none", 1.0): 0.100, ("topk", 0.01): 0.040, ("sidco-e", 0.01): 0.050, ("dgc", 0.01): 0.030}
    rows = time_to_target(_rows(), seconds, target_accuracy=0.6)
    result = {"rows": rows, **verdict(rows)}
    table = {(r["compressor"], r["density"]): r for r in result["rows"]}
    # none: 0.62 at 30 -> 3.0 s; topk: 0.61 at 40 -> 1.6 s; sidco-e: 0.60 at 30 -> 1.5 s; dgc: never.
    assert table[("none", 1.0)]["iterations_to_target"] == 30
    assert table[("none", 1.0)]["time_to_target_s"] == pytest.approx(3.0)
    assert table[("topk", 0.01)]["iterations_to_target"] == 40
    assert table[("topk", 0.01)]["time_to_target_s"] == pytest.approx(1.6)
    assert table[("sidco-e", 0.01)]["iterations_to_target"] == 30
    assert table[("sidco-e", 0.01)]["time_to_target_s"] == pytest.approx(1.5)
    assert [(r["compressor"]) for r in result["rows"]] == ["sidco-e", "topk", "none", "dgc"]
    assert result["winner"]["compressor"] == "sidco-e" and result["runner_up"]["compressor"] == "topk"
    assert result["margin_s"] == pytest.approx(0.1)
    assert result["margin_ratio"] == pytest.approx(1.6 / 1.5)
    # loss target: eval_loss = 3 (1 - accuracy) <= 1.2  <=>  accuracy >= 0.6
    by_loss = time_to_target(_rows(), seconds, target_loss=1.2 + 1e-9)
    assert [(r["compressor"], r["iterations_to_target"]) for r in by_loss] == \
        [(r["compressor"], r["iterations_to_target"]) for r in result["rows"]]


def test_a_run_that_never_reaches_the_target_reports_null_and_why():
    rows = time_to_target(_rows(), {("none", 1.0): 0.1, ("topk", 0.01): 0.04, ("sidco-e", 0.01): 0.05,
                                    ("dgc", 0.01): 0.03}, target_accuracy=0.6)
    dgc = [r for r in rows if r["compressor"] == "dgc"][0]
    assert dgc["iterations_to_target"] is None and dgc["time_to_target_s"] is None
    assert dgc["reason"] == "never reached accuracy 0.6 in 40 iterations (best 0.4000)"
    nobody = time_to_target(_rows(), {}, target_accuracy=0.99)
    assert verdict(nobody)["winner"] is None and verdict(nobody)["reason"] == "no configuration reached the target"
    assert all(r["time_to_target_s"] is None for r in nobody)
    missing_time = time_to_target(_rows(), {}, target_accuracy=0.6)
    none = [r for r in missing_time if r["compressor"] == "none"][0]
    assert none["iterations_to_target"] == 30 and none["time_to_target_s"] is None
    assert none["reason"] == "no projected iteration time for this (compressor, density)"
    assert iterations_to_target([{"iteration": 5, "accuracy": None, "eval_loss": None}], target_accuracy=0.5) == \
        (None, "never evaluated")
    with pytest.raises(ValueError, match="exactly one"):
        time_to_target(_rows(), {}, target_accuracy=0.5, target_loss=1.0)


@pytest.fixture
def store_with_table(tmp_path: Path) -> Path:
    """A store holding a synthetic trace (known compute times) and the hand-made table as a convergence run."""
    layers = [("fc.bias", (10,)), ("fc.weight", (10, 1000))]
    trace = traces.synthetic(tmp_path / "trace", "laplace", 10_010, workers=2, iterations=2, seed=1, layers=layers,
                             timings={"forward_s": 0.01, "backward_s": [0.001, 0.02], "optimizer_s": 0.002,
                                      "batch_size": 32, "measured": True})
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        trace_id = store.register_trace(trace.path, trace.manifest)
        run_id, _ = store.get_or_create("convergences", {"workload": "hand-made", "workers": 2})
        store.set_convergence_trace(run_id, trace_id)
        store.write_convergence(run_id, _rows())
        pipeline.replay.run(store, trace, ["topk", "sidco-e", "dgc"], [0.01])
    return path


def test_sidco_tta_multiplies_iterations_by_the_projected_iteration_time(store_with_table, capsys):
    assert main(["tta", "--store", str(store_with_table), "--nodes", "8", "--bandwidth", "100Mbit",
                 "--target-accuracy", "0.6", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(r["compressor"], r["density"]): r for r in result["rows"]}
    with Store(store_with_table) as store:
        asked = project.resolve(project.Request(project.Cluster(8, 1e8, 50e-6), ("none", "topk", "sidco-e", "dgc"),
                                                (0.01,), trace=str(Path(store_with_table).parent / "trace")), store)
        expected = project.project(store, asked)
    for item in expected:
        key = (item["compressor"], None if item["compressor"] == "none" else 0.01)
        assert rows[key]["iteration_s"] == pytest.approx(item["iteration_s"])
        assert rows[key]["iteration_s_low"] == pytest.approx(item["iteration_s_low"])  # the projection's band
        assert rows[key]["iteration_s_low"] <= rows[key]["iteration_s"] <= rows[key]["iteration_s_high"]
    assert result["cost_sources"]["topk@0.01"].startswith("replay #1")
    for row in result["rows"]:
        if row["iterations_to_target"] is not None:
            assert row["time_to_target_s"] == pytest.approx(row["iterations_to_target"] * row["iteration_s"])
    assert rows[("dgc", 0.01)]["time_to_target_s"] is None and "never reached" in rows[("dgc", 0.01)]["reason"]
    reached = sorted((r for r in result["rows"] if r["time_to_target_s"] is not None), key=lambda r: r["time_to_target_s"])
    assert result["winner"] == reached[0]
    assert result["margin_ratio"] == pytest.approx(reached[1]["time_to_target_s"] / reached[0]["time_to_target_s"])
    assert main(["tta", "--store", str(store_with_table), "--nodes", "8", "--bandwidth", "100Mbit",
                 "--target-accuracy", "0.99"]) == 0
    printed = capsys.readouterr().out
    assert "winner: not named, no configuration reached held-out accuracy >= 0.99 (the notes say why)" in printed
    assert "never reached accuracy 0.99" in printed  # the notes say why


def test_sweep_gains_time_to_target_columns(store_with_table, capsys):
    assert main(["sweep", "--store", str(store_with_table), "--convergence", "latest", "--target-accuracy", "0.6",
                 "--nodes", "2,8", "--bandwidth", "100Mbit,25Gbit", "--compressors", "none,topk,dgc",
                 "--densities", "0.01", "--jobs", "1", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    tta = summary["time_to_target"]
    assert len(tta["rows"]) == summary["total"] == 2 * 2 * 5  # fp16 and powersgd: the baselines compare has
    for row in tta["rows"]:
        expected = {"none": 30, "topk": 40, "dgc": None, "fp16": None, "powersgd": None}[row["compressor"]]
        assert row["iterations_to_target"] == expected
        if expected is None:
            why = "did not train" if row["compressor"] in ("fp16", "powersgd") else "never reached"
            assert row["time_to_target_s"] is None and why in row["reason"]
        else:
            assert row["time_to_target_s"] == pytest.approx(expected * row["iteration_s"])
            assert row["time_to_target_s_low"] <= row["time_to_target_s"] <= row["time_to_target_s_high"]
            assert row["time_to_target_s_high"] == pytest.approx(expected * row["iteration_s_high"])
    assert len(tta["winners"]) == 4
    with Store(store_with_table) as store:  # the sweep rows keep the band the projection gives
        stored = store.scenarios(summary["sweep_id"])
    assert all(r["iteration_s_low"] <= r["iteration_s"] <= r["iteration_s_high"] for r in stored)
    assert all(r["speedup_low"] <= r["speedup"] <= r["speedup_high"] for r in stored)


def test_tta_bad_input_is_one_line_and_exit_2(store_with_table, tmp_path, capsys):
    base = ["tta", "--store", str(store_with_table), "--nodes", "8", "--bandwidth", "1Gbit"]
    assert main(base) == 2
    assert "exactly one of --target-accuracy and --target-loss" in capsys.readouterr().err
    assert main([*base, "--target-accuracy", "1.5"]) == 2
    assert main([*base[:-2], "--bandwidth", "10G", "--target-accuracy", "0.5"]) == 2
    assert main(["tta", "--store", str(tmp_path / "empty.sqlite"), "--nodes", "8", "--bandwidth", "1Gbit",
                 "--target-accuracy", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sidco tta: error: the results store has no convergence run; run: sidco converge")


def test_tta_projects_the_named_device_exactly_as_simulate_does(store_with_table, capsys):
    """``sidco tta --device a100`` takes each pair's iteration time from the projection ``sidco simulate
    --trace ... --device a100`` makes for the same trace and scenario; on one node (no communication)
    a100 and cpu differ by the compute ratio of the two devices."""
    from costs import devices

    trace = str(Path(store_with_table).parent / "trace")
    cluster = ["--nodes", "8", "--bandwidth", "100Mbit", "--store", str(store_with_table)]
    assert main(["tta", *cluster, "--device", "a100", "--target-accuracy", "0.6", "--json"]) == 0
    tta = json.loads(capsys.readouterr().out)
    assert tta["device"] == "a100"
    for row in tta["rows"]:
        density = [] if row["compressor"] == "none" else ["--density", str(row["density"])]
        assert main(["simulate", "--trace", trace, *cluster, "--device", "a100", "--fidelity", "analytic",
                     "--compressor", row["compressor"], *density, "--json"]) == 0
        simulated = json.loads(capsys.readouterr().out)
        assert row["iteration_s"] == simulated["iteration_s"]
        assert tta["compute_source"] == simulated["compute_source"]
    one_node = ["--nodes", "1", "--bandwidth", "100Mbit", "--store", str(store_with_table), "--target-accuracy", "0.6",
                "--json"]
    times = {}
    for device in ("cpu", "a100"):
        assert main(["tta", *one_node, "--device", device]) == 0
        times[device] = {r["compressor"]: r["iteration_s"] for r in json.loads(capsys.readouterr().out)["rows"]}
    ratio = devices.compute_ratio(devices.get("cpu"), devices.get("a100"))
    assert ratio < 0.5
    assert times["a100"]["none"] == pytest.approx(ratio * times["cpu"]["none"], rel=1e-9)
    assert main(["tta", *one_node, "--device", "tpu"]) == 2
    assert "tpu" in capsys.readouterr().err


def _seed_rows(reached: dict[tuple[str, float], list[int]]) -> list[dict]:
    """Rows of several seeds per pair: seed s of a pair first meets accuracy 0.6 at ``reached[pair][s]``."""
    rows = []
    for (compressor, density), iterations in reached.items():
        for seed, at in enumerate(iterations):
            for iteration in range(10, 61, 10):
                rows.append({"compressor": compressor, "density": density, "iteration": iteration, "seed": seed,
                             "loss": 1.0, "eval_loss": None, "accuracy": 0.7 if iteration >= at else 0.5})
    return rows


def test_mean_spread_and_too_close_to_call_when_seed_spreads_overlap():
    seconds = {("topk", 0.01): 0.1, ("sidco-e", 0.01): 0.1}
    close = time_to_target(_seed_rows({("topk", 0.01): [30, 40, 30], ("sidco-e", 0.01): [40, 30, 40]}), seconds,
                           target_accuracy=0.6)
    topk = [r for r in close if r["compressor"] == "topk"][0]
    assert topk["seeds"] == 3 and topk["iterations_to_target"] == pytest.approx(100 / 3)
    assert topk["iterations_spread"] == pytest.approx(statistics.stdev([30, 40, 30]))
    assert topk["time_to_target_s"] == pytest.approx(10 / 3) and topk["time_spread_s"] == pytest.approx(
        0.1 * statistics.stdev([30, 40, 30]))
    call = verdict(close)
    assert call["winner"] is None and call["leader"]["compressor"] == "topk"
    assert call["reason"].startswith("too close to call: the margin") and "seed spread" in call["reason"]
    assert call["seed_spread_s"] == pytest.approx(2 * 0.1 * statistics.stdev([30, 40, 30]))
    clear = verdict(time_to_target(_seed_rows({("topk", 0.01): [10, 10, 20], ("sidco-e", 0.01): [40, 50, 40]}),
                                   seconds, target_accuracy=0.6))
    assert clear["winner"]["compressor"] == "topk" and clear["reason"] is None and clear["caveat"] is None
    assert clear["margin_s"] == pytest.approx((130 - 40) / 3 * 0.1)
    # the projection's error band: topk at its slow end is no longer ahead of sidco-e at its fast end
    bands = {("topk", 0.01): (0.09, 0.4), ("sidco-e", 0.01): (0.09, 0.11)}
    banded = verdict(time_to_target(_seed_rows({("topk", 0.01): [10, 10, 20], ("sidco-e", 0.01): [40, 50, 40]}),
                                    seconds, target_accuracy=0.6, bands=bands))
    assert banded["winner"] is None and "error band" in banded["reason"] and "seed spread" not in banded["reason"]
    assert banded["band_s"] == pytest.approx(40 / 3 * (0.4 - 0.1) + 130 / 3 * (0.1 - 0.09))
    one_seed = verdict(time_to_target(_seed_rows({("topk", 0.01): [10], ("sidco-e", 0.01): [40]}), seconds,
                                      target_accuracy=0.6))
    assert one_seed["winner"]["compressor"] == "topk" and "one seed" in one_seed["caveat"]
    partly = time_to_target(_seed_rows({("topk", 0.01): [10, 99]}), seconds, target_accuracy=0.6)
    assert partly[0]["time_to_target_s"] is None and partly[0]["reason"].startswith("seed 1: never reached")


def test_tta_reads_curves_files_as_it_reads_its_convergence_run(store_with_table, tmp_path, capsys):
    """--curves with the run's own rows (JSON, then CSV) and its trace gives the convergence run's table."""
    from convergence import curves

    trace = str(Path(store_with_table).parent / "trace")
    base = ["tta", "--store", str(store_with_table), "--nodes", "8", "--bandwidth", "100Mbit", "--target-accuracy",
            "0.6", "--json"]
    assert main(base) == 0
    expected = json.loads(capsys.readouterr().out)
    document = curves.document("hand-made", _rows())
    (tmp_path / "c.json").write_text(json.dumps(document))
    columns = [*curves.COLUMNS, "eval_loss"]
    lines = [",".join(columns)] + [",".join("" if r[c] is None else str(r[c]) for c in columns) for r in _rows()]
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    for name in ("c.json", "c.csv"):
        assert main([*base, "--curves", str(tmp_path / name), "--trace", trace]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["rows"] == expected["rows"] and result["winner"] == expected["winner"]
        assert result["curves"] == expected["curves"]
    assert main([*base, "--curves", str(tmp_path / "c.json")]) == 2
    assert "--trace DIR or --layout NAME" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"source": "x", "rows": [{**_rows()[0], "density": 2}]}))
    assert main([*base, "--curves", str(tmp_path / "bad.json"), "--trace", trace]) == 2
    assert capsys.readouterr().err.strip().endswith("row 1: density must be in (0, 1], got 2.0")
    assert main([*base, "--curves", str(tmp_path / "c.json"), "--layout", "resnet50", "--device", "a100"]) == 0
    layout = json.loads(capsys.readouterr().out)
    assert layout["device"] == "a100" and layout["workload"] == "resnet50"
    assert all(r["iteration_s"] > 0 for r in layout["rows"])


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=200), st.dictionaries(st.text(max_size=5), st.integers(), max_size=4).map(
    lambda d: json.dumps({"source": "x", "rows": [d]}))))
def test_any_curves_text_parses_or_is_a_value_error(text):
    from convergence import curves

    try:
        parsed = curves.parse(text)
    except ValueError:
        return
    assert parsed["rows"] and all(0 < r["density"] <= 1 for r in parsed["rows"])


def test_time_to_accuracy_curves_are_drawn_as_mean_plus_minus_spread():
    from dashboard import figures
    from pipeline.tta import verdict_text

    points = [{"iteration": 10, "time_s": 1.0, "accuracy": 0.5, "accuracy_spread": 0.1},
              {"iteration": 20, "time_s": 2.0, "accuracy": 0.7, "accuracy_spread": 0.05}]
    band, line = figures.tta_curves({"topk@0.01": points}, "time_s", "accuracy", 0.6)["data"]
    assert band["fill"] == "toself" and band["x"] == [1.0, 2.0, 2.0, 1.0]
    assert band["y"] == pytest.approx([0.6, 0.75, 0.65, 0.4])
    assert line["x"] == [1.0, 2.0] and line["y"] == [0.5, 0.7]
    one_seed = [{**p, "accuracy_spread": None} for p in points]
    assert len(figures.tta_curves({"topk@0.01": one_seed}, "iteration", "accuracy", 0.6)["data"]) == 1
    seconds = {("topk", 0.01): 0.1, ("sidco-e", 0.01): 0.1}
    close = verdict(time_to_target(_seed_rows({("topk", 0.01): [30, 40, 30], ("sidco-e", 0.01): [40, 30, 40]}),
                                   seconds, target_accuracy=0.6))
    close["target"] = {"accuracy": 0.6, "loss": None}
    assert verdict_text(close).startswith("winner: not named, too close to call: the margin")
    dense = verdict(time_to_target(_seed_rows({("none", None): [10], ("topk", 0.01): [40]}),
                                   {("none", None): 0.1, ("topk", 0.01): 0.1}, target_accuracy=0.6))
    dense["target"] = {"accuracy": 0.6, "loss": None}
    assert verdict_text(dense).startswith("winner: no compression (none) reaches held-out accuracy >= 0.6 in")


@pytest.mark.parametrize("given", [None, "", 1.0])
def test_a_dense_compressors_curve_row_may_leave_its_density_out(given):
    """`sidco converge` writes 1.0 for none/fp16/powersgd; a hand-written row may leave it empty."""
    from convergence import curves

    row = {"compressor": "fp16", "iteration": 1, "loss": 2.3, "accuracy": 0.1}
    if given is not None:
        row["density"] = given
    assert curves.check_row(row, "row 0")["density"] == 1.0
    with pytest.raises(ValueError, match="row 0: density is missing"):
        curves.check_row({**row, "compressor": "topk", "density": None}, "row 0")


def test_a_trained_pair_is_named_by_the_one_label_rule():
    """``sidco sweep`` printed ``fp16@1`` in its time-to-target lines and ``fp16`` in its findings:
    a compressor that takes no density is one pair without a density, named bare, whether its
    density is recorded as 1.0 (an older store, a curves file) or None."""
    from pipeline.request import pair
    from units import Pair

    assert pair("fp16", 1.0) == pair("fp16", None) == Pair("fp16") == ("fp16", None)
    assert pair("fp16", 1.0).label == "fp16" and pair("none", 1.0).label == "none"
    assert pair("topk", 0.01) == Pair("topk", 0.01) and pair("topk", 0.01).label == "topk@0.01"
    assert Pair("fp16").stored_density == 1.0 and Pair("topk", 0.01).stored_density == 0.01
    with pytest.raises(ValueError, match="topk needs a density"):
        pair("topk", None)
