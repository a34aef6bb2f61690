"""Children of the testbed never import from the working directory and never outlive their parent
(:mod:`processes.children`): a folder of decoy packages in the working directory is never
imported by emulate, profile or a local sweep; a SIGKILLed ``sidco profile`` leaves no
measuring child; a second ``sidco profile`` refuses to measure beside a live one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from processes import children
from processes.liveness import children_of, pid_alive, pid_running
from test_kill_safety import quiet_for_profiling, wait_for

ROOT = str(Path(__file__).resolve().parents[1])


def isolated(script: str) -> list[str]:
    """``python -I -c script`` with the checkout first on the path: a parent that never looks in its
    working directory, so a marker can only come from a child (and found without an install)."""
    return [sys.executable, "-I", "-c", f"import sys\nsys.path.insert(0, {ROOT!r})\n" + script]


SIDCO = isolated("from sidco.cli import main\nsys.exit(main())\n")
DECOYS = ("traces", "compressors", "simulator", "emulation", "pipeline", "results", "convergence", "measuring", "units")


def _decoy_folder(root: Path) -> Path:
    marker = root / "IMPORTED"
    for name in DECOYS:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\nraise ImportError('decoy {name} imported')\n")
    return marker


def _sidco(argv: list[str], cwd: Path, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(SIDCO + argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["", ".", "./x", "x", "..", "/tmp", "/work/cwd", "/work/cwd/", "/work/cwd/.",
                                 children.PROJECT_ROOT, "/usr/lib/python3", "rel/../x"]), max_size=8))
def test_import_path_never_holds_the_working_directory(path):
    kept = children.import_path(path, cwd="/work/cwd")
    assert all(os.path.isabs(p) for p in kept)
    assert not any(os.path.realpath(p) == "/work/cwd" for p in kept)
    assert len(set(kept)) == len(kept)
    wanted = [p for p in path if os.path.isabs(p) and os.path.realpath(p) != "/work/cwd"]
    assert [p for p in kept if p != children.PROJECT_ROOT] == list(dict.fromkeys(
        p for p in wanted if p != children.PROJECT_ROOT))
    if any(os.path.realpath(os.path.join("/work/cwd", p)) == children.PROJECT_ROOT for p in path):
        assert children.PROJECT_ROOT in kept


def test_a_child_runs_its_module_with_the_parent_path_minus_the_working_directory(tmp_path):
    _decoy_folder(tmp_path)
    script = ("import json, subprocess, sys\n"
              "from processes.children import module_argv\n"
              "sys.path.insert(0, '')\n"
              "argv = module_argv('json.tool', '--compact')\n"
              "done = subprocess.run(argv, input='{\"a\": 1}', capture_output=True, text=True)\n"
              "print(done.stdout.strip(), done.returncode)\n")
    out = subprocess.run(isolated(script), cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ['{"a":1}', "0"], out.stderr


def test_no_child_imports_decoy_packages_from_the_working_directory(tmp_path):
    work = tmp_path / "w"
    marker = _decoy_folder(work)
    store = str(work / "r.sqlite")
    sweep = ["sweep", "--layout", "resnet50", "--nodes", "2,4", "--bandwidth", "1Gbit,10Gbit",
             "--compressors", "none,topk", "--densities", "0.01", "--fidelity", "analytic", "--jobs", "2",
             "--chunk-size", "1", "--store", store]
    emulate = ["emulate", "--no-shaping", "--workers", "2", "--workload", "resnet20", "--compressors", "none",
               "--iterations", "2", "--warmup", "1", "--batch-size", "2", "--fidelity", "analytic",
               "--store", store, "--trace-dir", str(tmp_path / "traces")]
    # one isolated parent starts the three kinds of children in turn, as the commands do: a local
    # sweep's pool workers, an emulation's ranks (each command as main() runs it, the sweep first, on
    # a parent that has imported no more than the sweep command's), then the measuring child of sidco
    # profile (without the host measurement around it: it imports the whole measuring module, then
    # refuses the device, which proves it ran the project's code)
    script = ("import json\n"
              "from sidco.cli import main\n"
              f"for argv in json.loads({json.dumps([sweep, emulate])!r}):\n"
              "    print('exit', argv[0], main(argv), flush=True)\n"
              "from measuring import profiling\n"
              "try:\n"
              "    profiling._size_in_child('no-such-device', 4096, [('topk', 0.01)], 1, 1, None, print)\n"
              "except ChildProcessError as exc:\n"
              "    print(exc, flush=True)\n")
    done = subprocess.run(isolated(script), cwd=work, capture_output=True, text=True, timeout=360)
    assert "ValueError: bad device 'no-such-device'" in done.stdout, (done.stdout, done.stderr)
    assert "exit sweep 0" in done.stdout and "exit emulate 0" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
    assert not marker.exists(), marker.read_text()


def test_sigkilled_profile_leaves_no_measuring_child_and_a_live_one_blocks_the_next(tmp_path):
    # few repeats (the host is measured with as many, before any child starts), many warm-up calls
    # (the child measures for a minute: it is alive while the second profile starts)
    argv = SIDCO + ["profile", "--sizes", "2^22", "--compressors", "topk,sidco-e,dgc,redsync,gaussiank",
                    "--repeats", "3", "--warmup", "300",
                    "--store", str(tmp_path / "r.sqlite")]
    quiet_for_profiling()
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        def measuring() -> bool:  # a child of proc running the measuring module (not, say, a compiler)
            kids.extend(set(children_of(proc.pid)) & set(children.running("measuring.profiling")))
            return bool(kids) or proc.poll() is not None

        wait_for(measuring, 120)
        ended = proc.stderr.read() if proc.poll() is not None else ""
        assert kids, f"the profile never started a measuring child ({proc.poll()}): {ended}"
        assert kids[0] in children.running("measuring.profiling")
        second = _sidco(["profile", "--sizes", "4096", "--compressors", "topk", "--store",
                         str(tmp_path / "r2.sqlite")], tmp_path, timeout_s=60)
        assert second.returncode == 2, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert "another measuring process" in line and "PID " in line  # kids[0], or another checkout's
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_for(lambda: not any(pid_running(k) for k in kids), timeout_s=2), \
            [Path(f"/proc/{k}/cmdline").read_bytes() for k in kids if pid_running(k)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in kids:
            if pid_running(k):
                os.kill(k, signal.SIGKILL)
    assert not set(kids) & set(children.running("measuring.profiling"))


def test_a_forked_child_drops_the_working_directory_and_dies_with_its_parent(tmp_path):
    script = ("import os, sys, time\n"
              "from processes.children import adopt\n"
              "sys.path.insert(0, '')\n"
              "parent = os.getpid()\n"
              "if os.fork() == 0:\n"
              "    adopt(parent)\n"
              "    print(os.getpid(), int('' in sys.path), flush=True)\n"
              "    time.sleep(60)\n"
              "    os._exit(0)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen(isolated(script), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        pid, has_cwd = map(int, proc.stdout.readline().split())
        assert has_cwd == 0 and pid_running(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_for(lambda: not pid_running(pid), timeout_s=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.dumps(children.import_path(["", str(tmp_path)], cwd=str(tmp_path))) == "[]"


DASHBOARD_JOB = (
    "import os, tempfile, threading, time\n"
    "import diskcache\n"
    "from dashboard.app import ChildManager\n"
    "manager = ChildManager(diskcache.Cache(tempfile.mkdtemp()))\n"
    "def job(*args):\n"
    "    time.sleep(60)\n"
    "found = {}\n"
    "request = threading.Thread(target=lambda: found.setdefault('pid', manager.call_job_fn('k', job, (), {})))\n"
    "request.start()\n"
    "request.join()\n"  # the web request's thread ends at once; the job must outlive it
    "print(found['pid'], flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_dashboard_job_outlives_its_request_thread_and_dies_with_the_dashboard(tmp_path):
    proc = subprocess.Popen(isolated(DASHBOARD_JOB), cwd=tmp_path, stdout=subprocess.PIPE,
                            text=True)
    job = None
    try:
        job = int(proc.stdout.readline())
        time.sleep(1.5)
        assert pid_running(job), "the job died with the request thread that started it"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_for(lambda: not pid_running(job), timeout_s=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if job is not None and pid_running(job):
            os.kill(job, signal.SIGKILL)


def test_the_proc_scans_tell_a_child_running_a_zombie_and_a_reaped_one_apart():
    """``children_of`` finds a child by its parent, ``pid_running`` says it runs until it ends,
    ``pid_alive`` still counts it while it is a zombie (ended, not reaped), and neither after."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in children_of(os.getpid()) and pid_running(child.pid) and pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        assert wait_for(lambda: not pid_running(child.pid), timeout_s=10)
        assert pid_alive(child.pid), "a zombie still holds its pid"
    finally:
        child.kill()
        child.wait()
    assert not pid_running(child.pid) and not pid_alive(child.pid) and child.pid not in children_of(os.getpid())
