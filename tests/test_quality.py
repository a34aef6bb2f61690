"""Quality beside speed: what each compressor sends (energy vs Top-k, achieved density), where it
comes from, and the verdict that weighs it (:mod:`pipeline.quality`)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
import pipeline.replay
from pipeline import quality
from pipeline.tta import TARGET_SHARE
from pipeline.verdict import judge
from results.store import Store
from sidco.cli import main
from traces.replay import call_seed, replay, topk_energy
from units import Pair

SPARSE = ("topk", "randomk", "sidco-e")


def _direct(trace, name: str, density: float, iteration: int, worker: int) -> tuple[float, float, float]:
    """(‖ĝ‖², ‖Top-k(g)‖², ‖g‖²) of one call without error feedback, computed here with torch.topk."""
    g = trace.gradient(iteration, worker).double()
    c = compressors.create(name, density=density)
    c.reseed(call_seed(0, name, density, iteration, worker, 0))
    sent = c.decompress(c.compress(trace.gradient(iteration, worker).clone())).double()
    k = max(1, round(density * g.numel()))
    top = torch.topk(g.abs(), k).values
    return float(sent.pow(2).sum()), float(top.pow(2).sum()), float(g.pow(2).sum())


def test_energy_vs_topk_is_what_torch_topk_gives_on_a_real_gradient(resnet20_trace, store):
    """Each call's energy and Top-k energy equal a direct torch computation; the stored summary is
    their ratio (an off-by-10x or a swapped numerator fails: Random-k's ratio is far below 1)."""
    trace = resnet20_trace
    run = pipeline.replay.run(store, trace, ["randomk", "topk"], [0.01], error_feedback=False)
    rows = {(r["compressor"], r["iteration"], r["worker"]): r
            for r in store.replay_rows(run.replay_id, error_feedback=False)}
    for name in ("randomk", "topk"):
        ratios = []
        for iteration in trace.iterations:
            for worker in range(trace.workers):
                sent, top, total = _direct(trace, name, 0.01, iteration, worker)
                row = rows[(name, iteration, worker)]
                assert row["energy"] == pytest.approx(sent / total, rel=1e-5)
                assert row["topk_energy"] == pytest.approx(top / total, rel=1e-9)
                ratios.append(sent / top)
        summary = store.replay_quality(run.replay_id, name, 0.01, error_feedback=False)
        assert summary["energy_vs_topk"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)
    assert store.replay_quality(run.replay_id, "topk", 0.01, False)["energy_vs_topk"] == pytest.approx(1.0)
    assert store.replay_quality(run.replay_id, "randomk", 0.01, False)["energy_vs_topk"] < 0.2


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=300),
       density=st.sampled_from([1e-3, 0.01, 0.1, 0.5, 1.0]))
def test_topk_energy_is_the_squared_norm_of_the_k_largest_magnitudes(values, density):
    x = torch.tensor(values, dtype=torch.float32)
    k = max(1, round(density * x.numel()))
    expected = float(torch.topk(x.double().abs(), k).values.pow(2).sum())
    assert topk_energy(x, density) == pytest.approx(expected, rel=1e-6, abs=1e-30)


def test_every_call_of_a_replay_carries_its_energy(resnet20_trace):
    rows = list(replay(resnet20_trace, ["sidco-e", "powersgd", "fp16"], [0.01]))
    for r in rows:
        assert 0.0 <= r["energy"] <= 1.0 + 1e-3
        assert (r["topk_energy"] is None) == (r["compressor"] != "sidco-e")
    assert all(r["energy"] == pytest.approx(1.0, abs=1e-4) for r in rows if r["compressor"] == "fp16")


def _compare(store_path, trace) -> dict:
    assert main(["compare", "--trace", str(trace.path), "--nodes", "8", "--bandwidth", "1Gbit", "--compressors",
                 ",".join(SPARSE), "--densities", "0.001", "--store", str(store_path), "--json"]) == 0


