"""Local worker processes that never outlive the process that started them.

A ``ProcessPoolExecutor`` worker blocks on its call queue forever when its parent is
killed with SIGKILL (no shutdown message ever comes). :func:`local_pool` starts workers
whose initializer (:func:`die_with_parent`) asks the kernel to SIGKILL them when the
parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``) and, as a second line where that is not
available or the parent died before it took effect, runs a thread that exits the worker
once its parent pid changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.5


def _set_parent_death_signal(signum: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signum)``; False where unavailable (not Linux)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """Pool initializer: end this worker when process ``parent_pid`` ends (see module docstring).

    Also restores SIGTERM's default action, so a worker told to stop stops."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch", daemon=True).start()


def local_pool(jobs: int) -> ProcessPoolExecutor:
    """A process pool of ``jobs`` workers that die with this process."""
    return ProcessPoolExecutor(max_workers=jobs, initializer=die_with_parent, initargs=(os.getpid(),))
