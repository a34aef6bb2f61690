"""Two launches of the same convergence run (two clicks on the page, or two ``sidco converge``):
the second waits for the first and trains nothing the first stored (it joins it); every
(compressor, density, iteration) is stored once."""

from __future__ import annotations

import threading

from convergence import RunConfig
from pipeline import converge
from results.store import Store

CONFIG = RunConfig("resnet20", workers=2, iterations=3, eval_every=3, width=0.25, batch_size=4, eval_samples=8)
PAIRS = [("none", None), ("topk", 0.1)]


def test_a_second_launch_joins_the_first(tmp_path, one_thread):
    path = tmp_path / "r.sqlite"
    training = threading.Event()
    results: dict[str, converge.ConvergeResult] = {}

    def launch(name: str) -> None:
        with Store(path) as store:
            results[name] = converge.run(store, CONFIG, PAIRS, replay=False,
                                         progress=lambda label, done, total: training.set())

    first = threading.Thread(target=launch, args=("first",))
    first.start()
    assert training.wait(120), "the first launch never trained"
    second = threading.Thread(target=launch, args=("second",))
    second.start()
    first.join(300)
    second.join(300)
    assert results["first"].trained == PAIRS and results["first"].skipped == []
    assert results["second"].trained == [] and results["second"].skipped == PAIRS
    assert results["first"].convergence_id == results["second"].convergence_id
    with Store(path) as store:
        rows = store.convergence_rows(results["first"].convergence_id)
    keys = [(r["compressor"], r["density"], r["iteration"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(PAIRS) * CONFIG.iterations


def test_a_store_written_with_density_one_for_dense_pairs_still_reads(tmp_path):
    """An older version stored the pairs without a density at 1.0 (written here as it wrote them, with
    SQL into a real store file): they read back as the pairs without one, are not trained again and
    are named bare."""
    import sqlite3

    from pipeline.request import paired_rows, pair

    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        convergence_id = converge.open_run(store, CONFIG)
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO convergence_rows(convergence_id, compressor, density, iteration, loss, eval_loss, "
                       "accuracy) VALUES(?, ?, 1.0, ?, 2.0, NULL, NULL)",
                       [(convergence_id, name, i) for name in ("none", "fp16") for i in range(1, 4)])
    with Store(path) as store:
        wanted = converge.pairs(["none", "fp16"], [])
        assert converge.trained(store, convergence_id, CONFIG.iterations) == {("none", None), ("fp16", None)}
        result = converge.run(store, CONFIG, wanted)
        assert result.trained == [] and result.skipped == wanted
        rows = paired_rows(store.convergence_rows(convergence_id))
    assert {(r["compressor"], r["density"]) for r in rows} == {("none", None), ("fp16", None)}
    assert [pair(r["compressor"], r["density"]).label for r in rows if r["iteration"] == 1] == ["fp16", "none"]
