"""Scenario claims' owners: who holds a claim (a process identity, not a bare PID), its lease, and the
heartbeat that keeps the lease alive while the owner runs.

A run of a sweep claims the scenarios it computes (:meth:`results.queries.Queries.claim_scenarios`);
another run of the same sweep waits for those rows. A claim lapses, and is taken over, when its
owner's process has provably ended (:func:`processes.liveness.provably_gone`: same machine, boot
and PID namespace, and its PID is free or another process's), or when its owner's heartbeat is
older than :data:`CLAIM_LEASE_S` (an owner on another machine or in another PID namespace, say a
container's PID 1 killed and rerun, or a stopped process). Heartbeats are Unix times of the owner's
clock, read against the reader's: machines sharing a store need clocks within a few seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from processes.liveness import ProcessIdentity, ended

CLAIM_HEARTBEAT_S = 2.0
"""Seconds between two heartbeats of a run that holds claims."""

CLAIM_LEASE_S = 15.0
"""Seconds after its last heartbeat a claim lapses, whether or not its owner can be seen to live."""


def lapsed(owner: Mapping[str, Any], now_s: float, lease_s: float = CLAIM_LEASE_S) -> bool:
    """Whether the claims of ``owner`` (a ``claim_owners`` row: ``host``, ``boot_id``, ``pid_ns``, ``pid``,
    ``start_ticks``, ``heartbeat`` in Unix seconds) lapsed at Unix time ``now_s``: its heartbeat is
    more than ``lease_s`` seconds old, or its process has provably ended (:func:`processes.liveness.ended`)."""
    who = ProcessIdentity(owner["host"] or "", owner["boot_id"] or "", owner["pid_ns"] or "", int(owner["pid"]),
                          owner["start_ticks"])
    return ended(who, float(owner["heartbeat"]), now_s, lease_s)


@contextmanager
def heartbeat(renewer: Callable[[], AbstractContextManager[Callable[[], None]]],
              every_s: float = CLAIM_HEARTBEAT_S) -> Iterator[None]:
    """Run the body while a daemon thread renews a lease every ``every_s`` seconds: the thread enters
    ``renewer()`` (a SQLite connection belongs to the thread that opened it) and calls what it yields.
    A renewal that fails ends the heartbeat: the lease then lapses and another run takes the claims
    over (they are computed twice, never lost)."""
    stop = threading.Event()

    def loop() -> None:
        try:
            with renewer() as renew:
                while not stop.wait(every_s):
                    renew()
        except Exception:  # noqa: BLE001 - a heartbeat that cannot write lets its lease lapse
            return

    thread = threading.Thread(target=loop, name="claims heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
