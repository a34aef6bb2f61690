"""Kill-safety: sweep pool workers die with their parent, SIGTERM ends a command in one line with
exit code 143, killed captures leave nothing behind, stale emulation namespaces are removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes.liveness import children_of, pid_running

SIDCO = [sys.executable, "-m", "sidco"]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def wait_for(condition, timeout_s: float = 60.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    return condition()


def quiet_for_profiling(timeout_s: float = 120.0) -> None:
    """Wait until no measuring process of the testbed runs on this machine (another checkout's
    tests may be profiling): ``sidco profile`` refuses to measure beside one. Skip if it stays busy."""
    from measuring import profiling
    from processes import children

    if not wait_for(lambda: not children.running(profiling.MEASURING_MODULE), timeout_s=timeout_s, interval_s=1.0):
        pytest.skip("another measuring process of the testbed kept running on this machine")


def sigterm_when(argv: list[str], ready, what: str, timeout_s: float = 60.0,
                 settle_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    """Run ``argv``, wait until ``ready(proc)`` holds (asserting it does, naming ``what``), let it
    run ``settle_s`` more, send SIGTERM; the ended process and its stderr. The process never
    outlives this."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert wait_for(lambda: ready(proc), timeout_s=timeout_s), what
        time.sleep(settle_s)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, err


def test_sigkilled_sweep_leaves_no_pool_workers(tmp_path):
    argv = SIDCO + ["sweep", "--layout", "resnet50", "--nodes", "64,128,256,512", "--bandwidth",
                    "1Gbit,10Gbit,100Gbit", "--latency", "1us,10us,100us", "--compressors", "none",
                    "--fidelity", "des", "--bucket-mode", "layer", "--store", str(tmp_path / "r.sqlite"),
                    "--jobs", "2", "--chunk-size", "1", "--no-progress"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        workers = wait_for(lambda: [c for c in children_of(proc.pid) if pid_running(c)]
                           if len(children_of(proc.pid)) >= 2 else [])
        assert len(workers) >= 2, "the sweep did not start its pool"
        time.sleep(1.0)  # workers busy with a chunk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_for(lambda: not any(pid_running(w) for w in workers), timeout_s=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in children_of(proc.pid):
            if pid_running(w):
                os.kill(w, signal.SIGKILL)


def test_pool_worker_exits_when_its_parent_is_gone():
    """The watchdog alone (no parent-death signal) ends a worker whose parent died."""
    script = (
        "import os, sys, time\n"
        "from processes.children import _watch\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    parent = os.getppid()\n"
        "    grandchild = os.fork()\n"
        "    if grandchild == 0:\n"
        "        _watch(parent)\n"
        "    print(grandchild, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=30)
    orphan = int(out.stdout.split()[0])
    assert wait_for(lambda: not pid_running(orphan), timeout_s=10)


def test_sigterm_of_capture_exits_143_in_one_line_and_leaves_no_partial(tmp_path):
    out = tmp_path / "trace"
    argv = SIDCO + ["capture", "--workload", "resnet20", "--workers", "2", "--iterations", "400", "--every", "1",
                    "--threads", "1", "--out", str(out), "--store", str(tmp_path / "r.sqlite")]
    proc, err = sigterm_when(argv, lambda proc: list(tmp_path.glob(".trace.*.partial/grad-*")),
                             "capture never wrote an iteration", timeout_s=120)
    assert proc.returncode == 143
    last = err.strip().splitlines()[-1]
    assert last.startswith("sidco capture: terminated by SIGTERM") and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".trace.*"))


@pytest.mark.root
def test_stale_namespaces_are_removed_only_when_ours_and_dead(tmp_path):
    from emulation.network import leftovers

    dead = subprocess.Popen(["true"])
    dead.wait()
    names = {
        "dead": f"sidco-{dead.pid}-abc123-w0",
        "alive": f"sidco-{os.getpid()}-abc123-w0",
        "foreign": "sidco-notours-w0",
    }
    for name in names.values():
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        done = subprocess.run(SIDCO + ["emulate", "--cleanup", "--store", str(tmp_path / "r.sqlite")],
                              capture_output=True, text=True, env=ENV, timeout=60)
        assert done.returncode == 0, done.stderr
        assert names["dead"] in done.stdout
        present = set(leftovers())
        assert names["dead"] not in present
        assert names["alive"] in present and names["foreign"] in present
    finally:
        for name in names.values():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


@pytest.mark.root
def test_emulation_start_removes_stale_namespaces_of_a_killed_run(tmp_path):
    """SIGKILL an emulation: its namespaces stay; the next emulation removes them."""
    from emulation.network import Network, leftovers
    from emulation.plan import make_plan

    script = (
        "import time\n"
        "from emulation.network import Network\n"
        "from emulation.plan import make_plan\n"
        "plan = make_plan(2, 10e6)\n"
        "with Network(plan):\n"
        "    print(plan.prefix, flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=ENV)
    prefix = proc.stdout.readline().strip()
    try:
        assert prefix.startswith(f"sidco-{proc.pid}-") and len(leftovers(prefix)) == 3
        proc.kill()
        proc.wait()
        assert len(leftovers(prefix)) == 3
        with Network(make_plan(2, 10e6)) as plan:
            assert leftovers(prefix) == []
        assert leftovers(plan.prefix) == []
    finally:
        for name in leftovers(prefix):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


@pytest.mark.root
def test_sigterm_of_emulate_exits_143_in_one_line(tmp_path):
    from emulation.network import leftovers

    argv = SIDCO + ["emulate", "collective", "--workers", "2", "--bandwidth", "5Mbit", "--op", "allreduce",
                    "--bytes", "4MB", "--repeats", "20", "--store", str(tmp_path / "r.sqlite")]
    proc, err = sigterm_when(argv, lambda proc: leftovers(f"sidco-{proc.pid}-"),
                             "the emulation never made its namespaces", settle_s=1.0)
    assert proc.returncode == 143, err[-800:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("sidco emulate: terminated by SIGTERM")
    assert leftovers(f"sidco-{proc.pid}-") == []


def test_sigterm_during_a_profile_keeps_its_rows_and_leaves_no_measuring_process(tmp_path):
    """`sidco profile` measures each CPU size in a child process: SIGTERM while a child measures
    ends both, in one line, and keeps the rows measured so far as a partial profile."""
    from results.store import Store

    store = tmp_path / "r.sqlite"
    quiet_for_profiling()
    # the fewest repeats the host is measured with (it is measured before the first child starts)
    argv = SIDCO + ["profile", "--sizes", "2^12..2^20", "--compressors", "none,topk,sidco-e", "--repeats", "3",
                    "--store", str(store)]
    seen: list[int] = []

    def measuring(proc) -> bool:
        kids = [c for c in children_of(proc.pid) if pid_running(c)]
        seen.extend(kids)
        return bool(kids) and len(set(seen)) >= 2  # past the first size: its rows are in

    proc, err = sigterm_when(argv, measuring, "the profile never reached its second size", timeout_s=120)
    assert proc.returncode == 143 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("sidco profile: terminated by SIGTERM")
    assert wait_for(lambda: not any(pid_running(c) for c in set(seen)), timeout_s=15)
    with Store(store) as s:
        kept = s.query("SELECT source FROM device_profiles")
    assert kept and "partial" in kept[-1]["source"]
