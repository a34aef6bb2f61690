"""Goldens: the figures and verdicts of documented commands' ``--json`` outputs, held still.

A redesign that moves no number (issue 32) proves it here: each case runs one command from
README.md or docs/usage.md in process and compares its iteration times (seconds), their band
endpoints, speed-ups (×), time to target (seconds) and verdicts with ``tests/goldens/NAME.json``.
Rows are keyed by compressor and density, the density ``None`` for a compressor that takes
none, so a change of label rule or of how "no density" is spelled is not a change of figure.
``SIDCO_GOLDENS=write`` rewrites the files from what the code computes now.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from sidco.cli import main

GOLDENS = Path(__file__).parent / "goldens"
WRITE = os.environ.get("SIDCO_GOLDENS") == "write"

FIGURES = ("iteration_s", "iteration_s_low", "iteration_s_high", "speedup", "speedup_low", "speedup_high",
           "exposed_comm_s", "compress_s", "wire_bytes", "cost_source", "compute_band", "cost_band")
TTA_FIGURES = ("iteration_s", "iteration_s_low", "iteration_s_high", "iterations_to_target", "time_to_target_s",
               "time_to_target_s_low", "time_to_target_s_high", "reason")

README_COMPARE = ["compare", "--layout", "resnet50", "--device", "a100", "--nodes", "8", "--bandwidth", "10Gbit",
                  "--compressors", "none,fp16,powersgd,topk,dgc,sidco-e", "--densities", "0.01"]
CASES: dict[str, list[str]] = {
    "compare_readme": README_COMPARE,
    "compare_readme_measured": [*README_COMPARE, "--samples-per-s", "1590"],
    "compare_bert_tokens": ["compare", "--layout", "bert-base", "--device", "a100", "--nodes", "16", "--bandwidth",
                            "25Gbit", "--densities", "0.1,0.01,0.001", "--tokens", "256"],
    "simulate_gpt2_powersgd": ["simulate", "--layout", "gpt2", "--nodes", "16", "--bandwidth", "25Gbit",
                               "--compressor", "powersgd", "--density", "1", "--rank", "4"],
    "simulate_resnet50_h200": ["simulate", "--layout", "resnet50", "--batch-size", "64", "--nodes", "8",
                               "--bandwidth", "1Gbit", "--compressor", "topk", "--density", "0.01", "--device", "h200"],
    "simulate_fp16": ["simulate", "--layout", "resnet50", "--device", "a100", "--nodes", "8", "--bandwidth", "10Gbit",
                      "--compressor", "fp16"],
    "sweep_resnet50": ["sweep", "--layout", "resnet50", "--device", "a100", "--nodes", "2,8", "--bandwidth",
                       "1Gbit,25Gbit", "--compressors", "none,fp16,topk,powersgd", "--densities", "0.01,0.001",
                       "--no-progress"],
}


def _density(compressor: str, density: Any) -> float | None:
    """The row's density, ``None`` for a compressor whose message ignores it."""
    from pipeline.request import takes_density

    return float(density) if density is not None and takes_density(compressor) else None


def _key(row: dict[str, Any], *axes: str) -> str:
    return "|".join([*(f"{row[a]:g}" for a in axes), row["compressor"], str(_density(row["compressor"],
                                                                                      row.get("density")))])


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: row[name] for name in names if name in row}


def _verdict(verdict: dict[str, Any]) -> dict[str, Any]:
    """A verdict with its density spelled by :func:`_density`."""
    out = dict(verdict)
    if "compressor" in out and out.get("compressor") is not None:
        out["density"] = _density(out["compressor"], out.get("density"))
    return out


def figures(name: str, document: Any) -> dict[str, Any]:
    """What the golden of case ``name`` holds of its ``--json`` ``document``."""
    if name.startswith("simulate"):
        return {_key(document): _pick(document, FIGURES)}
    if name.startswith("compare"):
        return {"rows": {_key(r): _pick(r, FIGURES) for r in document["rows"]},
                "verdict": _verdict(document["verdict"])}
    if name.startswith("sweep"):
        return {"rows": {_key(r, "nodes", "bandwidth_bps"): _pick(r, FIGURES) for r in document["rows"]},
                "findings": [{**f, "verdict": _verdict(f["verdict"])} for f in document["findings"]]}
    return {"rows": {_key(r): _pick(r, TTA_FIGURES) for r in document["rows"]},
            **{k: document[k] for k in ("margin_s", "margin_ratio", "band_s", "within_error", "reason")},
            "winner": None if document["winner"] is None else _key(document["winner"]),
            "leader": None if document["leader"] is None else _key(document["leader"])}


def _same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool) and isinstance(got, (int, float)):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _check(name: str, document: Any) -> None:
    held = json.loads(json.dumps(figures(name, document)))
    path = GOLDENS / f"{name}.json"
    if WRITE:
        GOLDENS.mkdir(exist_ok=True)
        path.write_text(json.dumps(held, indent=1, sort_keys=True) + "\n")
        return
    _same(held, json.loads(path.read_text()), name)


def _run(argv: list[str], tmp_path: Path, capsys) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json", "--store", str(tmp_path / "results.sqlite")]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_documented_commands_keep_their_figures(name, tmp_path, capsys):
    _check(name, _run(CASES[name], tmp_path, capsys))


def test_tta_from_curves_keeps_its_figures(tmp_path, capsys):
    """``sidco tta --curves FILE --layout resnet50 --device a100`` (docs/usage.md) over test_tta's hand-made table."""
    sys.path.insert(0, str(Path(__file__).parent))
    from convergence import curves
    from test_tta import _rows

    (tmp_path / "c.json").write_text(json.dumps(curves.document("hand-made", _rows())))
    _check("tta_curves_layout", _run(["tta", "--curves", str(tmp_path / "c.json"), "--layout", "resnet50",
                                      "--device", "a100", "--nodes", "8", "--bandwidth", "10Gbit",
                                      "--target-accuracy", "0.6"], tmp_path, capsys))


@pytest.fixture(scope="module")
def gpu_trace(tmp_path_factory) -> str:
    """A seeded synthetic trace whose timings say it was captured on an unnamed GPU (``cuda:0``)."""
    from traces.synthetic import synthetic

    trace = synthetic(tmp_path_factory.mktemp("golden") / "trace", "laplace", 60_000, workers=2, iterations=2,
                      seed=3, layers=[("conv", (100, 400)), ("fc", (200, 100))],
                      timings={"forward_s": 0.004, "backward_s": [0.005, 0.003], "optimizer_s": 0.001,
                               "batch_size": 32, "device": "cuda:0", "measured": True})
    return str(trace.path)


def test_a_trace_kept_on_its_gpu_keeps_its_figures(gpu_trace, tmp_path, capsys):
    """``sidco simulate --trace DIR``: a trace captured on a GPU keeps its own timings (device ``cuda``)."""
    _check("simulate_trace_cuda", _run(["simulate", "--trace", gpu_trace, "--nodes", "8", "--bandwidth", "10Gbit",
                                        "--compressor", "none"], tmp_path, capsys))


def test_a_trace_projected_onto_a_gpu_keeps_its_figures(gpu_trace, tmp_path, capsys):
    """``sidco compare --trace DIR --device a100``: the trace's timings kept, costs from the A100's model."""
    _check("compare_trace_a100", _run(["compare", "--trace", gpu_trace, "--device", "a100", "--nodes", "8",
                                       "--bandwidth", "10Gbit", "--compressors", "topk,sidco-e", "--densities",
                                       "0.01"], tmp_path, capsys))
