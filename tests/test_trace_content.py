"""Stored replays belong to the trace content they replayed: a trace whose files changed since (in
place, or rewritten at the same path) is detected by the digest of its files and replayed again,
never matched to the old rows."""

from __future__ import annotations

import hashlib

import torch
from safetensors.torch import save_file

import pipeline.replay
import traces
from costs import devices
from pipeline.project import Source, register
from results.store import Store
from traces.format import MANIFEST, iteration_file


def _trace(path, seed: int = 1, overwrite: bool = False) -> traces.Trace:
    return traces.synthetic(path, "laplace", numel=400, workers=2, iterations=2, seed=seed, overwrite=overwrite)


def test_the_content_digest_is_the_sha256_of_the_manifest_and_every_gradient_file(tmp_path):
    trace = _trace(tmp_path / "t")
    digest = hashlib.sha256()
    for name in (MANIFEST, iteration_file(1), iteration_file(2)):
        data = (tmp_path / "t" / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    assert trace.content_sha256() == digest.hexdigest()
    assert traces.open(tmp_path / "t").content_sha256() == trace.content_sha256()


def test_a_replay_of_files_changed_since_is_detected_and_replayed_again(tmp_path, one_thread):
    trace = _trace(tmp_path / "t")
    with Store(tmp_path / "r.sqlite") as store:
        first = pipeline.replay.run(store, trace.path, ["topk"], [0.1])
        trace_id = store.trace_id_for_path(str(trace.path.resolve()))
        assert [r["id"] for r in store.replays_of_trace(trace_id)] == [first.replay_id]
        again = pipeline.replay.run(store, trace.path, ["topk"], [0.1])
        assert (again.replay_id, again.skipped) == (first.replay_id, 1)  # the same files: reused

        changed = {f"worker_{w}": torch.full((400,), 0.5 + w) for w in range(2)}  # same shape, other values
        save_file(changed, str(trace.path / iteration_file(2)))
        # a projection on the trace looks at its files again
        register(store, Source("trace", str(trace.path.resolve()), device=devices.get("cpu")))
        assert store.replays_of_trace(trace_id) == []  # the old rows describe other gradients
        fresh = pipeline.replay.run(store, trace.path, ["topk"], [0.1])
        assert fresh.replay_id != first.replay_id and fresh.skipped == 0
        assert [r["id"] for r in store.replays_of_trace(trace_id)] == [fresh.replay_id]


def test_a_trace_rewritten_at_the_same_path_loses_its_old_replays_even_unhashed(tmp_path, one_thread):
    trace = _trace(tmp_path / "t")
    with Store(tmp_path / "r.sqlite") as store:
        pipeline.replay.run(store, trace.path, ["topk"], [0.1])
        trace_id = store.trace_id_for_path(str(trace.path.resolve()))
        rewritten = _trace(tmp_path / "t", seed=2, overwrite=True)
        assert store.register_trace(rewritten.path, rewritten.manifest) == trace_id  # as capture registers it
        assert store.replays_of_trace(trace_id) == []
