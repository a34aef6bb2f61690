"""Two launches of the same convergence run (two clicks on the page, or two ``sidco converge``):
the second waits for the first and trains nothing the first stored (it joins it); every
(compressor, density, iteration) is stored once."""

from __future__ import annotations

import threading

from convergence import RunConfig
from pipeline import converge
from results.store import Store

CONFIG = RunConfig("resnet20", workers=2, iterations=3, eval_every=3, width=0.25, batch_size=4, eval_samples=8)
PAIRS = [("none", 1.0), ("topk", 0.1)]


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
