"""The loss penalty at equal tokens (:mod:`convergence.penalty`), and ``sidco converge --sync-every`` →
``sidco tta`` end to end: DiLoCo runs for two H and two outer compressors, two seeds each, against
the synchronous run, their penalties printed with the seeds' spread."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convergence.penalty import loss_penalty
from sidco.cli import main


def _curve(losses: dict[int, float]) -> list[dict]:
    return [{"iteration": i, "eval_loss": loss} for i, loss in losses.items()]


def test_penalty_is_the_mean_paired_difference_at_shared_tokens_with_its_sample_spread():
    run = {0: _curve({10: 3.0, 20: 2.5}), 1: _curve({10: 3.2, 20: 2.9}), 7: _curve({20: 9.0})}
    base = {0: _curve({5: 3.5, 10: 2.8, 20: 2.0}), 1: _curve({10: 3.1, 20: 2.2})}
    result = loss_penalty(run, base, 100, 100)
    assert result["seeds"] == [0, 1]  # seed 7 has no baseline: not paired
    assert [p["tokens"] for p in result["points"]] == [1000, 2000]
    final = result["final"]
    assert final["penalty"] == pytest.approx(((2.5 - 2.0) + (2.9 - 2.2)) / 2)
    assert final["spread"] == pytest.approx(statistics.stdev([0.5, 0.7]))
    assert final["baseline_eval_loss"] == pytest.approx(2.1)
    assert final["penalty_fraction"] == pytest.approx(0.6 / 2.1)


def test_tokens_not_iterations_are_matched():
    # a run with half the tokens per iteration is compared at twice the iterations
    run = {0: _curve({20: 2.0, 40: 1.5})}
    base = {0: _curve({10: 2.2, 20: 1.4})}
    result = loss_penalty(run, base, 50, 100)
    assert [(p["tokens"], p["penalty"]) for p in result["points"]] == [(1000, pytest.approx(-0.2)),
                                                                        (2000, pytest.approx(0.1))]


def test_nothing_shared_is_a_one_line_error():
    with pytest.raises(ValueError, match="no seed in common"):
        loss_penalty({1: _curve({10: 1.0})}, {0: _curve({10: 1.0})}, 1, 1)
    with pytest.raises(ValueError, match="same number of tokens"):
        loss_penalty({0: _curve({10: 1.0})}, {0: _curve({20: 1.0})}, 1, 1)


@settings(max_examples=50, deadline=None)
@given(losses=st.lists(st.floats(0.01, 20), min_size=2, max_size=5), shift=st.floats(-1, 1), seeds=st.integers(1, 4))
def test_a_curve_shifted_by_c_has_penalty_c_and_no_spread(losses, shift, seeds):
    base = {s: _curve({(i + 1) * 3: loss + s for i, loss in enumerate(losses)}) for s in range(seeds)}
    run = {s: [{**r, "eval_loss": r["eval_loss"] + shift} for r in rows] for s, rows in base.items()}
    result = loss_penalty(run, base, 7, 7)
    for point in result["points"]:
        assert math.isclose(point["penalty"], shift, abs_tol=1e-9)
        assert point["spread"] is None if seeds == 1 else point["spread"] < 1e-9


@pytest.mark.usefixtures("one_thread")
@pytest.mark.timeout(300)
def test_converge_diloco_runs_and_tta_reports_each_penalty_with_the_seeds_spread(tmp_path, capsys):
    store = str(tmp_path / "s.sqlite")
    common = ["converge", "--workload", "transformer", "--width", "0.125", "--workers", "2", "--batch-size", "2",
              "--iterations", "8", "--eval-every", "4", "--eval-samples", "8", "--data", "synthetic",
              "--seeds", "2", "--threads", "1", "--store", store, "--no-replay", "--optimizer", "adamw", "--lr", "3e-3"]
    assert main([*common, "--compressors", "none"]) == 0
    capsys.readouterr()
    for h, outer in (("2", ["--outer-compressor", "topk", "--outer-density", "0.1"]), ("4", []),
                     ("4", ["--outer-compressor", "sidco-e", "--outer-density", "0.1"])):
        assert main([*common, "--sync-every", h, *outer, "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        assert document["diloco"]["sync_every"] == int(h)
    capsys.readouterr()
    assert main(["tta", "--convergence", "latest", "--nodes", "2", "--bandwidth", "1Gbit", "--target-loss", "1",
                 "--store", store, "--json"]) == 0
    penalty = json.loads(capsys.readouterr().out)["loss_penalty"]
    assert penalty["diloco_run"] and len(penalty["baseline"]["convergence_ids"]) == 2
    variants = [(v["sync_every"], v["outer_compressor"]) for v in penalty["variants"]]
    assert variants == [(2, "topk"), (4, "none"), (4, "sidco-e")]
    for v in penalty["variants"]:
        assert v["reason"] is None and v["seeds"] == [0, 1]
        assert [p["tokens"] for p in v["points"]] == [4 * 2 * 2 * 64, 8 * 2 * 2 * 64]
        assert v["final"]["spread"] is not None and math.isfinite(v["final"]["penalty"])
    assert main(["tta", "--convergence", "latest", "--nodes", "2", "--bandwidth", "1Gbit", "--target-loss", "1",
                 "--store", store]) == 0
    text = capsys.readouterr().out
    assert "DiLoCo loss penalty against synchronous training at equal tokens" in text and " ± " in text
    assert "sidco-e@0.1" in text


@pytest.mark.parametrize("extra, message", [
    (["--sync-every", "0"], "--sync-every 0"),
    (["--outer-compressor", "topk"], "add --sync-every"),
    (["--sync-every", "3"], "multiple of --sync-every 3"),
    (["--sync-every", "2", "--compressors", "topk"], "--outer-compressor"),
    (["--sync-every", "2", "--outer-compressor", "zip"], "unknown compressor"),
    (["--sync-every", "2", "--outer-momentum", "1"], "--outer-momentum"),
    (["--sync-every", "2", "--outer-compressor", "fp16", "--outer-density", "0.1"], "takes no --outer-density"),
])
def test_bad_diloco_flags_end_in_one_line_and_exit_code_2(tmp_path, capsys, extra, message):
    assert main(["converge", "--workload", "transformer", "--iterations", "8", "--eval-every", "4",
                 "--store", str(tmp_path / "s.sqlite"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err
