"""The two front doors give one number: the What-if page's projection equals `sidco simulate --json`."""

from __future__ import annotations

import json

import pytest

from dashboard import projection
from results.store import Store
from sidco.cli import main


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A tiny captured trace (real training) replayed through two compressors into a store."""
    root = tmp_path_factory.mktemp("parity")
    store, trace = root / "r.sqlite", root / "resnet20"
    assert main(["capture", "--workload", "resnet20", "--workers", "2", "--iterations", "2", "--every", "1",
                 "--width", "0.25", "--batch-size", "4", "--threads", "1", "--out", str(trace),
                 "--store", str(store)]) == 0
    assert main(["replay", str(trace), "--compressors", "sidco-e,topk", "--densities", "0.01", "--threads", "1",
                 "--store", str(store)]) == 0
    with Store(store) as s:
        (row,) = s.trace_list()
    return store, trace, row["id"]


def _cli(capsys, store, trace, compressor, *extra):
    capsys.readouterr()
    argv = ["simulate", "--trace", str(trace), "--nodes", "8", "--bandwidth", "10Gbit", "--latency", "50us",
            "--compressor", compressor, "--fidelity", "analytic", "--store", str(store), "--json", *extra]
    if compressor != "none":
        argv += ["--density", "0.01"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("calibrated", [False, True])
def test_whatif_values_equal_sidco_simulate_json(captured, capsys, calibrated):
    store_path, trace, trace_id = captured
    if calibrated:
        with Store(store_path) as s:
            if s.latest_calibration() is None:
                s.add_calibration(2e-4, 1e-9, 0.8, {"test": True})
    names = ["none", "sidco-e", "topk"]
    controls = projection.parse_controls(f"trace:{trace_id}", names, "0.01", "8", "10Gbit", "50us", "ring",
                                         calibrated=calibrated)
    with Store(store_path) as store:
        page = {row["compressor"]: row for row in projection.project(store, controls, "analytic")}
    for name in names:
        cli = _cli(capsys, store_path, trace, name, *(["--calibration"] if calibrated else []))
        for key in projection.RESULT_KEYS:
            assert page[name][key] == cli[key], (name, key)
        assert page[name]["cost_source"] == cli["cost_source"]
    assert page["sidco-e"]["cost_source"].startswith("replay #")
    assert page["sidco-e"]["compress_s"] > 0


def test_whatif_never_measures_missing_costs(captured):
    """Costs no replay or profile holds come from the cost model, never from timing compressors."""
    store_path, _, trace_id = captured
    controls = projection.parse_controls(f"trace:{trace_id}", ["dgc"], "0.01", "8", "10Gbit", "50us", "ring")
    with Store(store_path) as store:
        (row,) = projection.project(store, controls)
    assert row["cost_source"].startswith("model cpu") and row["device"] == "cpu"


def test_whatif_projects_each_compressor_with_the_best_costs_it_has(captured):
    """Measured costs where a replay holds them, the cost model for the rest (here dgc)."""
    store_path, _, trace_id = captured
    controls = projection.parse_controls(f"trace:{trace_id}", ["none", "dgc", "topk"], "0.01", "8", "10Gbit",
                                         "50us", "ring")
    alone = projection.parse_controls(f"trace:{trace_id}", ["topk"], "0.01", "8", "10Gbit", "50us", "ring")
    with Store(store_path) as store:
        rows, problems = projection.project_each(store, controls)
        (topk,) = projection.project(store, alone)
    assert [r["compressor"] for r in rows] == ["none", "dgc", "topk"] and rows[2] == topk and not problems
    assert rows[1]["cost_source"].startswith("model cpu") and topk["cost_source"].startswith("replay #")


def test_whatif_verdict_equals_sidco_compare(capsys, tmp_path):
    """The What-if page's default compressors at one density give the verdict `sidco compare` prints,
    what would settle it included."""
    from dashboard.pages.whatif import DEFAULTS

    store_path = tmp_path / "r.sqlite"
    controls = projection.parse_controls(DEFAULTS["source"], ["none", "fp16", "powersgd", "topk", "sidco-e"], "0.01",
                                         DEFAULTS["nodes"], DEFAULTS["bandwidth"], DEFAULTS["latency"], "ring")
    with Store(store_path) as store:
        rows, problems = projection.project_each(store, controls)
        rows, judged = projection.judged(store, controls, rows)
    assert not problems
    capsys.readouterr()
    assert main(["compare", "--layout", DEFAULTS["source"].split(":")[1], "--nodes", DEFAULTS["nodes"],
                 "--bandwidth", DEFAULTS["bandwidth"], "--latency", DEFAULTS["latency"], "--compressors",
                 "topk,sidco-e", "--densities", "0.01", "--store", str(store_path), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert judged == cli["verdict"] and judged["settle"]["command"].startswith("sidco ")
    assert sorted(r["label"] for r in rows) == sorted(r["label"] for r in cli["rows"])
    quality_keys = ("achieved_density", "achieved_over_target", "energy_vs_topk", "quality_source")
    page = {r["label"]: [r[k] for k in quality_keys] for r in rows}
    assert page == {r["label"]: [r[k] for k in quality_keys] for r in cli["rows"]}
