"""What a killed process leaves behind (a partial trace, an emulation's network namespaces) is
judged by the one identity rule (:func:`processes.liveness.owner_ended`), not by a bare PID: in a
container the writer is PID 1 every time, so "PID 1 is alive" said nothing, and a partial trace
or a namespace left by a killed PID 1 was never removed. Now an owner in another PID namespace
that stopped beating for the lease has ended; one that provably ended, at once."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from emulation import network
from processes.liveness import OWNER_LEASE_S, OwnerFile, owner_ended, this_process
from traces.format import MANIFEST, PARTIAL_OWNER, TraceWriter, clean_stale_partials, iteration_file

IN_CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
"""A fresh PID namespace per run: the process is PID 1 there, every time (as in a container)."""

WRITER = ("import sys, time\n"
          "from traces.format import TraceWriter\n"
          "w = TraceWriter(sys.argv[1], workload='x', layers=[('w', (4,), 'float32')], workers=1)\n"
          "print(w._tmp, flush=True)\n"
          "time.sleep(600)\n")
CLEANER = ("import os, sys\n"
           "from pathlib import Path\n"
           "from traces.format import clean_stale_partials\n"
           "print(os.getpid(), [p.name for p in clean_stale_partials(Path(sys.argv[1]))], flush=True)\n")
WHO = "import dataclasses, json; from processes.liveness import this_process; print(json.dumps(dataclasses.asdict(this_process())))"


def _lapse(record) -> None:
    """Date the owner's last heartbeat back past the lease (what a killed owner's record shows
    :data:`OWNER_LEASE_S` seconds after it died)."""
    past = time.time() - OWNER_LEASE_S - 5
    os.utime(record, (past, past))


def _in_container(code: str, *args: str) -> str:
    done = subprocess.run(IN_CONTAINER + [sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    return done.stdout


@pytest.mark.root
def test_a_partial_trace_of_a_killed_container_pid_1_is_removed_by_the_next_container(tmp_path):
    writer = subprocess.Popen(IN_CONTAINER + [sys.executable, "-c", WRITER, str(tmp_path / "trace")],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        partial = tmp_path / os.path.basename(writer.stdout.readline().strip())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(writer.pid, signal.SIGKILL)  # the writer (PID 1 of its namespace) dies with unshare
        writer.wait()
    assert partial.name.startswith(".trace.1.") and (partial / PARTIAL_OWNER).is_file()
    record = json.loads((partial / PARTIAL_OWNER).read_text())
    assert record["pid"] == 1 and record["pid_ns"] != this_process().pid_ns
    pid, removed = _in_container(CLEANER, str(tmp_path / "trace")).split(" ", 1)
    assert pid == "1" and removed.strip() == "[]"  # its heartbeat is recent: it may be alive elsewhere
    _lapse(partial / PARTIAL_OWNER)
    pid, removed = _in_container(CLEANER, str(tmp_path / "trace")).split(" ", 1)
    assert pid == "1" and removed.strip() == repr([partial.name])
    assert not partial.exists()


@pytest.mark.root
def test_a_namespace_of_a_killed_container_pid_1_is_stale_once_its_lease_lapsed():
    who = json.loads(_in_container(WHO))
    assert who["pid"] == 1
    prefix = f"{network.PREFIX_ROOT}1-{os.urandom(3).hex()}"
    name = f"{prefix}-w0"
    network.OWNERS_DIR.mkdir(mode=0o700, exist_ok=True)
    record = network.owner_record(prefix)
    record.write_text(json.dumps(who))
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        assert name in network.leftovers() and name not in network.stale()  # within its lease
        _lapse(record)
        assert name in network.stale()
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        record.unlink(missing_ok=True)


def test_an_owner_ends_at_once_where_provable_else_when_its_heartbeat_stops(tmp_path):
    record = tmp_path / "owner.json"
    with OwnerFile(record, every_s=0.05):
        assert owner_ended(record) is False
        before = record.stat().st_mtime
        time.sleep(0.3)
        assert record.stat().st_mtime > before  # the heartbeat
        _lapse(record)
        assert owner_ended(record) is True  # a live owner that stopped beating (stopped, or another machine)
    assert not record.exists() and owner_ended(record) is None
    me = this_process()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for who, gone in ((dataclasses.replace(me, pid=int(child.stdout)), True),  # same namespace, its PID is free
                      (dataclasses.replace(me, pid=1, pid_ns="pid:[1]"), False)):  # another namespace's PID 1
        record.write_text(json.dumps(dataclasses.asdict(who)))
        assert owner_ended(record) is gone
    record.write_text("not a record")
    assert owner_ended(record) is None


def test_a_finished_or_aborted_trace_keeps_no_owner_record_and_a_live_writers_partial_stays(tmp_path):
    with TraceWriter(tmp_path / "t", workload="x", layers=[("w", (4,), "float32")], workers=1) as writer:
        assert (writer._tmp / PARTIAL_OWNER).is_file()
        assert clean_stale_partials(tmp_path / "other") == []  # its writer (this process) lives
        writer.write_iteration(1, [torch.ones(4)])
        path = writer.close(timings={"forward_s": 0.1, "backward_s": [0.1], "optimizer_s": 0.0, "batch_size": 1,
                                     "device": "cpu"})
    assert sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, iteration_file(1)])
    aborted = TraceWriter(tmp_path / "u", workload="x", layers=[("w", (4,), "float32")], workers=1)
    aborted.abort()
    assert not aborted._tmp.exists() and not list(tmp_path.glob("*.partial"))
