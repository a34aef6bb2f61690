"""``sidco tta`` ranks the DiLoCo runs of a configuration with its per-step pairs: a tiny real
``sidco converge`` family (the synchronous run and three DiLoCo variants, two seeds each), then
the ranking held to the closed form: inner steps to the target, found here from the stored
curves, × the time per inner step ``sidco compare`` projects for ``diloco`` on the same cluster
(itself ``inner step + outer exchange / H``), the spread being the seeds'."""

from __future__ import annotations

import json
import statistics

import pytest

from diloco_family import train
from pipeline import tta as pipeline_tta
from results.store import Store
from sidco.cli import main

VARIANTS = (("--sync-every", "2"), ("--sync-every", "4", "--eval-every", "4"),
            ("--sync-every", "4", "--eval-every", "4", "--outer-compressor", "topk", "--outer-density", "0.1"))
LABELS = {"--sync-every 2": "diloco H=2", "--sync-every 4 --eval-every 4": "diloco H=4",
          "--sync-every 4 --eval-every 4 --outer-compressor topk --outer-density 0.1": "diloco H=4 topk@0.1"}
CLUSTER = ["--nodes", "4", "--bandwidth", "10Gbit", "--sites", "2", "--wan-bandwidth", "100Mbit", "--wan-rtt", "20ms"]


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """The store, the convergence ids per run (one per seed), the synchronous run's trace and a
    target every seed of the synchronous run reaches (its worst last held-out loss)."""
    store = str(tmp_path_factory.mktemp("tta-diloco") / "s.sqlite")
    ids = train(store, VARIANTS)
    with Store(store) as s:
        curves = {name: [[r for r in s.convergence_rows(i) if r["eval_loss"] is not None] for i in runs]
                  for name, runs in ids.items()}
        trace = s.trace(s.convergence(ids["sync"][0])["trace_id"])["path"]
    target = max(seed[-1]["eval_loss"] for seed in curves["sync"])
    return {"store": store, "ids": ids, "curves": curves, "trace": trace, "target": target}


