"""``sidco tta`` says what it found in the words of issue 44 item 3, end to end over a small real
``sidco converge`` run: no compression is "no compression (none)", never "winner: none"; a margin
is "beyond" the seed spread and the error band; a target nobody reached says so in the words of
the notes beside each row."""

from __future__ import annotations

import json

import pytest

from pipeline.tta import verdict, verdict_text
from sidco.cli import main

CONVERGE = ["converge", "--workload", "resnet20", "--width", "0.25", "--batch-size", "8", "--workers", "2",
            "--iterations", "4", "--eval-every", "2", "--eval-samples", "16", "--compressors", "none,topk",
            "--densities", "0.1", "--json"]


@pytest.fixture(scope="module")
def converged(tmp_path_factory):
    """A store with one real convergence run (resnet20 at a quarter width, 4 iterations, none and topk@0.1)
    and the best held-out accuracy it reached."""
    store = tmp_path_factory.mktemp("tta-wording") / "r.sqlite"
    out = _cli(CONVERGE + ["--store", str(store)])
    best = max(r["accuracy"] for r in json.loads(out)["rows"] if r["accuracy"] is not None)
    return store, best


def _cli(argv: list[str]) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    return buffer.getvalue()


def _tta(converged, bandwidth: str, target: float) -> tuple[dict, str]:
    store, _ = converged
    argv = ["tta", "--store", str(store), "--nodes", "4", "--bandwidth", bandwidth, "--target-accuracy", f"{target:.4f}"]
    result = json.loads(_cli(argv + ["--json"]))
    lines = _cli(argv).splitlines()
    return result, next(line for line in lines if line.startswith("winner: "))


@pytest.mark.parametrize("bandwidth, leader", [("1Mbit", "topk"), ("400Gbit", "none")])
def test_the_winner_is_named_in_words_and_beats_its_runner_up_beyond_the_bands(converged, bandwidth, leader):
    """On a slow link Top-k leads; on a fast one no compression does (Top-k's selection costs, nothing
    to save): either way the verdict names "no compression (none)", never a bare "none"."""
    result, said = _tta(converged, bandwidth, converged[1])
    assert result["leader"]["compressor"] == leader
    assert "winner: none" not in said and "no compression (none)" in said
    if result["winner"] is not None:
        assert said.startswith("winner: no compression (none) reaches" if leader == "none" else "winner: topk@0.1")
        assert ", beyond the projection's error band (" in said and " and the projection's" not in said


def test_a_target_nobody_reached_says_so_as_the_notes_do(converged):
    result, said = _tta(converged, "1Gbit", min(1.0, converged[1] + 0.5))
    assert result["winner"] is None and all(r["time_to_target_s"] is None for r in result["rows"])
    assert said.startswith("winner: not named, no configuration reached held-out accuracy >= ")
    assert all(r["reason"].startswith("never reached accuracy") for r in result["rows"])


def test_the_only_configuration_that_reached_the_target_is_named_with_why_there_is_no_margin():
    rows = [{"compressor": "none", "density": None, "time_to_target_s": 2.0, "iterations_to_target": 20,
             "iteration_s": 0.1},
            {"compressor": "topk", "density": 0.01, "time_to_target_s": None, "iterations_to_target": None,
             "iteration_s": 0.05}]
    result = {**verdict(rows), "target": {"accuracy": 0.5, "loss": None}}
    assert verdict_text(result) == ("winner: no compression (none) reaches held-out accuracy >= 0.5 in 2 s (the only "
                                    "configuration that reached the target: no margin to judge)")
    nobody = {**verdict(rows[1:]), "target": {"accuracy": 0.5, "loss": None}}
    assert verdict_text(nobody) == "winner: not named, no configuration reached the target"
