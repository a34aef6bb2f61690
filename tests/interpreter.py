"""Runs the files of Triton-interpreter checks in a child process: ``TRITON_INTERPRET=1`` must be
set before Triton is imported, so those files (not collected by themselves: their names do not start
with ``test_``) run under pytest in a child of their own.

One child runs every file once (:data:`FILES`). The suite starts it as soon as collection shows a
test that asks for it (tests/conftest.py, ``pytest_collection_finish``), at the lowest CPU priority:
on a 2-core machine it takes the core the rest of the suite leaves idle instead of adding minutes
after it; :func:`run_interpreted` gives it the normal priority back if it still runs (as root),
waits for it and reads one file's result."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from processes.children import _set_parent_death_signal

HERE = Path(__file__).parent
FILES = ("fused_interpreted.py", "fused_selection_interpreted.py")
TIMEOUT_S = 1800
"""How long the child may take (seconds): both files, at the lowest priority, on a loaded 2-core machine."""

_child: subprocess.Popen | None = None
_scratch: tempfile.TemporaryDirectory | None = None


def _lowest_priority() -> None:
    """In the child before it runs: the lowest CPU priority, and SIGKILL when the suite ends (even killed)."""
    os.nice(19)
    _set_parent_death_signal(signal.SIGKILL)


def start() -> None:
    """Start the one child that runs every file of :data:`FILES` (once; a second call does nothing)."""
    global _child, _scratch
    if _child is not None:
        return
    _scratch = tempfile.TemporaryDirectory(prefix="sidco-interpreted-")
    scratch = Path(_scratch.name)
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    with open(scratch / "output.txt", "wb") as output:
        _child = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
             f"--junitxml={scratch / 'report.xml'}", *(str(HERE / name) for name in FILES)],
            stdout=output, stderr=subprocess.STDOUT, env=env, cwd=HERE.parent, preexec_fn=_lowest_priority)


def stop() -> None:
    """End the child if it still runs (the suite ended first) and remove its scratch directory."""
    global _child, _scratch
    if _child is not None and _child.poll() is None:
        _child.kill()
        _child.wait()
    if _scratch is not None:
        _scratch.cleanup()
    _child, _scratch = None, None


def _counts(report: Path) -> dict[str, dict[str, int]]:
    """Per file of :data:`FILES`: how many of its tests passed, failed and were skipped (junit XML)."""
    counts = {name: {"passed": 0, "failed": 0, "skipped": 0} for name in FILES}
    for case in ElementTree.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.fused_interpreted[.Class]
        name = next((n for n in FILES if n.removesuffix(".py") in parts), None)
        if name is None:
            continue
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        counts[name][outcome] += 1
    return counts


def _full_priority(pid: int) -> None:
    """Give every thread of process ``pid`` back the normal priority (root only; otherwise it keeps
    its own): the suite now waits for it."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), 0)
        except (PermissionError, ProcessLookupError):
            pass


def run_interpreted(name: str) -> int:
    """The result of ``tests/<name>`` under the Triton interpreter (starting the child if the suite
    has not): assert it passed with nothing skipped and return how many of its tests passed."""
    start()
    assert _child is not None and _scratch is not None
    if _child.poll() is None:
        _full_priority(_child.pid)
    _child.wait(timeout=TIMEOUT_S)
    scratch = Path(_scratch.name)
    output = (scratch / "output.txt").read_text(errors="replace")
    assert _child.returncode == 0, output[-6000:]
    assert re.search(r"\b\d+ passed\b", output), output[-1000:]
    counts = _counts(scratch / "report.xml")[name]
    assert counts["failed"] == 0 and counts["skipped"] == 0, (counts, output[-1000:])
    return counts["passed"]
