"""A SIGKILLed trace writer leaves its hidden ``.NAME.<pid>.XXXXXXXX.partial`` folder; the next
writer into the same folder removes it whatever its own name (by owner PID: only when that process
is gone), and leaves live writers' folders and anything not ours alone."""

from __future__ import annotations

import os
import subprocess
import sys

from traces.format import TraceWriter, clean_stale_partials

KILLED_WRITER = (
    "import os, signal, sys\n"
    "from traces.format import TraceWriter\n"
    "w = TraceWriter(sys.argv[1], workload='x', layers=[('w', (4,), 'float32')], workers=1)\n"
    "print(w._tmp, flush=True)\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


def test_a_killed_writers_partial_is_removed_by_the_next_writer_of_any_name(tmp_path):
    out = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "first")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == -9
    stale = tmp_path / os.path.basename(out.stdout.strip())
    assert stale.is_dir() and stale.name.startswith(".first.") and stale.name.endswith(".partial")
    live = tmp_path / f".other.{os.getpid()}.abcd1234.partial"  # a writer that is alive (this process)
    live.mkdir()
    foreign = [tmp_path / ".notes.partial", tmp_path / "data.1.abcd1234.partial", tmp_path / ".x.12.short.partial"]
    for path in foreign:
        path.mkdir()
    with TraceWriter(tmp_path / "second", workload="x", layers=[("w", (4,), "float32")], workers=1):
        pass
    assert not stale.exists()
    assert live.is_dir() and all(path.is_dir() for path in foreign)
    assert clean_stale_partials(tmp_path / "third") == []
