"""Killing a sweep while it holds claims (tests of sweeps and of their claims share it)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path


def kill_while_claiming(command: list[str], store: Path, total: int) -> int:
    """Start ``command`` (a sweep writing ``store``, of ``total`` scenarios), SIGKILL its process
    group once it holds claims and stored a scenario; returns the scenarios it stored. Fails with the
    sweep's stderr when it ended or stored everything before it could be killed. The store is read
    read-only: a read-write connection made the file before the sweep did, and then saw none of the
    sweep's later commits until it ended."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    claims = seen = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None and not (claims and seen):
            time.sleep(0.02)
            try:
                with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1) as conn:  # never creates it
                    claims = conn.execute("SELECT COUNT(*) FROM scenario_claims").fetchone()[0]
                    seen = conn.execute("SELECT COUNT(*) FROM scenarios").fetchone()[0]
                conn.close()
            except sqlite3.OperationalError:
                continue
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with sqlite3.connect(store) as conn:
        left = conn.execute("SELECT COUNT(*) FROM scenario_claims WHERE scenario_key NOT IN"
                            " (SELECT scenario_key FROM scenarios)").fetchone()[0]
        seen = conn.execute("SELECT COUNT(*) FROM scenarios").fetchone()[0]
    conn.close()
    assert left > 0 and seen < total, (f"exit {proc.returncode}, claims left {left}, stored {seen} of {total}: "
                                       f"{proc.stderr.read().decode()[-500:]}")
    return seen
