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
    store_path, _, trace_id = captured
    controls = projection.parse_controls(f"trace:{trace_id}", ["dgc"], "0.01", "8", "10Gbit", "50us", "ring")
    with Store(store_path) as store, pytest.raises(projection.ProjectionError) as info:
        projection.project(store, controls)
    message = str(info.value)
    assert "no compression costs for dgc@0.01 on cpu" in message and "sidco replay" in message


def test_whatif_projects_what_it_can_and_names_what_is_missing(captured):
    store_path, _, trace_id = captured
    controls = projection.parse_controls(f"trace:{trace_id}", ["none", "dgc", "topk"], "0.01", "8", "10Gbit",
                                         "50us", "ring")
    alone = projection.parse_controls(f"trace:{trace_id}", ["topk"], "0.01", "8", "10Gbit", "50us", "ring")
    with Store(store_path) as store:
        rows, problems = projection.project_each(store, controls)
        (topk,) = projection.project(store, alone)
    assert [r["compressor"] for r in rows] == ["none", "topk"] and rows[1] == topk
    (problem,) = problems
    assert problem.startswith("no compression costs for dgc@0.01 on cpu: run `sidco replay ")
