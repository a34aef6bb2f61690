"""Whether a process is alive: a process's identity beyond its PID (a container's process is PID 1
every time) and the one rule behind every "left by a dead process" judgment (the store's scenario
claims, partial traces, emulation namespaces: :func:`ended`, over a record an :class:`OwnerFile`
keeps), and the ``/proc`` scans of a process's state and children (the kill-safety tests). Imports
nothing of the project."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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


def ended(who: ProcessIdentity, heartbeat_s: float, now_s: float, lease_s: float) -> bool:
    """The one rule for what a process left behind (a claim, a partial trace, a namespace): its owner
    ``who`` has ended when its last heartbeat (Unix time ``heartbeat_s``) is more than ``lease_s``
    seconds before ``now_s`` (Unix s), whether or not it can be seen, or when it provably ended
    (:func:`provably_gone`: at once, where this process can tell)."""
    return now_s - heartbeat_s > lease_s or provably_gone(who)


OWNER_HEARTBEAT_S = 2.0
"""Seconds between two heartbeats of an :class:`OwnerFile` (its modification time set to now)."""

OWNER_LEASE_S = 60.0
"""Seconds after its last heartbeat an :class:`OwnerFile`'s owner counts as ended (:func:`owner_ended`)
where it cannot be seen (another PID namespace, another machine): a stopped owner loses what it
owns after this long."""


class OwnerFile:
    """A file that says which process owns something beside it: the owner's :class:`ProcessIdentity`
    as JSON, and by its modification time the owner's last heartbeat, renewed every ``every_s``
    seconds by a daemon thread from :meth:`start` to :meth:`close` (which removes the file).
    :func:`owner_ended` reads it."""

    def __init__(self, path: str | os.PathLike[str], every_s: float = OWNER_HEARTBEAT_S):
        self.path = Path(path)
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> OwnerFile:
        """Write this process's identity (atomically) and start the heartbeat; returns ``self``."""
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(asdict(this_process())))
        os.replace(tmp, self.path)
        self._thread = threading.Thread(target=self._beat, name=f"owner heartbeat {self.path.name}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                os.utime(self.path)
            except OSError:  # the file is gone (its folder removed): nothing left to keep
                return

    def close(self) -> None:
        """Stop the heartbeat and remove the file (a missing one is fine)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> OwnerFile:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def identity_from(record: Mapping[str, Any]) -> ProcessIdentity | None:
    """The :class:`ProcessIdentity` a record holds (an :class:`OwnerFile`'s JSON), or None when it
    is not one."""
    try:
        ticks = record["start_ticks"]
        return ProcessIdentity(str(record["host"]), str(record["boot_id"]), str(record["pid_ns"]),
                               int(record["pid"]), None if ticks is None else int(ticks))
    except (KeyError, TypeError, ValueError):
        return None


def owner_ended(path: str | os.PathLike[str], lease_s: float = OWNER_LEASE_S) -> bool | None:
    """Whether the owner an :class:`OwnerFile` at ``path`` names has ended (:func:`ended`, its
    modification time the last heartbeat), or None when there is no readable record there."""
    try:
        heartbeat_s = os.stat(path).st_mtime
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    who = identity_from(record) if isinstance(record, dict) else None
    return None if who is None else ended(who, heartbeat_s, time.time(), lease_s)


def children_of(pid: int) -> list[int]:
    """Process ids whose parent is process ``pid``, read from ``/proc`` (empty where there is none)."""
    proc = Path("/proc")
    return sorted(int(e.name) for e in (proc.iterdir() if proc.is_dir() else ())
                  if e.name.isdigit() and (fields := _stat_fields(int(e.name))) is not None and int(fields[1]) == pid)
