"""The ``--parallel`` family on every door: ``sweep`` and ``tta`` project a sharded plan exactly as
``simulate`` does (same request code), and ``sweep`` leaves out, with the reason, what the plan refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidco.cli import main

CLUSTER = ["--model", "llama-3.2-1b", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8",
           "--bandwidth", "10Gbit", "--batch-size", "4", "--tokens", "1024"]


def _simulate(capsys: pytest.CaptureFixture, store: Path, compressor: str, *flags: str) -> dict:
    assert main(["simulate", *CLUSTER, "--compressor", compressor, "--fidelity", "analytic",
                 "--store", str(store), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_rows_equal_simulate_under_hsdp(tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    flags = ["--parallel", "hsdp", "--micro-batch", "2", "--reduce-dtype", "bf16"]
    assert main(["sweep", *CLUSTER, "--compressors", "none,bf16", "--jobs", "1", "--no-progress",
                 "--store", str(store), "--json", *flags]) == 0
    rows = {row["compressor"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    for name in ("none", "bf16"):
        assert rows[name]["iteration_s"] == _simulate(capsys, store, name, *flags)["iteration_s"]
    assert rows["none"]["iteration_s"] != _simulate(capsys, store, "none")["iteration_s"]  # ddp differs


def test_sweep_leaves_out_what_fsdp_refuses_and_says_why(tmp_path, capsys):
    assert main(["sweep", *CLUSTER, "--compressors", "none,topk", "--densities", "0.01", "--jobs", "1",
                 "--no-progress", "--store", str(tmp_path / "r.sqlite"), "--json", "--parallel", "fsdp"]) == 0
    captured = capsys.readouterr()
    assert {row["compressor"] for row in json.loads(captured.out)["rows"]} == {"none", "fp16"}
    refused = [line for line in captured.err.splitlines() if line.startswith("refused: ")]
    assert [line.split()[1] for line in refused] == ["powersgd", "topk"]
    summary = json.loads(captured.out)
    assert summary["refused"] == [line.removeprefix("refused: ") for line in refused]
    assert summary["parallel"] == "--parallel fsdp"


def test_tta_projects_the_sharded_iteration_as_simulate_does(tmp_path, capsys):
    rows = [{"compressor": name, "density": None, "iteration": step, "loss": loss, "accuracy": 0.5,
             "eval_loss": loss} for name in ("none", "bf16") for step, loss in ((100, 2.0), (200, 1.0))]
    curves = tmp_path / "c.json"
    curves.write_text(json.dumps({"source": "hand-made", "rows": rows}))
    store = tmp_path / "r.sqlite"
    flags = ["--parallel", "hsdp", "--shard-size", "4", "--checkpointing"]
    assert main(["tta", "--curves", str(curves), *CLUSTER, "--target-loss", "1.5", "--store", str(store),
                 "--json", *flags]) == 0
    result = json.loads(capsys.readouterr().out)
    for row in result["rows"]:
        expected = _simulate(capsys, store, row["compressor"], *flags)["iteration_s"]
        assert row["iteration_s"] == expected
        assert row["time_to_target_s"] == pytest.approx(200 * expected)
    assert result["cluster"]["parallel"] == "--parallel hsdp --shard-size 4 --checkpointing"


def test_bad_parallel_flags_are_one_line_on_sweep_and_tta(tmp_path, capsys):
    assert main(["sweep", *CLUSTER, "--store", str(tmp_path / "r.sqlite"), "--parallel", "hsdp",
                 "--micro-batch", "3"]) == 2
    assert capsys.readouterr().err.strip().endswith("--micro-batch 3 must divide --batch-size 4")
    with pytest.raises(SystemExit) as stopped:
        main(["tta", "--curves", str(tmp_path / "none.json"), *CLUSTER, "--target-loss", "1",
              "--store", str(tmp_path / "r.sqlite"), "--parallel", "zero9"])
    assert stopped.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("batch", ["1", "32"])  # fits in an H100's memory / does not
def test_compare_table_shows_memory_and_the_collective_replaced_in_120_columns(tmp_path, capsys, batch):
    run = ["compare", "--model", "llama-3.1-8b", "--device", "h100", "--nodes", "4", "--gpus-per-node", "8",
           "--parallel", "hsdp", "--bandwidth", "100Gbit", "--compressors", "none,bf16,topk", "--densities", "0.01",
           "--batch-size", batch, "--store", str(tmp_path / "r.sqlite")]
    assert main([*run, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert main(run) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index(next(line for line in lines if " config " in line)):][:len(rows) + 1]
    assert "mem GiB replaces" in table[0]
    assert all(len(line) <= 120 for line in lines)
    for row, line in zip(rows, table[1:]):
        mark = "!" if row["fits"] is False else " "
        assert f" {row['label']:<16} " in line
        assert f" {row['memory_gib']:>6.1f}{mark} {row['collective'].split(' (')[0]}" in line
    assert {row["fits"] for row in rows} == {batch == "1"}
    assert "replaces: all-reduce = all-reduce (replicate, gradient shard)" in " ".join(lines)


def test_compare_table_of_a_model_across_sites_marks_rows_without_memory(tmp_path, capsys):
    """A DiLoCo row (no collective of its own, no memory row) prints '-' in both columns."""
    assert main(["compare", "--model", "llama-3.2-1b", "--device", "h100", "--nodes", "4", "--gpus-per-node", "8",
                 "--bandwidth", "100Gbit", "--sites", "2", "--wan-bandwidth", "1Gbit", "--wan-rtt", "30ms",
                 "--compressors", "none,diloco", "--batch-size", "2", "--store", str(tmp_path / "r.sqlite")]) == 0
    lines = capsys.readouterr().out.splitlines()
    (diloco,) = [line for line in lines if " diloco " in line and "all-reduce" not in line][:1]
    assert diloco.split()[-4:-2] == ["-", "-"] and all(len(line) <= 120 for line in lines)


def _as_v9_wrote_it(path: Path) -> list[int]:
    """Rewrite every sweep of the store at ``path`` as schema v9 held it (its ``options.sharding`` the
    text of a :class:`simulator.sharded.Sharding`, by ``default=str``, in ``config_json`` and
    ``config_key``) and mark the store v9; returns the ids of the sweeps rewritten."""
    import sqlite3

    from results.queries import config_key
    from simulator.sharded import Sharding

    raw = sqlite3.connect(path)
    with raw:
        rewritten = []
        for sweep_id, text in raw.execute("SELECT id, config_json FROM sweeps").fetchall():
            config = json.loads(text)
            if config["options"].get("sharding") is None:
                continue
            config["options"]["sharding"] = Sharding(**config["options"]["sharding"])
            raw.execute("UPDATE sweeps SET config_key=?, config_json=? WHERE id=?",
                        (config_key(config), json.dumps(config, sort_keys=True, default=str), sweep_id))
            rewritten.append(sweep_id)
        raw.execute("UPDATE meta SET value='9' WHERE key='schema_version'")
    raw.close()
    return rewritten


SWEPT = {"hsdp": ["--parallel", "hsdp", "--shard-size", "4", "--micro-batch", "2", "--reduce-dtype", "bf16",
                  "--checkpointing"],
         "fsdp": ["--parallel", "fsdp"], "ddp": []}


def test_a_sweep_stores_its_parallel_family_as_fields_and_a_v9_store_migrates_and_resumes(tmp_path, capsys):
    """The sweep's stored configuration holds the --parallel family as JSON fields, which --json reads
    back; a v9 store (which held them as a Python object's text) opens at the current version with
    the same fields and key, so running each sweep again resumes it, computing nothing."""
    from results.store import SCHEMA_VERSION, Store

    store = tmp_path / "r.sqlite"

    def sweep(flags: list[str]) -> dict:
        assert main(["sweep", *CLUSTER, "--compressors", "none,bf16", "--jobs", "1", "--no-progress",
                     "--store", str(store), "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    first = {name: sweep(flags) for name, flags in SWEPT.items()}
    assert first["hsdp"]["sharding"] == {"parallel": "hsdp", "shard_size": 4, "reduce_dtype": "bf16",
                                         "param_dtype": "bf16", "micro_batch": 2, "checkpointing": True}
    assert first["hsdp"]["parallel"] == "--parallel hsdp --shard-size 4 --reduce-dtype bf16 --micro-batch 2 --checkpointing"
    assert first["fsdp"]["sharding"]["parallel"] == "fsdp" and "sharding" not in first["ddp"]
    with Store(store) as opened:
        stored = {row["id"]: json.loads(row["config_json"]) for row in opened.sweep_list()}
    assert stored[first["hsdp"]["sweep_id"]]["options"]["sharding"] == first["hsdp"]["sharding"]
    assert sorted(_as_v9_wrote_it(store)) == sorted([first["hsdp"]["sweep_id"], first["fsdp"]["sweep_id"]])
    with Store(store) as opened:
        assert opened.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert {row["id"]: json.loads(row["config_json"]) for row in opened.sweep_list()} == stored
    for name, flags in SWEPT.items():
        again = sweep(flags)
        assert (again["sweep_id"], again["resumed"], again["computed"]) == (first[name]["sweep_id"], True, 0), name
        assert again.get("sharding") == first[name].get("sharding")