def _tta(family, capsys, *extra) -> dict:
    assert main(["tta", "--store", family["store"], *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _compare(family, capsys, *extra) -> dict:
    """``sidco compare`` of the synchronous run's trace on :data:`CLUSTER`: rows by label."""
    assert main(["compare", "--trace", family["trace"], *CLUSTER, "--store", family["store"], "--json", *extra]) == 0
    return {r["label"]: r for r in json.loads(capsys.readouterr().out)["rows"]}


def _reached(curve: list[dict], target: float) -> int | None:
    return next((r["iteration"] for r in curve if r["eval_loss"] <= target), None)


@pytest.mark.timeout(600)
def test_diloco_rows_are_inner_steps_times_compares_inner_step_ranked_with_the_per_step_pairs(family, capsys):
    target = family["target"]
    result = _tta(family, capsys, "--convergence", str(family["ids"]["sync"][0]), *CLUSTER,
                  "--target-loss", repr(target))
    rows = {r["label"]: r for r in result["rows"]}
    assert set(rows) == {"none", *LABELS.values()}
    seconds = {"none": _compare(family, capsys, "--compressors", "none")["none"]["iteration_s"]}
    for flags, label in LABELS.items():
        words = flags.split()
        outer = words[words.index("--outer-compressor"):] if "--outer-compressor" in words else []
        h = int(words[1])
        projected = _compare(family, capsys, "--compressors", "diloco", "--sync-every", str(h), *outer)
        (strategy,) = [r for r in projected.values() if r["compressor"] == "diloco"]
        assert strategy["iteration_s"] == pytest.approx(strategy["inner_step_s"] + strategy["outer_exchange_s"] / h)
        seconds[label] = strategy["iteration_s"]
        row = rows[label]
        assert (row["sync_every"], row["outer_compressor"]) == (h, "topk" if outer else "none")
        assert row["utilization"] == pytest.approx(strategy["utilization"])
        assert row["convergence_ids"] == family["ids"][flags]
        assert f"synchronous convergence {family['ids']['sync'][0]}" in row["time_source"]
    assert rows["none"]["sync_every"] == 1 and rows["none"]["outer_compressor"] is None
    expected = {}
    for name, label in {"sync": "none", **LABELS}.items():
        steps = [_reached(curve, target) for curve in family["curves"][name]]
        row = rows[label]
        assert row["seeds"] == 2 and row["iteration_s"] == pytest.approx(seconds[label])
        if None in steps:
            assert row["time_to_target_s"] is None and "never reached held-out loss" in row["reason"]
            continue
        mean, spread = statistics.mean(steps), statistics.stdev(steps)
        assert row["iterations_to_target"] == pytest.approx(mean)
        assert row["iterations_spread"] == pytest.approx(spread)
        assert row["time_to_target_s"] == pytest.approx(mean * seconds[label])
        assert row["time_spread_s"] == pytest.approx(spread * seconds[label])
        expected[label] = mean * seconds[label]
    assert len(expected) >= 3, "the target leaves too few rows to rank"
    order = sorted(expected, key=expected.get)
    assert [r["label"] for r in result["rows"]][:len(order)] == order
    assert result["leader"]["label"] == order[0] and result["runner_up"]["label"] == order[1]
    assert result["seed_spread_s"] == pytest.approx(rows[order[0]]["time_spread_s"] + rows[order[1]]["time_spread_s"])
    assert result["cluster"]["sites"] == 2 and result["synchronous_id"] == family["ids"]["sync"][0]
    assert [v["sync_every"] for v in result["loss_penalty"]["variants"]] == [2, 4, 4]


def test_a_diloco_run_is_ranked_on_its_synchronous_runs_trace(family, capsys):
    """Given the DiLoCo run itself, the same table (its synchronous run's pairs and trace), said so."""
    target = repr(family["target"])
    mine = family["ids"]["--sync-every 2"][1]
    result = _tta(family, capsys, "--convergence", str(mine), *CLUSTER, "--target-loss", target)
    base = _tta(family, capsys, "--convergence", str(family["ids"]["sync"][0]), *CLUSTER, "--target-loss", target)
    assert result["convergence_id"] == mine and result["synchronous_id"] == family["ids"]["sync"][0]
    assert result["rows"] == base["rows"] and result["trace_id"] == base["trace_id"]
    assert main(["tta", "--store", family["store"], "--convergence", str(mine), *CLUSTER, "--target-loss", target]) == 0
    text = capsys.readouterr().out
    assert f"its synchronous run: convergence {family['ids']['sync'][0]}" in text
    assert "diloco: iterations = inner steps" in text and "diloco H=4 topk@0.1" in text
    assert "DiLoCo loss penalty against synchronous training at equal tokens" in text


def test_a_target_no_run_reaches_says_so_for_every_row(family, capsys):
    result = _tta(family, capsys, *CLUSTER, "--target-loss", "0.01")
    assert result["winner"] is None and result["leader"] is None
    for row in result["rows"]:
        assert row["time_to_target_s"] is None
        assert row["reason"].startswith("seed 0: never reached held-out loss 0.01 in 8 iterations")
    assert main(["tta", "--store", family["store"], *CLUSTER, "--target-loss", "0.01"]) == 0
    assert ("winner: not named, no configuration reached held-out loss <= 0.01 in every seed (the notes say why)"
            in capsys.readouterr().out)


def test_one_site_leaves_the_diloco_rows_untimed_and_says_why(family, capsys):
    result = _tta(family, capsys, "--nodes", "4", "--bandwidth", "10Gbit", "--target-loss", repr(family["target"]))
    diloco = [r for r in result["rows"] if r["compressor"] == "diloco"]
    assert len(diloco) == 3 and all(r["iteration_s"] is None and r["utilization"] is None for r in diloco)
    assert any(r["iterations_to_target"] is not None for r in diloco)
    for row in diloco:
        if row["iterations_to_target"] is not None:
            assert row["reason"].startswith("no projected time per inner step: DiLoCo syncs across sites")
    assert result["leader"]["label"] == "none"


def test_a_diloco_run_without_its_synchronous_run_is_one_line(tmp_path, capsys, one_thread):
    store = str(tmp_path / "s.sqlite")
    from diloco_family import COMMON

    assert main(["converge", *COMMON, "--sync-every", "2", "--store", store]) == 0
    capsys.readouterr()
    assert main(["tta", "--store", store, *CLUSTER, "--target-loss", "7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a DiLoCo run and its configuration has no synchronous run" in err
    assert "train it: sidco converge --workload transformer" in err


def test_a_sweep_of_a_diloco_run_is_refused_in_one_line_naming_tta(family, capsys):
    diloco = family["ids"][" ".join(VARIANTS[0])][0]
    argv = ["sweep", "--convergence", str(diloco), "--target-loss", str(family["target"]), "--nodes", "2",
            "--bandwidth", "1Gbit", "--compressors", "none", "--store", family["store"]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"convergence #{diloco} is a DiLoCo run" in err
    assert f"sidco tta --convergence {diloco} --sites 2" in err
    with Store(family["store"]) as store:  # the pipeline refuses it too (the dashboard's door)
        with pytest.raises(ValueError, match="is a DiLoCo run"):
            pipeline_tta.sweep_time_to_target(store, 1, diloco, target_loss=family["target"])
