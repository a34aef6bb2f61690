"""What the dashboard pages add to the results store's queries: a per-thread store reader,
the commands that fill an empty page, sweep queries memoized until the sweep gains rows, and
convergence runs with their configuration parsed.

Pages call the store's named queries directly (aggregated in SQL, so a page stays small and
fast on a store with hundreds of thousands of rows); only what adds something lives here.
Units follow the store: seconds, bytes, bits/s.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from results.store import Store, row_id

FILL_COMMANDS = {
    "traces": "sidco capture --workload resnet20 --workers 4 --iterations 20 --out traces/resnet20",
    "replays": "sidco replay traces/resnet20 --compressors sidco-e,topk,dgc --densities 0.01,0.001",
    "sweeps": (
        "sidco sweep --trace traces/resnet20 --nodes 2,4,8,16 --bandwidth 1Gbit,10Gbit "
        "--compressors all --densities 0.01,0.001"
    ),
    "convergences": (
        "sidco converge --workload resnet20 --width 0.25 --workers 2 --iterations 40 --eval-every 10 "
        "--compressors none,topk,sidco-e --densities 0.01   (or launch one with the form)"
    ),
    "validation": (
        "sidco emulate train --workload resnet20 --workers 2 --bandwidth 100Mbit --compressors none,sidco-e "
        "--densities 0.01   (as root; sidco emulate collective + sidco calibrate first for calibrated projections)"
    ),
}


class StoreReader:
    """Opens the store at ``path`` once per thread (sqlite connections are per thread)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._local = threading.local()

    def store(self) -> Store:
        """This thread's :class:`Store` on the file."""
        current = getattr(self._local, "store", None)
        if current is None:
            current = Store(self.path)
            self._local.store = current
        return current


_SWEEP_CACHE: dict[tuple, Any] = {}
_SWEEP_CACHE_SIZE = 64


def _per_sweep(function):
    """Memoize a ``function(store, sweep_id, *args)`` query until the sweep gains rows; a
    ``sweep_id`` no row can have (:func:`results.store.row_id`) is a ValueError naming it.

    Results are keyed by (store file, sweep id, landed row count, args): a sweep
    still running gets fresh answers as rows land; a finished one is read once.
    """

    def cached(store: Store, sweep_id: int, *args: Any) -> Any:
        sweep_id = row_id(sweep_id, "sweep")
        key = (function.__name__, str(store.path), sweep_id, store.scenario_count(sweep_id), args)
        if key not in _SWEEP_CACHE:
            if len(_SWEEP_CACHE) >= _SWEEP_CACHE_SIZE:
                _SWEEP_CACHE.pop(next(iter(_SWEEP_CACHE)))
            _SWEEP_CACHE[key] = function(store, sweep_id, *args)
        return _SWEEP_CACHE[key]

    cached.__name__ = function.__name__
    cached.__doc__ = function.__doc__
    return cached


@_per_sweep
def sweep_axes(store: Store, sweep_id: int) -> dict[str, list]:
    """The distinct values of each sweep dimension (for the page's filters)."""
    return store.sweep_axes(int(sweep_id))


SWEEP_FILTERS = {"latency_s": "latency", "topology": "topology", "nodes": "node count",
                 "bandwidth_bps": "bandwidth"}
"""The Sweeps page's filters: the sweep axis each picks a value of, and its name in a message."""


def check_sweep_filters(store: Store, sweep_id: Any, **chosen: Any) -> int:
    """The id of the Sweeps page's picked sweep, its filters (``latency_s`` (s), ``topology``,
    ``nodes``, ``bandwidth_bps`` (bits/s); ``None``: not chosen) checked against the sweep's own
    axes (:func:`sweep_axes`), so a value the sweep does not have (text, a number of another
    sweep) is not a silently empty plot: ValueError (one line) naming the first, else the id."""
    axes = sweep_axes(store, sweep_id)
    number = row_id(sweep_id, "sweep")
    if not axes["nodes"]:
        raise ValueError(f"sweep #{number} has no scenario in the store")
    for axis, value in chosen.items():
        if value is not None and value not in axes[axis]:
            raise ValueError(f"sweep #{number} has no {SWEEP_FILTERS[axis]} {value!r:.40}; choose one from the list")
    return number


@_per_sweep
def best_two(store: Store, sweep_id: int, latency_s: float, topology: str) -> list[dict[str, Any]]:
    """The fastest and the runner-up scenario (``rank`` 1 and 2) per (nodes, bandwidth) of a
    sweep, among its scenarios with this latency (s) and topology."""
    return store.best_two(int(sweep_id), latency_s, topology)


@_per_sweep
def crossover_points(store: Store, sweep_id: int, bandwidth_bps: float, latency_s: float,
                     topology: str) -> list[dict[str, Any]]:
    """Per (compressor, nodes) at one bandwidth (bits/s), latency (s) and topology: the largest
    density whose speed-up over none is > 1."""
    return store.crossover_points(int(sweep_id), bandwidth_bps, latency_s, topology)


def convergences(store: Store) -> list[dict[str, Any]]:
    """Convergence runs, newest first: id, status, trace_id, parsed config, stored pairs."""
    return [{"id": row["id"], "status": row["status"], "trace_id": row["trace_id"],
             "config": json.loads(row["config_json"]), "pairs": int(row["pairs"])} for row in store.convergences()]
