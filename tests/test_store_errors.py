"""Store, disk and device errors: one line naming the file or device and the fix, exit code 2,
and what was already written stays valid (garbage, truncated, directory, read-only, full disk)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from results import Store, StoreError
from sidco.cli import main

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
ROW = {"alpha_s": 1e-5, "beta_s_per_byte": 1e-9, "efficiency": 0.9, "source": {}}
SIMULATE = ["simulate", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10Gbit", "--fidelity", "analytic"]


@contextlib.contextmanager
def tmpfs(directory: Path, size: str = "1M"):
    """A small tmpfs mounted at ``directory`` (root only), always unmounted afterwards."""
    if not IS_ROOT or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs")
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def filled_store(path: Path, rows: int = 10) -> None:
    with Store(path) as store:
        for _ in range(rows):
            store.add_calibration(**ROW)


@pytest.mark.parametrize("kind, message", [
    ("garbage", "is not a results store"),
    ("truncated", "is damaged (truncated or corrupt)"),
    ("directory", "is a directory, not a results store"),
    ("file-as-parent", "is a file, not a directory"),
])
def test_bad_store_is_one_line_and_left_untouched(tmp_path, capsys, kind, message):
    path = tmp_path / "r.sqlite"
    if kind == "garbage":
        path.write_bytes(os.urandom(4096))
    elif kind == "truncated":
        filled_store(path, 3000)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"x")
        path = path / "results.sqlite"
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(StoreError, match="pass another --store") as info:
        Store(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    for argv in (SIMULATE, ["calibrate"]):
        assert main(argv + ["--store", str(path)]) == 2
        err = one_line(capsys.readouterr().err)
        assert message in err and str(path) in err
    if before is not None:
        assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"r.sqlite"})


def test_read_only_store_keeps_its_rows(tmp_path, capsys):
    directory = tmp_path / "ro"
    if IS_ROOT:
        context = tmpfs(directory)
    else:
        context = contextlib.nullcontext(directory)
        directory.mkdir()
    with context:
        path = directory / "r.sqlite"
        filled_store(path, 5)
        if IS_ROOT:
            subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        else:
            os.chmod(directory, 0o555)
            os.chmod(path, 0o444)
        try:
            with pytest.raises(StoreError, match="read-only|cannot open"):
                Store(path).add_calibration(**ROW)
            assert main(["sweep", "--layout", "resnet50", "--nodes", "2", "--bandwidth", "10Gbit", "--compressors",
                         "none", "--jobs", "1", "--no-progress", "--store", str(path)]) == 2
            err = one_line(capsys.readouterr().err)
            assert str(path) in err or str(directory) in err
            with Store(path) as store:  # what is there reads
                assert len(store.query("SELECT * FROM calibrations")) == 5
            uri = f"file:{path}?immutable=1"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
                assert conn.execute("SELECT COUNT(*) FROM calibrations").fetchone()[0] == 5
        finally:
            if not IS_ROOT:
                os.chmod(directory, 0o755)


def test_full_disk_keeps_committed_rows(tmp_path):
    with tmpfs(tmp_path / "full"):
        path = tmp_path / "full" / "r.sqlite"
        committed = 0
        big = {**ROW, "source": {"padding": "x" * 2000}}
        with Store(path) as store, pytest.raises(StoreError, match="the disk is full; free space on"):
            while True:
                store.add_calibration(**big)
                committed += 1
        assert committed > 0
        with Store(path) as store:
            assert store.query("SELECT COUNT(*) FROM calibrations")[0][0] == committed
            assert store.query("PRAGMA integrity_check")[0][0] == "ok"


def test_capture_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys):
    with tmpfs(tmp_path / "full", "512k"):
        out = tmp_path / "full" / "trace"
        argv = ["capture", "--workload", "resnet20", "--workers", "2", "--iterations", "2", "--every", "1",
                "--threads", "1", "--out", str(out), "--store", str(tmp_path / "r.sqlite")]
        assert main(argv) == 2
        err = one_line(capsys.readouterr().err)
        assert "the disk is full" in err and str(out) in err
        assert list((tmp_path / "full").iterdir()) == []


def test_capture_checks_the_store_before_training(tmp_path, capsys):
    store = tmp_path / "store-dir"
    store.mkdir()
    out = tmp_path / "trace"
    argv = ["capture", "--workload", "resnet20", "--workers", "1", "--iterations", "1", "--every", "1",
            "--out", str(out), "--store", str(store)]
    assert main(argv) == 2
    assert "is a directory" in one_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["replay", "TRACE", "--compressors", "topk", "--densities", "0.1", "--run-on", "xyz"], "unknown device 'xyz'"),
    (["replay", "TRACE", "--compressors", "topk", "--densities", "0.1", "--run-on", "cuda:99"], "cuda:99"),
    (["replay", "TRACE", "--compressors", "topk", "--densities", "0.1", "--device", "cpu"], "--device is now --run-on"),
    (SIMULATE[:-2] + ["--compressor", "topk", "--density", "0.01", "--device", "cuda:99"], "cuda:99"),
    (SIMULATE[:-2] + ["--compressor", "topk", "--density", "0.01", "--device", "mps"], "unknown device"),
    (["capture", "--workload", "resnet20", "--width", "1e6", "--out", "OUT"], "lower --width"),
    (["capture", "--workload", "resnet20", "--run-on", "xyz", "--out", "OUT"], "unknown device"),
])
def test_bad_devices_and_sizes_are_one_line(tmp_path, capsys, argv, message):
    import traces

    trace = traces.synthetic(tmp_path / "t", "laplace", 1000, workers=1, iterations=1, seed=0)
    argv = [str(trace.path) if a == "TRACE" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    try:
        code = main(argv + ["--store", str(tmp_path / "r.sqlite")])
    except SystemExit as exc:  # the parser's own one-line errors
        code = exc.code
    assert code == 2
    assert message in one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_stale_partial_directories_are_cleaned_on_the_next_run(tmp_path):
    from traces.format import TraceWriter

    out = tmp_path / "trace"
    dead = tmp_path / ".trace.999999999.abc.partial"
    legacy = tmp_path / ".trace.k2j3h4.partial"
    live = tmp_path / f".trace.{os.getpid()}.xyz.partial"
    other = tmp_path / ".other.999999999.abc.partial"
    for d in (dead, legacy, live, other):
        d.mkdir()
        (d / "iteration_000001.safetensors").write_bytes(b"partial")
    with TraceWriter(out, workload="w", layers=[("l", (4,), "float32")], workers=1):
        pass
    assert not dead.exists() and not legacy.exists()
    assert live.exists() and other.exists()


@pytest.mark.parametrize("damage", [
    "UPDATE meta SET value='2' WHERE key='schema_version'",
    "UPDATE meta SET value='0' WHERE key='schema_version'",
    "DELETE FROM meta",
    "DROP TABLE calibrations",
])
def test_a_store_whose_tables_do_not_match_its_version_is_named_damaged(tmp_path, capsys, damage):
    path = tmp_path / "r.sqlite"
    filled_store(path, 1)
    with sqlite3.connect(path) as db:
        db.execute(damage)
    db.close()
    with pytest.raises(StoreError, match="is damaged") as info:
        with Store(path) as store:
            store.query("SELECT count(*) FROM calibrations")
    assert "\n" not in str(info.value) and "pass another --store" in str(info.value)
    if "meta" in damage:
        assert main(SIMULATE + ["--store", str(path)]) == 2
        err = one_line(capsys.readouterr().err)
        assert "is damaged" in err and str(path) in err


def test_a_store_path_over_sqlites_limit_says_it_is_too_long(tmp_path, capsys):
    deep = tmp_path
    while len(os.fsencode(str(deep))) < 600:
        deep = deep / ("d" * 100)
    deep.mkdir(parents=True)
    path = deep / "r.sqlite"
    assert main(SIMULATE + ["--store", str(path)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "over SQLite's limit of 512" in err and "pass a shorter --store" in err
