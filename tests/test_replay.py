"""Replaying traces through compressors: rows, buckets, error feedback, the store and resumption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
import traces
from traces.replay import COLUMNS, buckets, calls_per_combination, replay
from sidco.cli import main
from results.queries import REPLAY_ROW_COLUMNS
from results.store import Store

STORE_COLUMNS = (
    "compressor", "density", "error_feedback", "iteration", "worker", "bucket", "numel", "selected",
    "achieved_density", "achieved_over_target", "threshold", "stages", "compress_s", "decompress_s",
    "wire_bytes", "rel_error", "backend", "call_index", "energy", "topk_energy", "fallback",
)


@pytest.fixture(scope="module")
def laplace(tmp_path_factory: pytest.TempPathFactory) -> traces.Trace:
    return traces.synthetic(
        tmp_path_factory.mktemp("replay") / "lap", "laplace", numel=50_000, workers=2, iterations=3, seed=2,
        layers=[("a", (20_000,)), ("b", (5_000,)), ("c", (25_000,))],
    )


def test_rows_have_exactly_the_store_columns(laplace: traces.Trace, store: Store) -> None:
    assert COLUMNS == STORE_COLUMNS
    table = [r["name"] for r in store.query("PRAGMA table_info(replay_rows)")]
    assert table == ["replay_id", *REPLAY_ROW_COLUMNS]
    assert set(COLUMNS) <= set(REPLAY_ROW_COLUMNS)  # backend and call_index (schema v2) may be left out
    rows = list(replay(laplace, ["topk", "sidco-e"], [0.01, 0.001], bucket_bytes=60_000))
    per = calls_per_combination(laplace, 60_000)
    assert per == 3 * 2 * len(buckets(laplace, 60_000))
    assert len(rows) == 4 * per
    assert all(tuple(r) == STORE_COLUMNS for r in rows)
    assert [(r["compressor"], r["density"]) for r in rows[::per]] == [
        ("topk", 0.01), ("topk", 0.001), ("sidco-e", 0.01), ("sidco-e", 0.001)
    ]
    first = rows[:per]
    assert [(r["iteration"], r["worker"], r["bucket"]) for r in first] == sorted(
        (r["iteration"], r["worker"], r["bucket"]) for r in first
    )


def test_topk_rows_are_exact(laplace: traces.Trace) -> None:
    rows = list(replay(laplace, ["topk"], [0.01], error_feedback=False))
    for row in rows:
        g = laplace.gradient(row["iteration"], row["worker"])
        k = round(0.01 * g.numel())
        top = g.abs().topk(k).indices
        g_hat = torch.zeros_like(g)
        g_hat[top] = g[top]
        assert row["selected"] == k and row["wire_bytes"] == 8 * k
        assert row["achieved_density"] == pytest.approx(k / g.numel())
        assert row["rel_error"] == pytest.approx(float((g - g_hat).norm() / g.norm()), rel=1e-5)
        assert row["compress_s"] > 0 and row["decompress_s"] >= 0 and row["error_feedback"] == 0


def test_no_compression_is_lossless(laplace: traces.Trace) -> None:
    for row in replay(laplace, ["none"], [1.0]):
        assert row["rel_error"] == 0 and row["wire_bytes"] == 4 * row["numel"] and row["selected"] == row["numel"]


def test_sidco_e_is_exact_on_laplace(laplace: traces.Trace) -> None:
    ratios = [r["achieved_over_target"] for r in replay(laplace, ["sidco-e"], [0.01], error_feedback=False)]
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.1)


def test_error_feedback_is_carried_per_worker_and_bucket(laplace: traces.Trace) -> None:
    cap = 60_000
    rows = list(replay(laplace, ["topk"], [0.01], bucket_bytes=cap))
    memory = compressors.ErrorFeedback(compressors.create("topk", density=0.01))
    layout = buckets(laplace, cap)
    for row in rows:
        flat = laplace.gradient(row["iteration"], row["worker"])
        grad = torch.cat([flat[o : o + n] for o, n in layout[row["bucket"]]])
        key = (row["worker"], row["bucket"])
        before = memory.residual(key)
        corrected = grad + (before if before is not None else 0)
        g_hat = memory.decompress(memory.compress(grad, key))
        assert row["rel_error"] == pytest.approx(float((corrected - g_hat).norm() / corrected.norm()), rel=1e-4)
    plain = {(r["iteration"], r["worker"], r["bucket"]): r["rel_error"] for r in replay(laplace, ["topk"], [0.01], error_feedback=False, bucket_bytes=cap)}
    for row in rows:
        same = plain[(row["iteration"], row["worker"], row["bucket"])] == pytest.approx(row["rel_error"], rel=1e-6)
        assert same == (row["iteration"] == laplace.iterations[0]), "residual starts empty, then matters"


def test_skip_and_bad_arguments(laplace: traces.Trace) -> None:
    rows = list(replay(laplace, ["topk", "randomk"], [0.01], skip={("topk", 0.01)}))
    assert {r["compressor"] for r in rows} == {"randomk"}
    with pytest.raises(ValueError, match="unknown compressor"):
        replay(laplace, ["nope"], [0.01])
    with pytest.raises(ValueError, match="density"):
        replay(laplace, ["topk"], [0.0])
    with pytest.raises(ValueError, match="bucket"):
        replay(laplace, ["topk"], [0.1], bucket_bytes=0)


class _Sized:
    """Just enough of a Trace for :func:`buckets`."""

    def __init__(self, sizes: list[int]) -> None:
        self.numel = sum(sizes)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self._slices = [(f"l{i}", o, n) for i, (o, n) in enumerate(zip(offsets, sizes))]

    def layer_slices(self):
        return self._slices


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=30).filter(lambda s: sum(s) > 0),
    cap=st.integers(1, 40_000),
    first=st.one_of(st.none(), st.integers(1, 40_000)),
)
def test_buckets_are_ddp_like(sizes: list[int], cap: int, first: int | None) -> None:
    trace = _Sized(sizes)
    layout = buckets(trace, cap, first)
    flat = [part for bucket in layout for part in bucket]
    assert [o for o, _ in flat] == sorted((o for o, _ in flat), reverse=True), "reverse layer order"
    covered = torch.zeros(trace.numel, dtype=torch.int32)
    for offset, numel in flat:
        covered[offset : offset + numel] += 1
    assert bool((covered == 1).all()), "every element in exactly one bucket"
    for index, bucket in enumerate(layout[:-1]):
        limit = cap if index or first is None else first
        nbytes = 4 * sum(n for _, n in bucket)
        assert nbytes >= limit and nbytes - 4 * bucket[-1][1] < limit
    assert buckets(trace, None) == [[(0, trace.numel)]]


def _sidco(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """Run the ``sidco`` command line in this process; return (exit code, stdout, stderr)."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # the parser's own one-line errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sidco_replay_stores_and_resumes(laplace: traces.Trace, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "r.sqlite"
    args = ["replay", str(laplace.path), "--compressors", "topk,sidco-e", "--densities", "0.01,0.001",
            "--bucket-cap", "60KiB", "--store", str(db), "--json"]
    code, stdout, stderr = _sidco(capsys, *args)
    assert code == 0, stderr
    out = json.loads(stdout)
    per = calls_per_combination(laplace, 60 * 2**10)  # 60KiB, as DDP's bucket_cap_mb=60/1024
    assert len(out["rows"]) == 4 * per
    assert {(s["compressor"], s["density"]) for s in out["summary"]} == {
        ("topk", 0.01), ("topk", 0.001), ("sidco-e", 0.01), ("sidco-e", 0.001)
    }
    topk = next(s for s in out["summary"] if s["compressor"] == "topk" and s["density"] == 0.01)
    assert topk["achieved_over_target"] == pytest.approx(1.0, abs=0.01) and topk["calls"] == per
    with Store(db) as store:
        before = [dict(r) for r in store.query("SELECT * FROM replay_rows ORDER BY compressor, density, iteration, worker, bucket")]
        replays = store.query("SELECT * FROM replays")
    assert len(replays) == 1 and replays[0]["status"] == "done"
    code, stdout, stderr = _sidco(capsys, *args[:-1])
    assert code == 0, stderr
    assert "4 combination(s) already stored" in stderr
    assert "achieved" in stdout and "rel err" in stdout and "comp ms" in stdout
    with Store(db) as store:
        after = [dict(r) for r in store.query("SELECT * FROM replay_rows ORDER BY compressor, density, iteration, worker, bucket")]
    assert after == before, "a rerun recomputes nothing"


