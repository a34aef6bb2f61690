"""Whether a process is alive: the one check behind every "left by a dead process" rule (partial
traces, emulation namespaces), a process's identity beyond its PID (the store's scenario claims:
a container's sweep is PID 1 every time), and the ``/proc`` scans of a process's state and children
(the kill-safety tests). Imports nothing of the project."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a process is, beyond its PID: ``host`` (its host name, to show), ``boot_id`` (the kernel's
    boot id: one machine, one boot), ``pid_ns`` (its PID namespace, e.g. ``pid:[4026531836]``), ``pid``
    (its PID in that namespace) and ``start_ticks`` (when it started, in clock ticks after boot). A
    PID reused by another process, or the PID 1 of every container, differs in start time or namespace;
    an empty ``boot_id`` or ``pid_ns``, or ``start_ticks`` None, is one ``/proc`` did not tell."""

    host: str
    boot_id: str
    pid_ns: str
    pid: int
    start_ticks: int | None


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _proc_is_ours() -> bool:
    """Whether ``/proc`` shows this process's PID namespace (a PID namespace without its own ``/proc``
    mount sees the parent's: ``/proc/PID`` would be another process)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/PID/stat`` field 22), or None."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 and fields[19].isdigit() else None


_IDENTITY: dict[int, ProcessIdentity] = {}
"""This process's identity, by PID (read once; a forked child reads its own)."""


def this_process() -> ProcessIdentity:
    """The identity of the calling process (:class:`ProcessIdentity`), read from ``/proc`` once."""
    pid = os.getpid()
    if pid not in _IDENTITY:
        _IDENTITY.clear()
        _IDENTITY[pid] = _identity()
    return _IDENTITY[pid]


def _identity() -> ProcessIdentity:
    ours = _proc_is_ours()
    return ProcessIdentity(host=socket.gethostname(), boot_id=_read("/proc/sys/kernel/random/boot_id"),
                           pid_ns=_pid_namespace() if ours else "", pid=os.getpid(),
                           start_ticks=start_ticks(os.getpid()) if ours else None)


def provably_gone(who: ProcessIdentity) -> bool:
    """Whether the process ``who`` names has ended, as far as this process can tell: it ran on this
    boot of this machine, in this PID namespace, and its PID is now free, a zombie's, or another
    process's (another start time). False where that cannot be told from here (another machine or
    boot, another PID namespace, an identity or a ``/proc`` that says too little): a lease decides those."""
    here = this_process()
    if not (who.boot_id and who.pid_ns and who.start_ticks is not None and here.pid_ns):
        return False
    if (who.boot_id, who.pid_ns) != (here.boot_id, here.pid_ns):
        return False
    fields = _stat_fields(who.pid)
    return fields is None or fields[0] == "Z" or start_ticks(who.pid) != who.start_ticks


def children_of(pid: int) -> list[int]:
    """Process ids whose parent is process ``pid``, read from ``/proc`` (empty where there is none)."""
    proc = Path("/proc")
    return sorted(int(e.name) for e in (proc.iterdir() if proc.is_dir() else ())
                  if e.name.isdigit() and (fields := _stat_fields(int(e.name))) is not None and int(fields[1]) == pid)
