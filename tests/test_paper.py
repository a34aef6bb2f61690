"""docs/paper.md's command: the SIDCo paper's setting in its PyTorch era and today (analytic fidelity, seconds)."""

from __future__ import annotations

import json

import pytest

from costs import costmodel, devices
from sidco.cli import main


def test_the_era_device_is_todays_v100_with_the_single_block_topk():
    then, today = devices.get("v100@pytorch-1.3"), devices.get("v100")
    assert then.topk_s(0.001) == pytest.approx(2.5576 / 100 / 2e6) and "22812" in then.sources["topk_s_per_element"]
    assert then.memory_bandwidth_Bps == today.memory_bandwidth_Bps and then.launch_s == today.launch_s
    n = 25_557_032  # ResNet-50 as one bucket: the old top-k alone is 0.33 s, today's the model's 20 bytes per element
    assert costmodel.call_seconds("topk", n, 0.001, then)[0] > 100 * costmodel.call_seconds("topk", n, 0.001, today)[0]
    assert costmodel.call_seconds("sidco-e", n, 0.001, then) == costmodel.call_seconds("sidco-e", n, 0.001, today)
    with pytest.raises(ValueError, match="era"):
        devices.get("v100@pytorch-0.1")


def test_paper_command_prints_both_eras_beside_the_papers_figures(tmp_path, capsys):
    argv = ["paper", "--layouts", "resnet50", "--densities", "0.001", "--store", str(tmp_path / "p.sqlite")]
    assert main(argv + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {r["era"] for r in result["rows"]} == {"then", "today"} and len(result["rows"]) == 4
    summary = result["summary"]
    assert {b: summary[b]["paper"] for b in summary} == {"none": 41.7, "topk": 7.6, "dgc": 1.9}
    for entry in summary.values():
        for era in ("then", "today"):
            assert entry[era]["low"] <= entry[era]["speedup"] <= entry[era]["high"]
    # only the kernels changed: the same iteration without compression, a slower Top-k then
    for then, today in zip(result["rows"][0::2], result["rows"][1::2]):
        assert then["iteration_s"]["none"] == today["iteration_s"]["none"]
        assert then["iteration_s"]["topk"] > 2 * today["iteration_s"]["topk"]
    assert summary["topk"]["then"]["speedup"] > 1.5 * summary["topk"]["today"]["speedup"]
    assert len(result["verdict"]) == 3 and result["verdict"][1].startswith("over Top-k: paper up to 7.6")
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "over DGC: paper up to 1.9" in text and "then" in text and "today" in text


def test_every_conclusion_says_what_it_rests_on_and_none_is_drawn_from_a_band_across_1(tmp_path, capsys):
    argv = ["paper", "--layouts", "resnet50", "--densities", "0.001", "--store", str(tmp_path / "p.sqlite"), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    names = {"none": "no compression", "topk": "Top-k", "dgc": "DGC"}
    for baseline, entry in result["summary"].items():
        (line,) = [v for v in result["verdict"] if v.startswith(f"over {names[baseline]}: ")]
        for era, name in (("then", "PyTorch-1.3-era projection"), ("today", "today")):
            best = entry[era]
            found = best["settle"]
            assert found["command"].startswith("sidco ") and found["name"] in line
            spans = best["low"] <= 1.0 <= best["high"]
            part = line.split(f"{name} up to ", 1)[1].split("); today up to")[0] if era == "then" else \
                line.split("today up to ", 1)[1]
            assert ("undecided: the band spans 1x, so no conclusion" in part) == spans
            assert ("SIDCo is faster" in part) == (best["low"] > 1.0)