def test_compare_on_a_real_trace_weighs_what_each_sends(resnet20_trace, tmp_path, capsys):
    """Random-k at 0.001 is never the winner nor tied; every row is measured, by replays stored
    like any replay (a second compare runs none)."""
    store_path = tmp_path / "r.sqlite"
    _compare(store_path, resnet20_trace)
    out = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in out["rows"]}
    for label in ("topk@0.001", "randomk@0.001", "sidco-e@0.001"):
        row = rows[label]
        assert {"achieved_density", "energy_vs_topk", "quality_source"} <= row.keys()
        assert row["quality_source"].startswith("replay #"), row["quality_source"]
        assert row["achieved_over_target"] == pytest.approx(row["achieved_density"] / 0.001)
    assert rows["topk@0.001"]["energy_vs_topk"] == pytest.approx(1.0)
    assert rows["randomk@0.001"]["energy_vs_topk"] < quality.ENERGY_FLOOR
    assert rows["powersgd"]["quality_source"].startswith("replay #")
    assert rows["fp16"]["energy_vs_topk"] == 1.0
    verdict = out["verdict"]
    assert verdict["winner"] != "randomk@0.001" and "randomk@0.001" not in verdict["tied"]
    assert "randomk@0.001" in verdict["fails_quality"]
    assert not any(quality.is_unmeasured(r) for r in out["rows"]) and verdict["unmeasured"] == []
    if "randomk@0.001" in verdict["faster_but_less"]:
        assert "faster but sends much less of the gradient: randomk@0.001 (energy" in verdict["text"]
    with Store(store_path) as store:
        replays = store.replay_list()
    _compare(store_path, resnet20_trace)
    again = json.loads(capsys.readouterr().out)
    assert [r["quality_source"] for r in again["rows"]] == [r["quality_source"] for r in out["rows"]]
    with Store(store_path) as store:
        assert store.replay_list() == replays


def test_randomk_is_never_called_even_when_it_is_the_fastest(resnet20_trace, store):
    """Quality from a real replay, speeds made so that Random-k leads by far: it is listed apart."""
    pairs = [("none", None), ("fp16", None), ("powersgd", None), ("topk", 0.001), ("randomk", 0.001),
             ("sidco-e", 0.001)]
    run = pipeline.replay.run(store, resnet20_trace, ["topk", "randomk", "sidco-e"], [0.001])
    measured = quality.from_replays(store, store.trace_id_for_path(str(resnet20_trace.path.resolve())), pairs)
    assert {p for p in pairs if p[1] is not None} <= measured.keys() and run.replay_id
    seconds = {"randomk": 0.010, "topk": 0.050, "sidco-e": 0.051, "none": 1.0, "fp16": 0.5, "powersgd": 0.06}
    rows = quality.attach([{"compressor": n, "density": d, "iteration_s": seconds[n]} for n, d in pairs],
                          quality.measure(store, "trace", str(resnet20_trace.path),
                                          store.trace_id_for_path(str(resnet20_trace.path.resolve())), pairs,
                                          run_missing=False))
    v = judge(rows)
    assert v["winner"] == "topk@0.001" and "randomk@0.001" not in v["tied"]
    assert v["faster_but_less"] == ["randomk@0.001"]
    assert "faster but sends much less of the gradient: randomk@0.001 (energy" in v["text"]


def _row(name, density, seconds, ratio=1.0, versus=1.0, source="replay #1"):
    return {"compressor": name, "density": density, "iteration_s": seconds, "achieved_over_target": ratio,
            "energy_vs_topk": versus, "achieved_density": None if density is None else density * ratio,
            "quality_source": source}


def test_the_rule_calls_only_what_sends_near_its_target_and_near_topk():
    assert quality.called(_row("sidco-e", 0.01, 1, ratio=1.9, versus=0.9))
    assert quality.called(_row("sidco-e", 0.01, 1, ratio=quality.DENSITY_FACTOR + 0.01)) is False
    assert quality.called(_row("gaussiank", 0.01, 1, ratio=1 / quality.DENSITY_FACTOR - 0.01)) is False
    assert quality.called(_row("randomk", 0.001, 1, versus=0.01)) is False
    assert quality.called(_row("powersgd", None, 1, ratio=None, versus=0.05))  # dense baselines: speed alone
    assert quality.called({**_row("topk", 0.01, 1), **quality.unmeasured()}) is None
    rows = [_row("none", None, 1.0), _row("sidco-e", 0.01, 0.2, ratio=2.5), _row("topk", 0.01, 0.3),
            {**_row("dgc", 0.01, 0.5), **quality.unmeasured("no replay")}]
    v = judge(rows)
    assert v["winner"] == "topk@0.01" and v["call"] == "winner"
    assert v["faster_but_less"] == ["sidco-e@0.01"] and "sends 2.5x its target density" in v["text"]
    assert v["unmeasured"] == ["dgc@0.01"] and "quality unmeasured (judged on speed alone): dgc@0.01" in v["text"]
    assert v["quality_rule"] == quality.CALL_RULE


