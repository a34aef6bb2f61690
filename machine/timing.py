"""The one compressor timing loop: a call timed between two synchronisations on one clock.

``sidco bench`` (:mod:`pipeline.bench`), the profiling children (:mod:`measuring.profiling`,
:mod:`measuring.host`) and a replay (:mod:`traces.replay`) time their compress and decompress
calls here, each with the clock it states. Units: seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def no_sync() -> None:
    """The synchronisation of a device whose calls return when their work is done (the CPU)."""


def timed(fn: Callable[[], T], clock: Callable[[], float], sync: Callable[[], None] = no_sync) -> tuple[float, T]:
    """``fn()`` timed on ``clock`` (seconds): ``sync()`` before the start and before the stop, so
    that on a GPU the time holds the work ``fn`` queued and none queued before it. Returns
    ``(seconds, fn's result)``."""
    sync()
    start = clock()
    result = fn()
    sync()
    return clock() - start, result
