"""The threshold compressors' fused selection (DGC, Gaussian-k and RedSync on the compaction
kernel of compressors/kernels/fused.py, through compressors.numerics.selection), checked without a
GPU: exactly against the torch path under the Triton interpreter (tests/fused_selection_interpreted.py,
in a child process: ``TRITON_INTERPRET=1`` must be set before Triton is imported)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_the_fused_selection_matches_the_torch_path_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(HERE / "fused_selection_interpreted.py")], capture_output=True, text=True, env=env,
                          cwd=HERE.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b16 passed\b", done.stdout), done.stdout[-1000:]
