"""Background jobs a door starts (the dashboard's sweeps and training runs) as safe children."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processes.children import adopt


def run_as_child(parent_pid: int, job: Callable[..., Any], *args: Any) -> None:
    """Run ``job(*args)`` in this forked process as a safe child of ``parent_pid``
    (:func:`processes.children.adopt`): it ends when the parent ends and imports nothing from
    the working directory. No parent-death signal: the forking thread ends at once."""
    adopt(parent_pid, death_signal=False)
    job(*args)
