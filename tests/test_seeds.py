"""Reproducibility: randomised compressors are seeded per (replay, worker, iteration, bucket), so
identical replays give identical rows; a sweep pins its compression profile once, so concurrent
runs of one configuration share it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import compressors
import simulator
from pipeline import project as projection
import traces
from traces.replay import call_seed, replay

DETERMINISTIC = ("compressor", "density", "iteration", "worker", "bucket", "numel", "selected", "threshold",
                 "stages", "wire_bytes", "rel_error")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    return traces.synthetic(root / "t", "laplace", 20_000, workers=2, iterations=3, seed=1,
                            layers=[("a", (12_000,)), ("b", (8_000,))])


@pytest.mark.parametrize("name", ["dgc", "randomk"])
def test_identical_replays_give_identical_rows(trace, name):
    runs = [[{k: r[k] for k in DETERMINISTIC} for r in replay(trace, [name], [0.01], bucket_bytes=32_000)]
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 3 * 2 * 2  # iterations × workers × buckets
    other = [{k: r[k] for k in DETERMINISTIC} for r in replay(trace, [name], [0.01], bucket_bytes=32_000, seed=7)]
    assert other != runs[0]


@pytest.mark.parametrize("name", ["dgc", "randomk"])
def test_reseed_fixes_the_selection(name):
    grad = torch.randn(50_000, generator=torch.Generator().manual_seed(0))
    a, b = compressors.create(name, density=0.01), compressors.create(name, density=0.01)
    a.compress(grad)  # a different history must not matter
    a.reseed(call_seed(0, name, 0.01, 10, 1, 0))
    b.reseed(call_seed(0, name, 0.01, 10, 1, 0))
    torch.testing.assert_close(a.compress(grad).indices, b.compress(grad).indices, rtol=0, atol=0)
    seeds = {call_seed(0, name, 0.01, it, w, 0) for it in range(3) for w in range(3)}
    assert len(seeds) == 9 and all(0 <= s < 2**63 for s in seeds)


def test_shared_seed_randomk_keeps_its_shared_indices():
    grad = torch.randn(10_000)
    workers = [compressors.create("randomk", density=0.01, seed=5) for _ in range(2)]
    for w, c in enumerate(workers):
        c.reseed(call_seed(0, "randomk", 0.01, 0, w, 0))
    picks = [c.compress(grad).indices for c in workers]
    torch.testing.assert_close(picks[0], picks[1], rtol=0, atol=0)


def test_concurrent_identical_sweeps_share_one_profile(tmp_path):
    """Two sweeps of one configuration started together: one pinned profile, every row computed from it."""
    store = tmp_path / "r.sqlite"
    argv = [sys.executable, "-m", "sidco", "sweep", "--layout", "resnet50", "--nodes", "2,4,8", "--bandwidth",
            "1Gbit,10Gbit", "--compressors", "none,topk,dgc", "--densities", "0.01", "--store", str(store),
            "--jobs", "1", "--no-progress", "--json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    summaries = [json.loads(o[0]) for o in outs]
    assert summaries[0]["sweep_id"] == summaries[1]["sweep_id"]
    with sqlite3.connect(store) as conn:
        profiles = conn.execute("SELECT value FROM meta WHERE key LIKE 'sweep-profile:%'").fetchall()
        rows = conn.execute("SELECT nodes, bandwidth_bps, latency_s, compressor, density, iteration_s "
                            "FROM scenarios").fetchall()
    assert len(profiles) == 1 and len(rows) == 3 * 2 * (3 + 2)  # none, fp16, powersgd (as compare adds them), topk, dgc
    profile = simulator.CompressionProfile.from_json(profiles[0][0])
    workload = projection.workload(projection.layout_source("resnet50"))  # as the sweep builds it
    for nodes, bandwidth, latency, compressor, density, stored in rows:
        sc = simulator.Scenario(workload, nodes, bandwidth, latency, compressor, density,
                                profile=None if compressor == "none" else profile)
        assert simulator.simulate(sc)["iteration_s"] == pytest.approx(stored, rel=1e-12)
