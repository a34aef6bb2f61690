"""Read-only queries of the results store for the dashboard pages.

Every function takes a :class:`results.store.Store` and returns plain Python
lists/dicts (JSON-ready), aggregated in SQL so a page stays small and fast on a
store with hundreds of thousands of rows. Units follow the store: seconds,
bytes, bits/s.
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
    "validation": (
        "sidco emulate train --workload resnet20 --workers 2 --bandwidth 100Mbit --compressors none,sidco-e "
        "--density 0.01   (as root; sidco emulate collective + sidco calibrate first for calibrated projections)"
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


def _dicts(rows) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]


def traces(store: Store) -> list[dict[str, Any]]:
    """Registered traces (id, path, workload, workers, iterations, numel), newest first."""
    return _dicts(
        store.query(
            "SELECT id, path, workload, workers, iterations, numel FROM traces ORDER BY created DESC, id DESC"
        )
    )


def trace_row(store: Store, trace_id: int) -> dict[str, Any] | None:
    """One registered trace with its parsed manifest, or ``None``."""
    rows = store.query("SELECT * FROM traces WHERE id=?", (int(trace_id),))
    if not rows:
        return None
    row = dict(rows[0])
    row["manifest"] = json.loads(row.pop("manifest_json"))
    return row


def replays(store: Store) -> list[dict[str, Any]]:
    """Replays with their trace's workload and path, newest first."""
    return _dicts(
        store.query(
            "SELECT r.id, r.trace_id, r.status, r.device, t.workload, t.path"
            " FROM replays r JOIN traces t ON t.id = r.trace_id ORDER BY r.created DESC, r.id DESC"
        )
    )


def replay_series(store: Store, replay_id: int) -> list[dict[str, Any]]:
    """Distinct (compressor, density, error_feedback) series of a replay."""
    return _dicts(
        store.query(
            "SELECT DISTINCT compressor, density, error_feedback FROM replay_rows WHERE replay_id=?"
            " ORDER BY compressor, density DESC, error_feedback DESC",
            (int(replay_id),),
        )
    )


def replay_iterations(store: Store, replay_id: int) -> list[int]:
    """Recorded iteration numbers present in a replay."""
    rows = store.query(
        "SELECT DISTINCT iteration FROM replay_rows WHERE replay_id=? ORDER BY iteration", (int(replay_id),)
    )
    return [int(r[0]) for r in rows]


def quality_by_iteration(store: Store, replay_id: int) -> list[dict[str, Any]]:
    """Per (compressor, density, error_feedback, iteration), over workers and buckets:
    achieved/target of all elements together (Σ selected / Σ numel / density, so a tiny bucket
    where k = max(1, δ·n) rounds up does not dominate), the per-call min and max of
    achieved/target, mean threshold (|g| units) and mean stage count."""
    return _dicts(
        store.query(
            "SELECT compressor, density, error_feedback, iteration,"
            " SUM(selected) * 1.0 / SUM(numel) / density AS achieved_over_target,"
            " MIN(achieved_over_target) AS aot_min, MAX(achieved_over_target) AS aot_max,"
            " AVG(threshold) AS threshold, AVG(stages) AS stages, AVG(rel_error) AS rel_error"
            " FROM replay_rows WHERE replay_id=?"
            " GROUP BY compressor, density, error_feedback, iteration"
            " ORDER BY compressor, density DESC, error_feedback DESC, iteration",
            (int(replay_id),),
        )
    )


def compress_time_by_size(store: Store, replay_id: int) -> list[dict[str, Any]]:
    """Per (compressor, bucket size): median-ish (mean) compress/decompress time in seconds.

    ``nbytes`` is the dense fp32 size of the compressed vector (4 bytes per element).
    """
    return _dicts(
        store.query(
            "SELECT compressor, density, numel, numel * 4 AS nbytes, COUNT(*) AS calls,"
            " AVG(compress_s) AS compress_s, AVG(decompress_s) AS decompress_s"
            " FROM replay_rows WHERE replay_id=? GROUP BY compressor, density, numel"
            " ORDER BY compressor, density DESC, numel",
            (int(replay_id),),
        )
    )


_SWEEP_CACHE: dict[tuple, Any] = {}
_SWEEP_CACHE_SIZE = 64


def landed(store: Store, sweep_id: int) -> int:
    """Scenario rows of a sweep in the store so far (an index-only count)."""
    return int(store.query("SELECT COUNT(*) FROM scenarios WHERE sweep_id=?", (int(sweep_id),))[0][0])


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
    return _dicts(
        store.query(
            "SELECT s.id, s.trace_id, s.total, s.status, s.config_json,"
            " (SELECT COUNT(*) FROM scenarios c WHERE c.sweep_id = s.id) AS landed"
            " FROM sweeps s ORDER BY s.created DESC, s.id DESC"
        )
    )


