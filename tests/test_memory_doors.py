"""Memory per GPU on every door (issue 45 item 4): ``simulate``, ``sweep`` and ``tta`` rows and the
Sweeps page carry the ``memory_gib`` ``sidco compare --json`` gives the same configuration, against
the device's capacity; a configuration that does not fit is marked and never called by their verdicts.

The cluster: Llama-3.1-8B under HSDP on 4 × 8 H100, 2 sequences of 5,400 tokens per GPU, where the
dense rows fit in an H100's 80 GB (72.4 GiB of 74.5) and a sparsifier's error-feedback residual on the
gradient shard (4 bytes × Ψ/8 more) does not, though its iterations are the fastest."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from pathlib import Path

import pytest

from sidco.cli import main
from traces import llm

CLUSTER = ["--model", "llama-3.1-8b", "--device", "h100", "--nodes", "4", "--gpus-per-node", "8", "--parallel", "hsdp",
           "--bandwidth", "100Gbit", "--batch-size", "2", "--tokens", "5400"]
H100_GIB = 80e9 / 2**30


def _json(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("memory") / "r.sqlite"


@pytest.fixture(scope="module")
def compared(store) -> dict[str, dict]:
    """``sidco compare --json``'s rows of the cluster by compressor: the reference every door meets."""
    rows = _json(["compare", *CLUSTER, "--compressors", "none,bf16,topk", "--densities", "0.01",
                  "--store", str(store)])["rows"]
    return {row["compressor"]: row for row in rows}


def test_the_reference_fits_the_dense_rows_and_not_the_residual(compared):
    """The cluster is the one the module says: the residual on the gradient shard, 4Ψ/8 bytes, tips topk over."""
    numel = llm.parameter_count(llm.load("llama-3.1-8b"))
    assert compared["topk"]["memory_gib"] - compared["none"]["memory_gib"] == pytest.approx(4 * numel / 8 / 2**30,
                                                                                            rel=1e-3)
    assert {name: row["fits"] for name, row in compared.items()} == {"none": True, "bf16": True, "fp16": True,
                                                                     "topk": False, "powersgd": False}
    assert compared["topk"]["iteration_s"] < min(compared[name]["iteration_s"] for name in ("none", "bf16"))


def test_simulate_carries_compares_memory_and_its_verdict_never_calls_what_does_not_fit(store, compared, capsys):
    for name in ("none", "topk"):
        flags = ["--density", "0.01"] if name == "topk" else []
        result = _json(["simulate", *CLUSTER, "--compressor", name, *flags, "--fidelity", "analytic",
                        "--store", str(store)])
        for key in ("memory_gib", "memory_parts_gib", "activations_counted", "memory_capacity_gib", "fits"):
            assert result[key] == compared[name][key], (name, key)
    assert result["memory_capacity_gib"] == pytest.approx(H100_GIB)
    verdict = result["verdict"]  # topk@0.01 is faster than none but does not fit
    assert verdict["does_not_fit"] == ["topk@0.01"] and verdict["winner"] == "none"
    assert verdict["decision"] == "don't compress"
    assert main(["simulate", *CLUSTER, "--compressor", "topk", "--density", "0.01", "--fidelity", "analytic",
                 "--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert (f"  memory/GPU     {compared['topk']['memory_gib']:.1f} GiB of {H100_GIB:.1f} GiB: does not fit "
            "(parameters, gradients, optimizer states, compressor state and activations)") in text
    assert "does not fit in one GPU's memory: topk@0.01" in text


def test_sweep_rows_carry_compares_memory_and_its_best_and_verdict_fit(tmp_path, compared, capsys):
    argv = ["sweep", *CLUSTER, "--compressors", "none,bf16,topk", "--densities", "0.01", "--jobs", "1",
            "--no-progress", "--store", str(tmp_path / "r.sqlite")]
    summary = _json(argv)
    assert summary["memory_capacity_gib"] == pytest.approx(H100_GIB)
    assert {row["compressor"] for row in summary["rows"]} == set(compared)
    for row in summary["rows"]:
        for key in ("memory_gib", "memory_parts_gib", "activations_counted", "memory_capacity_gib", "fits"):
            assert row[key] == compared[row["compressor"]][key], (row["compressor"], key)
    (found,) = summary["findings"]
    assert found["best"] in ("none", "bf16", "fp16") and found["fits"] is True
    assert found["memory_gib"] == compared[found["best"]]["memory_gib"]
    assert set(found["verdict"]["does_not_fit"]) == {"topk@0.01", "powersgd"}
    assert found["verdict"]["winner"] not in found["verdict"]["does_not_fit"]
    assert main(argv) == 0  # resumed: the stored rows read back the same in the text summary
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.split()[:2] == ["#", "nodes"])
    assert head.endswith("mem GiB")
    assert lines[lines.index(head) + 1].endswith(f" {found['memory_gib']:.1f}")
    assert "verdict: don't compress" in " ".join(" ".join(lines).split())
    assert "does not fit in one GPU's memory: powersgd and topk@0.01" in " ".join(" ".join(lines).split())


