"""Runs a file of Triton-interpreter checks in a child process: ``TRITON_INTERPRET=1`` must be set
before Triton is imported, so those files (not collected by themselves: their names do not start
with ``test_``) run under pytest in a child of their own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def run_interpreted(name: str) -> int:
    """Run ``tests/<name>`` under the Triton interpreter; assert it passed with nothing skipped and
    return how many tests passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(HERE / name)], capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"\b(\d+) passed\b", done.stdout)
    assert passed and "skipped" not in done.stdout, done.stdout[-1000:]
    return int(passed.group(1))
