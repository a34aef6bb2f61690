"""Whether a process is alive: the one check behind every "left by a dead process" rule (partial
traces, emulation namespaces, the store's scenario claims). Imports nothing of the project."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
