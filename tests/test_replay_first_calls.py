"""``sidco replay`` reports each compressor's first calls apart from its steady state (``call_index``)."""

from __future__ import annotations

import json

import pytest

import traces
from sidco.cli import main
from pipeline.replay import FIRST_CALLS


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> traces.Trace:
    return traces.synthetic(tmp_path_factory.mktemp("t") / "lap", "laplace", numel=5_000, workers=2,
                            iterations=3, seed=4, layers=[("a", (3_000,)), ("b", (2_000,))])


def test_summary_splits_first_calls_from_steady_state(trace, tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    assert main(["replay", str(trace.path), "--compressors", "sidco-e,topk", "--densities", "0.01",
                 "--store", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for item in out["summary"]:
        rows = [r for r in out["rows"] if r["compressor"] == item["compressor"]]
        first = [r["achieved_over_target"] for r in rows if r["call_index"] < FIRST_CALLS]
        steady = [r["achieved_over_target"] for r in rows if r["call_index"] >= FIRST_CALLS]
        assert item["first_calls"] == len(first) == FIRST_CALLS and item["steady_calls"] == len(steady) == 4
        assert item["first_mean_over_target"] == pytest.approx(sum(first) / len(first))
        assert item["steady_mean_over_target"] == pytest.approx(sum(steady) / len(steady))
        assert item["steady_low_over_target"] == min(steady) and item["steady_high_over_target"] == max(steady)
    assert main(["replay", str(trace.path), "--compressors", "sidco-e,topk", "--densities", "0.01",
                 "--store", str(store)]) == 0
    table = capsys.readouterr().out
    assert "steady range" in table and f"first {FIRST_CALLS} calls" in table