def test_a_sweep_row_stored_before_memory_says_why_it_has_none(tmp_path):
    """A scenario whose stored result_json has no memory (stored before sweeps recorded it) reads back
    with the memory keys null and memory_reason, and its verdict judges it on speed alone."""
    store = tmp_path / "r.sqlite"
    argv = ["sweep", "--layout", "resnet50", "--device", "a100", "--nodes", "2", "--bandwidth", "1Gbit",
            "--compressors", "none,topk", "--densities", "0.01", "--jobs", "1", "--no-progress", "--store", str(store)]
    fresh = _json(argv)
    assert all(row["fits"] is True and "memory_reason" not in row for row in fresh["rows"])
    raw = sqlite3.connect(store)
    with raw:
        for key, text in raw.execute("SELECT scenario_key, result_json FROM scenarios").fetchall():
            older = {k: v for k, v in json.loads(text).items() if not k.startswith("memory") and k not in
                     ("activations_counted", "fits")}
            raw.execute("UPDATE scenarios SET result_json=? WHERE scenario_key=?", (json.dumps(older), key))
    raw.close()
    again = _json(argv)
    assert again["computed"] == 0
    for row in again["rows"]:
        assert row["memory_gib"] is None and row["fits"] is None
        assert row["memory_reason"].startswith("not recorded: this scenario was stored before")
    assert again["findings"][0]["verdict"]["winner"] == fresh["findings"][0]["verdict"]["winner"]


def test_tta_rows_carry_compares_memory_and_its_verdict_never_names_what_does_not_fit(tmp_path, store, compared,
                                                                                       capsys):
    rows = [{"compressor": name, "density": density, "iteration": step, "loss": loss, "accuracy": 0.5,
             "eval_loss": loss} for name, density in (("none", None), ("bf16", None), ("topk", 0.01))
            for step, loss in ((100, 2.0), (200, 1.0))]
    curves = tmp_path / "c.json"
    curves.write_text(json.dumps({"source": "hand-made", "rows": rows}))
    argv = ["tta", "--curves", str(curves), *CLUSTER, "--target-loss", "1.5", "--store", str(store)]
    result = _json(argv)
    for row in result["rows"]:
        for key in ("memory_gib", "memory_parts_gib", "activations_counted", "memory_capacity_gib", "fits"):
            assert row[key] == compared[row["compressor"]][key], (row["compressor"], key)
    by = {row["label"]: row for row in result["rows"]}
    assert by["topk@0.01"]["time_to_target_s"] < min(by[name]["time_to_target_s"] for name in ("none", "bf16"))
    assert result["does_not_fit"] == ["topk@0.01"]
    assert result["leader"]["label"] == "bf16"
    assert main(argv) == 0
    text = capsys.readouterr().out
    topk = next(line for line in text.splitlines() if line.startswith("topk@0.01 "))
    assert f"{by['topk@0.01']['memory_gib']:>6.1f}!" in topk
    assert f"per GPU of {H100_GIB:.1f} GiB, ! = does not fit" in text
    assert text.rstrip().endswith("does not fit in one GPU's memory: topk@0.01")
    from dashboard.pages.tta import table_rows  # the Time-to-accuracy page's table shows the same

    shown = {row["label"]: row["memory"] for row in table_rows(result["rows"])}
    assert shown == {label: f"{row['memory_gib']:.1f}" + (" ✗ does not fit" if label == "topk@0.01" else "")
                     for label, row in by.items()}


