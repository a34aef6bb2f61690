"""One scenario, three commands, one answer: ``sidco sweep``, ``sidco compare`` and ``sidco simulate``
project the same iteration times and reach the same verdict (issue 44, item 2).

The scenario is the issue's: ResNet-50 on 2 A100s at 100 Gbit/s, Top-k at 0.01 alone asked. A sweep
that neither simulated nor judged ``none`` called Top-k (0.96x of ``none``) a clear winner, while
``simulate`` said it was within the model's error of no compression.
"""

from __future__ import annotations

import json
import math

from sidco.cli import main

SCENARIO = ["--layout", "resnet50", "--device", "a100", "--nodes", "2", "--bandwidth", "100Gbit",
            "--fidelity", "analytic"]


def _json(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_sweep_compare_and_simulate_agree_on_one_scenario(tmp_path, capsys):
    store = ["--store", str(tmp_path / "r.sqlite"), "--json"]
    swept = _json(["sweep", *SCENARIO, "--compressors", "topk", "--densities", "0.01", "--jobs", "1",
                   "--no-progress", *store], capsys)
    compared = _json(["compare", *SCENARIO, "--compressors", "topk", "--densities", "0.01", *store], capsys)

    rows = {r["label"]: r for r in compared["rows"]}
    assert set(rows) == {"none", "fp16", "powersgd", "topk@0.01"}
    stored = {(r["compressor"], r["density"] if r["compressor"] == "topk" else None): r for r in swept["rows"]}
    for label, row in rows.items():
        key = (row["compressor"], row["density"])
        assert key in stored, f"the sweep did not simulate {label}"
        for field in ("iteration_s", "iteration_s_low", "iteration_s_high", "speedup"):
            assert math.isclose(stored[key][field], row[field], rel_tol=1e-12), (label, field)
        alone = _json(["simulate", *SCENARIO, "--compressor", row["compressor"],
                       *(["--density", str(row["density"])] if row["density"] is not None else []), *store], capsys)
        assert math.isclose(alone["iteration_s"], row["iteration_s"], rel_tol=1e-12), label

    (found,) = swept["findings"]
    judged, said = found["verdict"], compared["verdict"]
    for field in ("call", "decision", "winner", "tied"):
        assert judged[field] == said[field], field
    # the scenario: Top-k at 0.01 is no faster than no compression, within the model's error
    assert said["decision"] == "don't compress" and said["text"].startswith("don't compress")

    topk = _json(["simulate", *SCENARIO, "--compressor", "topk", "--density", "0.01", *store], capsys)
    assert topk["verdict"]["decision"] == "don't compress"
