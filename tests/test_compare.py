"""``sidco compare`` and the verdict: every pair ranked beside the dense baselines, ties not called."""

from __future__ import annotations

import json

import pytest

import compressors
from pipeline import verdict as judge
from pipeline.compare import ALWAYS, pairs
from sidco.cli import main

SCENARIO = ["--layout", "resnet50", "--device", "a100", "--nodes", "8", "--bandwidth", "10Gbit"]


def _row(name: str, density: float | None, seconds: float, **band: float) -> dict:
    return {"compressor": name, "density": density, "iteration_s": seconds, **band}


def test_baselines_are_the_compressors_that_do_not_sparsify():
    """The dense baselines (no compression, the casts, PowerSGD: what PyTorch ships) take no
    density; a quantizer takes none either but is a compressor to rank, not a baseline."""
    assert set(judge.BASELINES) == {n for n in compressors.names()
                                    if not compressors.takes_density(n) and compressors.message_kind(n) != "quantized"}


def test_pairs_add_the_baselines_and_give_density_free_compressors_once():
    got = pairs(["topk", "fp16", "sidco-e"], [0.01, 0.001])
    assert got == [("none", None), ("fp16", None), ("powersgd", None), ("topk", 0.01), ("sidco-e", 0.01),
                   ("topk", 0.001), ("sidco-e", 0.001)]
    with pytest.raises(ValueError, match="unknown compressor"):
        pairs(["nope"], [0.01])


def test_margin_without_band_calls_a_winner_at_5_percent_or_more():
    rows = [_row("none", None, 0.300), _row("fp16", None, 0.200), _row("topk", 0.01, 0.100),
            _row("dgc", 0.01, 0.106)]
    v = judge.judge(rows)
    assert v["call"] == "winner" and v["winner"] == "topk@0.01" and v["runner_up"] == "dgc@0.01"
    assert v["margin_over_runner_up"] == pytest.approx(1.06)
    assert v["best_baseline"] == "fp16" and v["margin_over_baseline"] == pytest.approx(2.0)
    assert v["basis"] == "5% margin" and "no error band" in v["text"]
    assert v["decision"] == "compress" and v["text"].startswith(
        "compress with topk@0.01 (about 2.0x over sending the whole gradient, fp16)")


def test_near_tie_is_too_close_to_call():
    """8 V100s at 1 Gbit/s, as reported: four configurations within 1 % of each other."""
    rows = [_row("none", None, 2.0), _row("randomk", 0.001, 0.1000), _row("dgc", 0.001, 0.1004),
            _row("topk", 0.001, 0.1006), _row("powersgd", None, 0.1009)]
    v = judge.judge(rows)
    assert v["call"] == "too close to call"
    assert v["tied"] == ["randomk@0.001", "dgc@0.001", "topk@0.001", "powersgd"]
    assert v["text"].startswith("compress: randomk@0.001, dgc@0.001, topk@0.001 and powersgd are too close to call "
                                "(19.8-20.0x over sending the whole gradient, none)")


def test_error_band_decides_when_present():
    """A 6 % margin is called when the bands do not overlap, a 2 % one never; a 20 % one is not when they overlap."""
    tight = [_row("topk", 0.01, 1.00, iteration_s_low=0.99, iteration_s_high=1.005),
             _row("none", None, 1.02, iteration_s_low=1.01, iteration_s_high=1.03)]
    v = judge.judge(tight)
    assert v["call"] == "too close to call" and v["basis"] == "error band"  # 2 %: under the 5 % floor
    apart = [{**tight[0]}, _row("none", None, 1.06, iteration_s_low=1.05, iteration_s_high=1.07)]
    v = judge.judge(apart)
    assert v["call"] == "winner" and v["basis"] == "error band" and v["decision"] == "compress"
    wide = [_row("topk", 0.01, 1.00, iteration_s_low=0.7, iteration_s_high=1.3),
            _row("none", None, 1.20, iteration_s_low=0.9, iteration_s_high=1.5)]
    v = judge.judge(wide)
    assert v["call"] == "too close to call" and v["decision"] == "don't compress"
    assert v["text"].startswith("don't compress: nothing beats none beyond the error band; too close to call: ")


