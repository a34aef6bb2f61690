"""Stopping the dashboard (Ctrl-C or SIGTERM) is its normal end: exit code 0, no traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM])  # Ctrl-C (SIGINT) takes the same path
def test_dashboard_stops_cleanly(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-m", "sidco", "dashboard", "--store", str(tmp_path / "r.sqlite"),
                             "--port", str(_free_port())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("SIDCo dashboard at http://127.0.0.1:"), line + proc.stderr.read()
        port = int(line.split(":")[2].split("/")[0])
        deadline = time.monotonic() + 60
        while True:  # the address is printed just before the server binds
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert rc == 0, err
    assert "Traceback" not in err and "stopped" in err
