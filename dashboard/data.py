"""Read-only queries of the results store for the dashboard pages.

Every function takes a :class:`results.store.Store` and returns plain Python
lists/dicts (JSON-ready) from the store's named queries (aggregated in SQL, so a
page stays small and fast on a store with hundreds of thousands of rows); sweep
queries are memoized here until the sweep gains rows. Units follow the store:
seconds, bytes, bits/s.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from results.store import Store

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


def traces(store: Store) -> list[dict[str, Any]]:
    """Registered traces (id, path, workload, workers, iterations, numel), newest first."""
    return store.trace_list()


def replays(store: Store) -> list[dict[str, Any]]:
    """Replays with their trace's workload and path, newest first."""
    return store.replay_list()


def replay_series(store: Store, replay_id: int) -> list[dict[str, Any]]:
    """Distinct (compressor, density, error_feedback) series of a replay."""
    return store.replay_series(int(replay_id))


def replay_iterations(store: Store, replay_id: int) -> list[int]:
    """Recorded iteration numbers present in a replay."""
    return store.replay_iterations(int(replay_id))


def quality_by_iteration(store: Store, replay_id: int) -> list[dict[str, Any]]:
    """Per (compressor, density, error_feedback, iteration): element-weighted achieved/target,
    its per-call range, mean threshold, stages and relative error (:meth:`Store.quality_by_iteration`)."""
    return store.quality_by_iteration(int(replay_id))


def compress_time_by_size(store: Store, replay_id: int) -> list[dict[str, Any]]:
    """Per (compressor, density, bucket size): mean compress/decompress seconds; ``nbytes`` is
    the dense fp32 size of the compressed vector."""
    return store.compress_time_by_size(int(replay_id))


_SWEEP_CACHE: dict[tuple, Any] = {}
_SWEEP_CACHE_SIZE = 64


def landed(store: Store, sweep_id: int) -> int:
    """Scenario rows of a sweep in the store so far (an index-only count)."""
    return store.scenario_count(int(sweep_id))


def _per_sweep(function):
    """Memoize a ``function(store, sweep_id, *args)`` query until the sweep gains rows.

    Results are keyed by (store file, sweep id, landed row count, args): a sweep
    still running gets fresh answers as rows land; a finished one is read once.
    """

    def cached(store: Store, sweep_id: int, *args: Any) -> Any:
        key = (function.__name__, str(store.path), int(sweep_id), landed(store, sweep_id), args)
        if key not in _SWEEP_CACHE:
            if len(_SWEEP_CACHE) >= _SWEEP_CACHE_SIZE:
                _SWEEP_CACHE.pop(next(iter(_SWEEP_CACHE)))
            _SWEEP_CACHE[key] = function(store, sweep_id, *args)
        return _SWEEP_CACHE[key]

    cached.__name__ = function.__name__
    cached.__doc__ = function.__doc__
    return cached


def sweeps(store: Store) -> list[dict[str, Any]]:
    """Sweeps with their landed scenario count, newest first."""
    return store.sweep_list()


@_per_sweep
def sweep_axes(store: Store, sweep_id: int) -> dict[str, list]:
    """The distinct values of each sweep dimension (for the page's filters)."""
    return store.sweep_axes(int(sweep_id))


def scenarios(store: Store, sweep_id: int, **equal: Any) -> list[dict[str, Any]]:
    """Scenario rows of a sweep, optionally filtered by ``column=value`` equalities (``None``: no filter)."""
    return store.scenarios(int(sweep_id), **equal)


def validation(store: Store) -> list[dict[str, Any]]:
    """Validation rows (measured vs projected iteration time, seconds; error in %; the projection's
    ``fidelity`` and ``network_share``, transfer time ÷ iteration, 0..1; both NULL in older rows)."""
    return store.validation()


def latest_calibration(store: Store) -> dict[str, Any] | None:
    """The newest calibration (alpha_s, beta_s_per_byte, efficiency) or ``None``."""
    return store.latest_calibration()


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