def test_a_dense_baseline_that_sends_little_is_flagged_where_it_wins():
    """PowerSGD is judged by speed, but a win on 0.28x of the gradient's squared norm is said."""
    assert quality.sends_little(_row("powersgd", None, 1, ratio=None, versus=0.28))
    assert not quality.sends_little(_row("powersgd", None, 1, ratio=None, versus=0.9))
    assert not quality.sends_little(_row("fp16", None, 1, ratio=None, versus=1.0))
    rows = [_row("fp16", None, 1.0, ratio=None), _row("powersgd", None, 0.2, ratio=None, versus=0.28),
            _row("topk", 0.01, 0.5)]
    v = judge(rows)
    assert v["winner"] == "powersgd" and v["decision"] == "compress" and v["sends_little"] == ["powersgd"]
    assert v["text"].startswith("compress with powersgd (about 5.0x over sending the whole gradient, fp16)")
    assert "caution: powersgd sends 0.28x of the gradient's squared norm" in v["text"]


def test_layouts_take_the_nearest_captured_workload_of_their_family():
    table = quality.read_table()
    assert table is not None, "profiles/quality.json is shipped (sidco quality-table)"
    near = {name: quality.nearest(name, table)["name"] for name in ("resnet50", "vgg16", "vgg19", "bert-base",
                                                                    "bert-large", "gpt2")}
    assert near == {"resnet50": "resnet20", "vgg16": "vgg16", "vgg19": "vgg16", "bert-base": "transformer",
                    "bert-large": "transformer", "gpt2": "transformer"}
    names = compressors.names()
    for entry in table["workloads"]:
        held = {(r[0], r[1]) for r in entry["rows"]}
        assert held == {(n, d) for n in names if compressors.takes_density(n) for d in quality.TABLE_DENSITIES} | {
            (n, 1.0) for n in names if not compressors.takes_density(n)}
        rows = {(r[0], r[1]): dict(zip(entry["columns"], r)) for r in entry["rows"]}
        assert rows[("topk", 0.001)]["energy_vs_topk"] == pytest.approx(1.0)
        assert rows[("randomk", 0.001)]["energy_vs_topk"] < 0.05
    assert "sidco quality-table" in table["what"] and quality.profiles.QUALITY.stat().st_size < 16_000


