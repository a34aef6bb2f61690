"""Trace files must be regular files inside the trace directory: symbolic links, FIFOs, devices
and directories are refused in one line (a FIFO must not hang); --timeline creates no
directories; dashboard messages never show absolute server paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import traces
from sidco.cli import main

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


@pytest.fixture
def trace_dir(tmp_path) -> Path:
    trace = traces.synthetic(tmp_path / "t", "laplace", 1000, workers=1, iterations=1, seed=0)
    return Path(trace.path)


def grad_file(trace_dir: Path) -> Path:
    return next(trace_dir.glob("grad-*.safetensors"))


def open_in_subprocess(path: Path) -> subprocess.CompletedProcess:
    """traces.open in a child process with a time limit (a FIFO must not block it)."""
    code = ("import sys, traces\ntry:\n    traces.open(sys.argv[1])\nexcept traces.TraceError as e:\n"
            "    print(e)\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=ENV,
                          timeout=60)


def test_symlinked_gradient_file_is_refused(trace_dir, tmp_path):
    target = grad_file(trace_dir)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(target, outside)
    target.symlink_to(outside)
    with pytest.raises(traces.TraceError, match="is a symbolic link; trace files must be regular files") as info:
        traces.open(trace_dir)
    assert str(target) in str(info.value) and "\n" not in str(info.value)


def test_symlinked_manifest_is_refused(trace_dir, tmp_path):
    manifest = trace_dir / "manifest.json"
    outside = tmp_path / "manifest-copy.json"
    shutil.move(manifest, outside)
    manifest.symlink_to(outside)
    with pytest.raises(traces.TraceError, match="symbolic link"):
        traces.open(trace_dir)


@pytest.mark.parametrize("which", ["gradient", "manifest"])
def test_fifo_does_not_hang_open(trace_dir, which):
    path = grad_file(trace_dir) if which == "gradient" else trace_dir / "manifest.json"
    path.unlink()
    os.mkfifo(path)
    done = open_in_subprocess(trace_dir)
    assert done.returncode == 3 and "is a FIFO" in done.stdout, done.stdout + done.stderr


def test_directory_in_place_of_a_gradient_file_is_refused(trace_dir):
    path = grad_file(trace_dir)
    path.unlink()
    path.mkdir()
    with pytest.raises(traces.TraceError, match="is a directory"):
        traces.open(trace_dir)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mknod needs root")
def test_device_in_place_of_a_gradient_file_is_refused(trace_dir):
    import stat

    path = grad_file(trace_dir)
    path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null
    done = open_in_subprocess(trace_dir)
    assert done.returncode == 3 and "is a device" in done.stdout


def test_gradient_read_rechecks_the_file(trace_dir, tmp_path):
    trace = traces.open(trace_dir)
    path = grad_file(trace_dir)
    outside = tmp_path / "swapped.safetensors"
    shutil.move(path, outside)
    path.symlink_to(outside)
    with pytest.raises(traces.TraceError, match="symbolic link"):
        trace.gradient(trace.iterations[0], 0)


def test_timeline_into_a_missing_directory_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "missing" / "deeper"
    argv = ["simulate", "--layout", "resnet50", "--nodes", "2", "--bandwidth", "10Gbit", "--store",
            str(tmp_path / "r.sqlite"), "--timeline", str(missing / "x.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert not (tmp_path / "missing").exists()


def test_dashboard_messages_hide_absolute_paths(tmp_path, trace_dir):
    from dashboard import components, projection
    from results.store import Store

    with Store(tmp_path / "r.sqlite") as store:
        trace_id = store.register_trace(trace_dir, traces.open(trace_dir).manifest)
        (trace_dir / "manifest.json").write_text("{not json")
        controls = projection.parse_controls(f"trace:{trace_id}", ["none"], "0.01", "4", "10Gbit", "50us", "ring")
        with pytest.raises(projection.ProjectionError) as info:
            projection.project(store, controls)
    assert str(tmp_path) in str(info.value)
    shown = components.error(str(info.value)).children
    assert str(tmp_path) not in shown and "…/manifest.json" in shown
    assert components.public_message("10Gbit/s, 1.25GB/s, ./rel/x") == "10Gbit/s, 1.25GB/s, ./rel/x"


@pytest.mark.parametrize("dtype", ["float16", "F32", None, 32])
def test_a_manifest_dtype_other_than_float32_is_refused(trace_dir, dtype):
    """The manifest's top-level dtype is the literal "float32"; "float16" was once accepted."""
    import json

    path = trace_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["dtype"] == "float32"
    if dtype is None:
        del manifest["dtype"]
    else:
        manifest["dtype"] = dtype
    path.write_text(json.dumps(manifest))
    with pytest.raises(traces.TraceError, match='manifest dtype must be "float32"'):
        traces.open(trace_dir)