def test_the_tta_verdict_judges_every_row_when_none_fits_and_says_so():
    from pipeline.tta import verdict, verdict_text

    rows = [{"compressor": name, "density": None, "label": name, "time_to_target_s": seconds, "time_spread_s": None,
             "iterations_to_target": 10, "fits": False} for name, seconds in (("none", 20.0), ("bf16", 10.0))]
    found = verdict(rows)
    assert found["winner"]["label"] == "bf16" and found["does_not_fit"] == ["none", "bf16"]
    text = verdict_text({**found, "target": {"accuracy": None, "loss": 1.5}})
    assert text.startswith("no configuration fits in one GPU's memory; by time to target alone: winner: bf16")
    assert text.endswith("does not fit in one GPU's memory: none and bf16")


def test_judging_by_time_to_accuracy_calls_only_rows_that_fit():
    """The verdict's time-to-accuracy step ranks only the rows the memory gate let through, even where the
    convergence table times one that does not fit."""
    from pipeline.verdict import _by_time_to_accuracy

    fitting = [{"compressor": "none", "density": None, "label": "none", "iteration_s": 1.0}]
    table = [{"compressor": "topk", "density": 0.01, "time_to_target_s": 5.0, "time_spread_s": None,
              "iterations_to_target": 5},
             {"compressor": "none", "density": None, "time_to_target_s": 50.0, "time_spread_s": None,
              "iterations_to_target": 50}]
    called = _by_time_to_accuracy(fitting, {"table": table, "target_accuracy": 0.6, "convergence_id": 1})
    assert called["winner"] == "none" and called["runner_up"] is None


def test_the_sweeps_page_marks_what_does_not_fit(tmp_path, compared):
    from dashboard.app import create_app
    from results.store import Store

    path = tmp_path / "r.sqlite"
    _json(["sweep", *CLUSTER, "--compressors", "none,topk", "--densities", "0.01", "--jobs", "1", "--no-progress",
           "--store", str(path)])
    with Store(path) as store:
        sweep_id = store.sweep_list()[0]["id"]
        axes = store.sweep_axes(sweep_id)
    app = create_app(path, cache_dir=tmp_path / "cache")
    key = next(k for k in app.callback_map if "sweep-memory" in k)
    spec = app.callback_map[key]
    values = {"sweep-select": sweep_id, "sweep-latency": axes["latency_s"][0], "sweep-topology": axes["topology"][0],
              "sweep-nodes": 4, "sweep-bandwidth": axes["bandwidth_bps"][0]}
    given = [{**item, "value": values.get(item["id"])} for item in spec["inputs"]]
    response = app.server.test_client().post("/_dash-update-component", json={
        "output": key, "outputs": [{"id": o.component_id, "property": o.component_property} for o in spec["output"]],
        "inputs": given, "state": [], "changedPropIds": ["sweep-select.value"]})
    assert response.status_code == 200
    table = json.dumps(response.get_json()["response"]["sweep-memory"])
    assert f"GiB per GPU (of {H100_GIB:.1f})" in table
    for name, label in (("none", "none"), ("topk", "topk@0.01"), ("powersgd", "powersgd"), ("fp16", "fp16")):
        mark = " \\u2717 does not fit" if compared[name]["fits"] is False else ""
        assert f'"{label}"' in table and f'"{compared[name]["memory_gib"]:.1f}{mark}"' in table


def test_the_sweeps_heatmap_names_the_fastest_that_fits_as_sweep_does(tmp_path, compared):
    """topk is the fastest here but does not fit: the heatmap's best per cell is the sweep's best."""
    from results.store import Store

    path = tmp_path / "r.sqlite"
    got = _json(["sweep", *CLUSTER, "--compressors", "none,bf16,topk", "--densities", "0.01", "--jobs", "1",
                 "--no-progress", "--store", str(path)])
    assert compared["topk"]["fits"] is False and compared["topk"]["iteration_s"] < compared["bf16"]["iteration_s"]
    with Store(path) as store:
        sweep_id = store.sweep_list()[0]["id"]
        axes = store.sweep_axes(sweep_id)
        rows = store.best_two(sweep_id, axes["latency_s"][0], axes["topology"][0])
    best = [r for r in rows if r["rank"] == 1]
    assert len(best) == len(got["findings"]) == 1
    assert best[0]["compressor"] == got["findings"][0]["best"] and best[0]["fits"] == 1