@_per_sweep
def sweep_axes(store: Store, sweep_id: int) -> dict[str, list]:
    """The distinct values of each sweep dimension (for the page's filters), in two scans."""
    grid = store.query(
        "SELECT nodes, bandwidth_bps, latency_s, topology, fidelity FROM scenarios WHERE sweep_id=?"
        " GROUP BY nodes, bandwidth_bps, latency_s, topology, fidelity",
        (int(sweep_id),),
    )
    configs = store.query(
        "SELECT DISTINCT compressor, density FROM scenarios WHERE sweep_id=?", (int(sweep_id),)
    )
    out: dict[str, list] = {
        "compressor": sorted({r[0] for r in configs}),
        "density": sorted({r[1] for r in configs if r[1] is not None}),
    }
    for index, column in enumerate(("nodes", "bandwidth_bps", "latency_s", "topology", "fidelity")):
        out[column] = sorted({r[index] for r in grid})
    return out


_SCENARIO_COLUMNS = (
    "compressor, density, nodes, bandwidth_bps, latency_s, topology, fidelity, iteration_s,"
    " samples_per_s, forward_s, backward_s, compress_s, exposed_comm_s, idle_s, speedup"
)


def scenarios(store: Store, sweep_id: int, **equal: Any) -> list[dict[str, Any]]:
    """Scenario rows of a sweep, optionally filtered by ``column=value`` equalities.

    A ``None`` value for ``density`` matches rows without a density (``none``).
    """
    allowed = {"compressor", "density", "nodes", "bandwidth_bps", "latency_s", "topology", "fidelity"}
    where = ["sweep_id=?"]
    params: list[Any] = [int(sweep_id)]
    for column, value in equal.items():
        if column not in allowed:
            raise ValueError(f"unknown scenario column {column!r}")
        if value is None:
            continue
        where.append(f"{column}=?")
        params.append(value)
    return _dicts(
        store.query(
            f"SELECT {_SCENARIO_COLUMNS} FROM scenarios WHERE {' AND '.join(where)}"
            " ORDER BY compressor, density, nodes, bandwidth_bps",
            params,
        )
    )


def validation(store: Store) -> list[dict[str, Any]]:
    """Validation rows (measured vs projected iteration time, seconds; error in %; the projection's
    ``fidelity`` and ``network_share``, transfer time ÷ iteration, 0..1; both NULL in older rows)."""
    return _dicts(
        store.query(
            "SELECT v.emulation_id, v.workload, v.compressor, v.density, v.workers, v.bandwidth_bps,"
            " v.measured_s, v.projected_s, v.error_pct, v.calibrated, v.fidelity, v.network_share"
            " FROM validation v ORDER BY v.workload, v.compressor, v.workers, v.bandwidth_bps"
        )
    )


def latest_calibration(store: Store) -> dict[str, Any] | None:
    """The newest calibration (alpha_s, beta_s_per_byte, efficiency) or ``None``."""
    row = store.latest_calibration()
    return dict(row) if row is not None else None


@_per_sweep
def best_two(store: Store, sweep_id: int, latency_s: float, topology: str) -> list[dict[str, Any]]:
    """The fastest and the runner-up scenario (``rank`` 1 and 2) per (nodes, bandwidth) of a
    sweep, among its scenarios with this latency (s) and topology."""
    return _dicts(
        store.query(
            "SELECT nodes, bandwidth_bps, compressor, density, iteration_s, speedup, rank FROM ("
            " SELECT nodes, bandwidth_bps, compressor, density, iteration_s, speedup,"
            " ROW_NUMBER() OVER (PARTITION BY nodes, bandwidth_bps ORDER BY iteration_s) AS rank"
            " FROM scenarios WHERE sweep_id=? AND latency_s=? AND topology=?)"
            " WHERE rank <= 2 ORDER BY nodes, bandwidth_bps, rank",
            (int(sweep_id), float(latency_s), str(topology)),
        )
    )


@_per_sweep
def crossover_points(store: Store, sweep_id: int, bandwidth_bps: float, latency_s: float,
                     topology: str) -> list[dict[str, Any]]:
    """Per (compressor, nodes) at one bandwidth (bits/s), latency (s) and topology: the largest
    density whose speed-up over none is > 1."""
    return _dicts(
        store.query(
            "SELECT compressor, nodes, MAX(density) AS density FROM scenarios"
            " WHERE sweep_id=? AND bandwidth_bps=? AND latency_s=? AND topology=? AND compressor != 'none'"
            " AND density IS NOT NULL AND speedup > 1 GROUP BY compressor, nodes ORDER BY compressor, nodes",
            (int(sweep_id), float(bandwidth_bps), float(latency_s), str(topology)),
        )
    )