def test_compare_json_has_the_verdict_and_a_row_per_pair(capsys, tmp_path):
    store = str(tmp_path / "r.sqlite")
    assert main(["compare", *SCENARIO, "--compressors", "topk,sidco-e", "--densities", "0.01,0.001",
                 "--store", store, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert sorted(r["label"] for r in rows) == sorted(
        ["none", "fp16", "powersgd", "topk@0.01", "topk@0.001", "sidco-e@0.01", "sidco-e@0.001"])
    assert [r["rank"] for r in rows] == list(range(1, 8))
    assert [r["iteration_s"] for r in rows] == sorted(r["iteration_s"] for r in rows)
    best_dense = min(r["iteration_s"] for r in rows if r["compressor"] in ALWAYS)
    for r in rows:
        assert r["speedup_over_baseline"] == pytest.approx(best_dense / r["iteration_s"])
        assert (r["cost_source"] is None) == (r["compressor"] == "none")
    plain = judge.judge(rows)
    assert {k: v for k, v in out["verdict"].items() if k not in ("text", "settle")} == {
        k: v for k, v in plain.items() if k not in ("text", "settle")}
    assert out["verdict"]["text"].startswith(plain["text"]) and out["verdict"]["settle"]["command"].startswith("sidco ")
    # each row is the projection `sidco simulate` makes of that pair alone
    topk = next(r for r in rows if r["label"] == "topk@0.001")
    assert main(["simulate", *SCENARIO, "--compressor", "topk", "--density", "0.001", "--fidelity", "analytic",
                 "--store", store, "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["iteration_s"] == topk["iteration_s"] and alone["speedup"] == topk["speedup"]


def test_compare_prints_ranked_table_and_verdict(capsys, tmp_path):
    """The default output fits 120 columns and opens its verdict with the decision; --wide has every column."""
    assert main(["compare", *SCENARIO, "--compressors", "topk", "--densities", "0.01",
                 "--store", str(tmp_path / "r.sqlite")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    (verdict,) = [i for i, line in enumerate(lines) if line.startswith("verdict: ")]
    assert lines[verdict].startswith(("verdict: compress", "verdict: don't compress"))
    assert all(line.startswith("  ") for line in lines[verdict + 1:])  # the verdict's wrapped lines
    (head,) = [i for i, line in enumerate(lines) if "iter ms" in line]
    assert "vs dense" in lines[head] and "fwd ms" not in lines[head] and lines[head].endswith("from")
    table = lines[head + 1:head + 5]
    assert [line.split()[1] for line in table] == sorted(["none", "fp16", "powersgd", "topk@0.01"],
                                                         key=[line.split()[1] for line in table].index)
    assert any(line.startswith("c1: costs from model a100") for line in lines)
    assert any(line.startswith("q1: quality from shipped table") for line in lines)
    assert "one-way latency" in lines[0]
    assert main(["compare", *SCENARIO, "--compressors", "topk", "--densities", "0.01", "--wide",
                 "--store", str(tmp_path / "r.sqlite")]) == 0
    wide = capsys.readouterr().out.splitlines()
    (head,) = [line for line in wide if "iter ms" in line]
    assert "fwd ms" in head and "idle ms" in head and "ach δ" in head and head.endswith("costs from | quality from")


def test_rtt_is_twice_the_one_way_latency(capsys, tmp_path):
    """--rtt 100us projects what --latency 50us does; both at once is one line and exit code 2."""
    store = ["--store", str(tmp_path / "r.sqlite"), "--json"]
    outputs = []
    for latency in (["--latency", "50us"], ["--rtt", "100us"]):
        assert main(["simulate", *SCENARIO, *latency, "--compressor", "topk", "--density", "0.01", *store]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0]["iteration_s"] == outputs[1]["iteration_s"]
    with pytest.raises(SystemExit) as stopped:  # argparse refuses the pair
        main(["compare", *SCENARIO, "--latency", "5us", "--rtt", "10us", *store])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rtt" in err and "--latency" in err


def test_compare_bad_input_is_one_line(capsys, tmp_path):
    assert main(["compare", *SCENARIO, "--densities", "2", "--store", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "density" in err and not (tmp_path / "r.sqlite").exists()


def test_the_verdict_never_asks_to_measure_one_uncompressed_baseline_against_another(capsys, tmp_path):
    """At 100 Gbit/s on 2 nodes none, fp16 and bf16 are within each other's bands: what would settle the
    decision weighs the fastest of them against a compressor, never fp16 against bf16 or none."""
    assert main(["compare", "--layout", "resnet50", "--device", "a100", "--nodes", "2", "--bandwidth", "100Gbit",
                 "--compressors", "bf16,topk", "--densities", "0.01", "--store", str(tmp_path / "r.sqlite"),
                 "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert verdict["decision"] == "don't compress" and {"fp16", "bf16"} <= set(verdict["tied"])
    found = verdict["settle"]
    uncompressed = {"none", "fp16", "bf16"}
    assert found is not None and len({found["winner"], found["runner_up"]} & uncompressed) == 1, found


def test_the_verdict_never_calls_a_configuration_that_does_not_fit():
    """The memory gate: the fastest row does not fit in one GPU's memory, so the verdict calls the next
    one and names it apart; when none fits, it judges by speed alone and says so."""
    from pipeline.verdict import judge

    def row(compressor, density, seconds, fits):
        label = compressor if density is None else f"{compressor}@{density:g}"
        return {"compressor": compressor, "density": density, "label": label, "iteration_s": seconds, "fits": fits}

    rows = [row("topk", 0.01, 1.0, False), row("sidco-e", 0.01, 2.0, True), row("none", None, 6.0, True)]
    verdict = judge(rows)
    assert verdict["winner"] == "sidco-e@0.01" and verdict["does_not_fit"] == ["topk@0.01"]
    assert verdict["margin_over_uncompressed"] == 3.0 and "does not fit in one GPU's memory: topk@0.01" in verdict["text"]
    none_fit = judge([{**r, "fits": False} for r in rows])
    assert none_fit["winner"] == "topk@0.01" and "no configuration fits in one GPU's memory" in none_fit["text"]
