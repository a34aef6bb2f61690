"""Emulated training on loopback (--no-shaping): real gloo DDP processes, no root needed."""

from __future__ import annotations

import json

import pytest

import traces
from emulation.projection import compute_model
from sidco.cli import main
from results.store import Store


def test_no_shaping_training_measures_and_records(tmp_path, capsys):
    store_path = tmp_path / "r.sqlite"
    code = main([
        "emulate", "--no-shaping", "--workers", "2", "--workload", "resnet20", "--compressors", "topk",
        "--densities", "0.01", "--iterations", "3", "--warmup", "1", "--batch-size", "4",
        "--store", str(store_path), "--trace-dir", str(tmp_path / "traces"), "--json",
    ])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    (result,) = out["results"]
    measured = result["detail"]["measured"]
    assert result["compressor"] == "topk" and result["bandwidth_bps"] is None
    assert 0 < measured["phases_s"]["forward_s"] < measured["measured_s"]
    assert len(measured["per_rank_iteration_s"]) == 2
    (bucket,) = measured["buckets"]
    assert bucket["path"] == "allgather"
    # top-k at 1 %: each rank sends ~1 % of the 272,474 values, 4-byte values + 4-byte indices
    assert 0.005 * bucket["numel"] * 8 < bucket["payload_bytes"] < 0.02 * bucket["numel"] * 8
    trace = traces.open(measured["trace"])
    assert str(tmp_path / "traces") in measured["trace"]
    assert trace.workers == 1 and len(trace.iterations) == 3
    assert trace.timings["forward_s"] > 0
    # every rank timed its 3 compute-only passes; the projection pools them
    passes = measured["compute_passes"]
    assert len(passes) == 2 and all(len(rank) == 3 for rank in passes)
    assert all(q["forward_s"] > 0 and q["backward_s"] > 0 for rank in passes for q in rank)
    same = [[{"forward_s": 0.01, "backward_s": 0.02}] * 3] * 2
    workload, jitter = compute_model(trace, same)
    assert workload.forward_s == pytest.approx(0.01)
    assert sum(layer.backward_s for layer in workload.layers) == pytest.approx(0.02)
    assert jitter == 0.0
    assert compute_model(trace, [same[0]])[0].forward_s == pytest.approx(compute_model(trace)[0].forward_s)
    with Store(store_path) as store:
        (row,) = store.query("SELECT * FROM emulations")
        assert row["kind"] == "train" and row["status"] == "done" and row["cores"] >= 1
        assert store.query("SELECT COUNT(*) AS n FROM validation")[0]["n"] == 0


def test_bad_training_request_is_one_line(tmp_path, capsys):
    for argv, message in [
        (["--workload", "alexnet"], "unknown workload"),
        (["--compressors", "zip"], "unknown compressor"),
        (["--densities", "1.5"], "density"),
        (["--density", "0.1"], "--density is now --densities"),
        (["--calibration", "abc"], "invalid --calibration"),
    ]:
        try:
            code = main(["emulate", "--no-shaping", *argv, "--store", str(tmp_path / "r.sqlite")])
        except SystemExit as exc:  # the parser's own one-line errors
            code = exc.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and "\n" not in err, (argv, err)
