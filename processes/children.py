"""Child processes of the testbed: they import only the testbed, and they never outlive their parent.

Every process the project starts (sweep workers, profiling children, emulation and collective
workers, runs launched from the dashboard) is guarded against two things:

- **Importing from the working directory.** ``python -m M`` puts the current directory first on
  ``sys.path``, so a ``traces/`` folder there (``sidco converge`` writes one beside the store) or
  a planted ``compressors/__init__.py`` would be imported instead of the project (and executed,
  as root for emulation). :func:`module_argv` starts ``python -I`` (isolated: no working
  directory, no ``PYTHON*`` variables, no user site) running this file, which sets the parent's
  import path without the working directory (:func:`import_path`) and then runs the module.
  Forked children (:func:`adopt`) drop the working directory from the path they inherit.
- **Outliving the parent.** A child blocked on its parent (a pool worker on its call queue) or
  busy measuring keeps running when the parent is SIGKILLed. :func:`die_with_parent` asks the
  kernel to SIGKILL the child when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``) and, as
  a second line where that is unavailable or the parent died before it took effect, runs a
  thread that ends the child once its parent pid changes.

This module imports nothing of the project (it runs before the import path is set).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.5
PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
"""The folder the project's packages are imported from (the checkout, or site-packages)."""


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


def die_with_parent(parent_pid: int, *, death_signal: bool = True) -> None:
    """End this process when process ``parent_pid`` (its parent) ends (see the module docstring).

    ``death_signal=False`` keeps only the watching thread (ends the child within
    :data:`WATCH_INTERVAL_S` seconds): the kernel's signal fires when the parent *thread* that
    started the child ends, so a child started from a short-lived thread (a web request) must
    not ask for it. Also restores SIGTERM's default action, so a child told to stop stops."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if death_signal:
        _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch", daemon=True).start()


def import_path(path: Sequence[str] | None = None, cwd: str | None = None) -> list[str]:
    """``path`` (default ``sys.path``) without the working directory ``cwd`` (default this
    process's): entries ``''``, relative ones and ``cwd`` itself are dropped, unless they are
    :data:`PROJECT_ROOT` (a checkout run from its own folder), which is kept as an absolute path."""
    here = os.path.realpath(cwd if cwd is not None else os.getcwd())
    kept: list[str] = []
    for entry in sys.path if path is None else path:
        full = os.path.realpath(os.path.join(here, entry))
        if full == PROJECT_ROOT:
            entry = PROJECT_ROOT
        elif not entry or not os.path.isabs(entry) or full == here:
            continue
        if entry not in kept:
            kept.append(entry)
    return kept


def adopt(parent_pid: int, *, death_signal: bool = True) -> None:
    """Make this forked process a safe child of ``parent_pid``: it dies with it
    (:func:`die_with_parent`), and the import path it inherited no longer holds the working directory."""
    die_with_parent(parent_pid, death_signal=death_signal)
    sys.path[:] = import_path()


def module_argv(module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args`` as a child of this process: isolated from
    the working directory (and ``PYTHON*`` variables), with this process's import path, dying
    with this process. Output is unbuffered (``-u``)."""
    return [sys.executable, "-I", "-u", str(Path(__file__).resolve()), str(os.getpid()),
            json.dumps(import_path()), module, *args]


def running(module: str) -> list[int]:
    """Process ids (this one excepted) running ``module`` as a child started by :func:`module_argv`
    or as ``python -m module``, read from ``/proc`` (empty where there is none)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        boot = [i for i, w in enumerate(words[:4]) if os.path.basename(w) == "children.py"]
        if (boot and words[boot[0] + 3:boot[0] + 4] == [module]) or any(
                a == "-m" and b == module for a, b in zip(words, words[1:])):
            found.append(int(entry.name))
    return sorted(found)


def _main(argv: Sequence[str]) -> None:
    """``children.py PARENT_PID IMPORT_PATH_JSON MODULE ARGS...``: run ``MODULE`` as ``__main__``."""
    parent_pid, path, module, args = int(argv[1]), json.loads(argv[2]), argv[3], list(argv[4:])
    die_with_parent(parent_pid)
    sys.path[:] = path
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv)
