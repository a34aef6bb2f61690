"""Whether a process is alive: the one check behind every "left by a dead process" rule (partial
traces, emulation namespaces, the store's scenario claims), and the ``/proc`` scans of a process's
state and children (the kill-safety tests). Imports nothing of the project."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (ended, not yet reaped), read from ``/proc``."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Process ids whose parent is process ``pid``, read from ``/proc`` (empty where there is none)."""
    proc = Path("/proc")
    return sorted(int(e.name) for e in (proc.iterdir() if proc.is_dir() else ())
                  if e.name.isdigit() and (fields := _stat_fields(int(e.name))) is not None and int(fields[1]) == pid)
