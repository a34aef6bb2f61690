"""Compute/communication interference: compute runs ``1 + slowdown`` times slower while the
worker's communication stream transfers (shared memory bandwidth, SMs, PCIe, CPU cores).

Intervals are a worker's transfer intervals ``[start, end]`` (s), sorted and disjoint
(one communication stream). Work is compute seconds at full speed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def advance(
    start: np.ndarray, work: np.ndarray, intervals: Sequence[tuple[np.ndarray, np.ndarray]], slowdown: float
) -> np.ndarray:
    """Per worker, when ``work`` seconds of compute begun at ``start`` end (s), with compute
    ``1 + slowdown`` times slower inside ``intervals`` (each a pair of per-worker arrays)."""
    if not intervals:
        return start + work
    t = np.array(start, dtype=float)
    left = np.array(work, dtype=float)
    factor = 1.0 + slowdown
    for s, e in intervals:
        step = np.minimum(left, np.maximum(s - t, 0.0))
        t += step
        left -= step
        step = np.minimum(left, np.maximum(e - np.maximum(t, s), 0.0) / factor)
        t += step * factor
        left -= step
    return t + left


def advance_one(start: float, work: float, intervals: Sequence[tuple[float, float]], slowdown: float) -> float:
    """Scalar :func:`advance` for one worker."""
    t, left, factor = start, work, 1.0 + slowdown
    for s, e in intervals:
        if e <= t:
            continue
        step = min(left, max(s - t, 0.0))
        t += step
        left -= step
        step = min(left, max(e - max(t, s), 0.0) / factor)
        t += step * factor
        left -= step
        if left <= 0:
            break
    return t + left


def work_done(start: float, now: float, intervals: Sequence[tuple[float, float]], slowdown: float) -> float:
    """Compute seconds (at full speed) achieved between ``start`` and ``now`` (s)."""
    slowed = sum(max(0.0, min(e, now) - max(s, start)) for s, e in intervals)
    return (now - start) - slowed * slowdown / (1.0 + slowdown)