def test_a_layout_compare_answers_from_the_shipped_table(capsys, tmp_path):
    assert main(["compare", "--layout", "bert-large", "--nodes", "16", "--gpus-per-node", "8", "--topology",
                 "hierarchical", "--bandwidth", "25Gbit", "--store", str(tmp_path / "r.sqlite"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for r in out["rows"]:
        if compressors.takes_density(r["compressor"]):
            assert r["quality_source"].startswith("shipped table: transformer"), r
            assert not quality.is_unmeasured(r)
    v = out["verdict"]
    assert "randomk@0.001" not in v["tied"] and v["winner"] != "randomk@0.001"
    assert main(["compare", "--layout", "bert-large", "--nodes", "16", "--bandwidth", "25Gbit",
                 "--compressors", "topk", "--densities", "0.02", "--store", str(tmp_path / "r.sqlite")]) == 0
    text = capsys.readouterr().out
    assert "unmeasured: the shipped table holds no bert-large-like workload at this density" in text
    assert "quality unmeasured (judged on speed alone): topk@0.02" in text


def test_compare_cites_time_to_accuracy_where_a_convergence_run_of_the_trace_is_stored(resnet20_trace, tmp_path,
                                                                                      capsys):
    store_path = tmp_path / "r.sqlite"
    curves = [{"compressor": c, "density": d, "iteration": i, "loss": 1.0, "eval_loss": 1.0, "accuracy": a}
              for c, d, reach in (("none", 1.0, 20), ("topk", 0.001, 40), ("randomk", 0.001, 10_000),
                                  ("sidco-e", 0.001, 40))
              for i, a in ((10, 0.3), (20, 0.5 if reach <= 20 else 0.3), (40, 0.8 if reach <= 40 else 0.35))]
    with Store(store_path) as store:
        trace_id = store.register_trace(resnet20_trace.path, resnet20_trace.manifest)
        run_id, _ = store.get_or_create("convergences", {"workload": "hand-made", "workers": 2})
        store.set_convergence_trace(run_id, trace_id)
        store.write_convergence(run_id, curves)
    _compare(store_path, resnet20_trace)
    out = json.loads(capsys.readouterr().out)
    v = out["verdict"]
    assert v["basis_quantity"] == "time to accuracy"
    target = TARGET_SHARE * 0.8
    assert v["time_to_accuracy"]["target_accuracy"] == pytest.approx(target)
    assert f"by time to accuracy (held-out accuracy >= {target:.3g}, convergence #{run_id}" in v["text"]
    assert v["text"].startswith(("compress", "don't compress"))
    times = {Pair(t["compressor"], t["density"]).label: t for t in v["time_to_accuracy"]["table"]}
    rows = {r["label"]: r for r in out["rows"]}
    assert times["topk@0.001"]["time_to_target_s"] == pytest.approx(40 * rows["topk@0.001"]["iteration_s"])
    assert times["randomk@0.001"]["time_to_target_s"] is None and "never reached" in times["randomk@0.001"]["reason"]
    assert "no time to accuracy for" in v["text"] and "fp16" in v["text"]
    assert v["winner"] in ("none", "topk@0.001", "sidco-e@0.001") and "randomk@0.001" not in v["tied"]
    assert math.isclose(v["time_to_target_s"], times[v["winner"]]["time_to_target_s"])


def test_the_table_command_builds_the_table_it_ships(tmp_path, one_thread):
    out = tmp_path / "quality.json"
    assert main(["quality-table", "--out", str(out), "--workers", "1", "--iterations", "1", "--every", "1"]) == 0
    built = json.loads(out.read_text())
    shipped = quality.read_table()
    assert [w["name"] for w in built["workloads"]] == [w["name"] for w in shipped["workloads"]]
    assert [w["family"] for w in built["workloads"]] == [w["family"] for w in shipped["workloads"]]
    assert [w["columns"] for w in built["workloads"]] == [w["columns"] for w in shipped["workloads"]]
    assert built["what"] == shipped["what"] and built["densities"] == shipped["densities"]


def test_the_quality_page_histogram_is_the_pipelines_of_the_recorded_gradient(resnet20_trace):
    """pipeline.fits.gradient_histogram (the page asks it; the page opens no trace) bins the recorded
    gradient of one worker: the bins hold the share of elements up to the last edge (the 99.95th
    percentile), the exact top-δ threshold of |g| is marked."""
    import numpy as np

    import traces
    from pipeline import fits

    iterations, workers = fits.trace_axes(resnet20_trace.path)
    trace = traces.open(resnet20_trace.path)
    assert iterations == list(trace.iterations) and workers == list(range(trace.workers))
    grad = np.abs(trace.gradient(iterations[-1], workers[-1]).numpy())
    hist = fits.gradient_histogram(str(resnet20_trace.path), iterations[-1], workers[-1], 0.01)
    widths = np.diff(hist["edges"])
    assert hist["numel"] == grad.size
    inside = float(np.mean(grad.astype(np.float64) <= hist["edges"][-1]))
    assert float(np.sum(np.asarray(hist["density"]) * widths)) == pytest.approx(inside, rel=1e-9)
    k, ordered = math.ceil(0.01 * grad.size), np.sort(grad.astype(np.float64))
    assert ordered[-k - 1] <= hist["threshold"] <= ordered[-k]  # between the k-th and (k+1)-th largest |g|


def test_compare_by_time_to_accuracy_weighs_the_seeds_spread_as_sidco_tta_does(resnet20_trace, tmp_path, capsys):
    """Two seeds of one configuration: Top-k and SIDCo-E reach the target at 10 and 30 iterations in
    opposite seeds, so the same mean; their margin is within the seeds' spread, and compare says so
    (the rule of pipeline.tta.verdict), where the error band alone would not decide it."""
    store_path = tmp_path / "r.sqlite"
    reach = {("none", 1.0): (300, 300), ("topk", 0.001): (10, 30), ("sidco-e", 0.001): (30, 10)}
    with Store(store_path) as store:
        trace_id = store.register_trace(resnet20_trace.path, resnet20_trace.manifest)
        for seed in (0, 1):
            run_id, _ = store.get_or_create("convergences", {"workload": "hand-made", "workers": 2, "seed": seed})
            store.set_convergence_trace(run_id, trace_id)
            store.write_convergence(run_id, [
                {"compressor": c, "density": d, "iteration": i, "loss": 1.0, "eval_loss": 1.0,
                 "accuracy": 0.8 if i >= at[seed] else 0.3}
                for (c, d), at in reach.items() for i in (10, 30, 300)])
    _compare(store_path, resnet20_trace)
    v = json.loads(capsys.readouterr().out)["verdict"]
    assert v["basis_quantity"] == "time to accuracy"
    table = {Pair(t["compressor"], t["density"]).label: t for t in v["time_to_accuracy"]["table"]}
    assert table["topk@0.001"]["seeds"] == 2 and table["topk@0.001"]["time_spread_s"] > 0
    from pipeline.tta import verdict as tta_verdict

    alone = tta_verdict([t for t in table.values() if t["time_to_target_s"] is not None])
    assert v["call"] == "too close to call" and alone["winner"] is None
    assert v["reason"] == alone["reason"] and "within the seed spread" in v["text"], v["text"]