def test_sidco_replay_bad_input(laplace: traces.Trace, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for extra, message in (
        (["--bucket-cap", "0B"], "invalid --bucket-cap"),
        (["--bucket-cap", "25"], "25"),
        (["--first-bucket", "1MiB"], "needs --bucket-cap"),
        (["--bucket-cap", "1MiB", "--first-bucket", "0B"], "invalid --first-bucket"),
        (["--bucket-mb", "25"], "--bucket-mb is now --bucket-cap"),
        (["--device", "cpu"], "--device is now --run-on"),
        (["--densities", "0.5,x"], "invalid density"),
        (["--compressors", "nope"], "unknown compressor"),
    ):
        code, _, stderr = _sidco(capsys, "replay", str(laplace.path), "--store", str(tmp_path / "r.sqlite"), *extra)
        assert code == 2 and message in stderr
        assert len(stderr.strip().splitlines()) == 1
    code, _, stderr = _sidco(capsys, "replay", str(tmp_path / "missing"), "--store", str(tmp_path / "r.sqlite"))
    assert code == 2 and "no such trace directory" in stderr
    assert not (tmp_path / "r.sqlite").exists(), "nothing is written for bad input"


@pytest.mark.slow
def test_replay_killed_halfway_finishes_without_duplicates_or_losses(tmp_path: Path) -> None:
    trace = traces.synthetic(tmp_path / "t", "gamma", numel=100_000, workers=2, iterations=4, seed=0)
    db = tmp_path / "r.sqlite"
    combos = [(c, d) for c in ("topk", "dgc", "sidco-gp") for d in (0.01, 0.001)]
    per = calls_per_combination(trace)
    args = [sys.executable, "-m", "sidco", "replay", str(trace.path), "--compressors", "topk,dgc,sidco-gp",
            "--densities", "0.01,0.001", "--store", str(db)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    stored = 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                with Store(db) as store:
                    stored = store.query("SELECT COUNT(*) AS n FROM replay_rows")[0]["n"]
                if stored >= per:
                    break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the replay was killed mid-run"
    with Store(db) as store:
        killed = [dict(r) for r in store.query("SELECT * FROM replay_rows")]
    assert len(killed) % per == 0 and per <= len(killed) < len(combos) * per, "only whole combinations were stored"
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "already stored" in result.stderr
    with Store(db) as store:
        final = [dict(r) for r in store.query("SELECT * FROM replay_rows")]
        status = store.query("SELECT status FROM replays")[0]["status"]
    keys = {(r["compressor"], r["density"], r["iteration"], r["worker"], r["bucket"]) for r in final}
    assert len(final) == len(keys) == len(combos) * per
    assert {(c, d) for c, d, *_ in keys} == set(combos)
    kept = {(r["compressor"], r["density"], r["iteration"], r["worker"]): r["compress_s"] for r in killed}
    for row in final:
        key = (row["compressor"], row["density"], row["iteration"], row["worker"])
        if key in kept:
            assert row["compress_s"] == kept[key], "rows stored before the kill were kept, not recomputed"
    assert status == "done"


@pytest.mark.gpu
def test_replay_on_cuda_matches_cpu(laplace: traces.Trace) -> None:
    cpu = list(replay(laplace, ["topk"], [0.01], device="cpu"))
    gpu = list(replay(laplace, ["topk"], [0.01], device="cuda"))
    assert [r["selected"] for r in gpu] == [r["selected"] for r in cpu]
    for a, b in zip(cpu, gpu):
        assert b["rel_error"] == pytest.approx(a["rel_error"], rel=1e-4)
        assert b["wire_bytes"] == a["wire_bytes"] and b["compress_s"] > 0


def test_powersgd_replays_per_bucket_with_the_trace_layer_shapes(tmp_path: Path) -> None:
    trace = traces.synthetic(
        tmp_path / "shaped", "laplace", numel=64 * 50 + 64 + 32 * 64, workers=2, iterations=2, seed=1,
        layers=[("fc1.weight", (64, 50)), ("fc1.bias", (64,)), ("fc2.weight", (32, 64))],
    )
    layout = buckets(trace, bucket_bytes=4 * 32 * 64)
    assert [[n for _, n in parts] for parts in layout] == [[32 * 64], [64, 64 * 50]]
    rows = list(replay(trace, ["powersgd"], [1.0], bucket_bytes=4 * 32 * 64, options={"powersgd": {"rank": 2}}))
    assert len(rows) == 2 * 2 * 2
    wire = {r["bucket"]: r["wire_bytes"] for r in rows}
    assert wire == {0: 4 * (32 + 64) * 2, 1: 4 * (64 + (64 + 50) * 2)}
    assert {r["backend"] for r in rows} == {"torch"}
    # one compressor per (worker, bucket): each sees its calls counted from 0
    assert sorted((r["worker"], r["bucket"], r["call_index"]) for r in rows) == [
        (w, b, i) for w in range(2) for b in range(2) for i in range(2)]
    assert all(0 <= r["rel_error"] < 1 for r in rows)


def test_replay_rows_record_backend_and_call_index(laplace: traces.Trace) -> None:
    rows = list(replay(laplace, ["topk", "fp16"], [0.01], bucket_bytes=100_000))
    for name in ("topk", "fp16"):
        mine = [r for r in rows if r["compressor"] == name]
        assert [r["call_index"] for r in mine] == list(range(len(mine)))
        assert {r["backend"] for r in mine} <= {"native", "torch"}
    assert all(r["wire_bytes"] == 2 * r["numel"] for r in rows if r["compressor"] == "fp16")


def test_replay_table_lists_density_free_compressors_once(laplace: traces.Trace, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """fp16 sends every coordinate whatever the density: one row, no achieved/target ratio."""
    code, stdout, stderr = _sidco(capsys, "replay", str(laplace.path), "--compressors", "fp16,topk", "--densities",
                                  "0.01,0.001", "--bucket-cap", "60KiB", "--store", str(tmp_path / "r.sqlite"))
    assert code == 0, stderr
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] in (["fp16"], ["topk"])]
    assert [r[:2] for r in rows] == [["fp16", "-"], ["topk", "0.01"], ["topk", "0.001"]]
    assert rows[0][4] == "-" and float(rows[1][4]) == pytest.approx(1.0, abs=0.01)


def test_rows_say_when_the_count_guard_sent_the_exact_top_k(tmp_path) -> None:
    """Gaussian-k's normal fit is more than 10x off on gamma magnitudes at δ = 0.001: those rows say
    ``fallback`` and send exactly k; SIDCo-E, which steers its count, never falls back there."""
    trace = traces.synthetic(tmp_path / "gamma", "gamma", numel=50_000, workers=1, iterations=2, seed=2,
                             layers=[("a", (50_000,))])
    rows = list(replay(trace, ["gaussiank", "sidco-e"], [0.001]))
    fell = [r for r in rows if r["fallback"]]
    assert fell and {r["compressor"] for r in fell} == {"gaussiank"}
    assert all(r["selected"] == 50 for r in fell)
    assert all(r["fallback"] == 0 and 25 <= r["selected"] <= 100 for r in rows if r["compressor"] == "sidco-e")
