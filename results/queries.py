"""Named queries of the results store: the only place the testbed writes SQL for its tables.

:class:`Queries` is mixed into :class:`results.store.Store`; every method runs on the
store's connection (``self.conn``) and writes go through ``self.transaction()``.
Results are plain dicts (JSON-ready). Units follow the schema: seconds, bytes, bits/s.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from processes.liveness import this_process
from results.claims import CLAIM_HEARTBEAT_S, CLAIM_LEASE_S, heartbeat, lapsed
from results.errors import guard

REPLAY_ROW_COLUMNS = (
    "compressor", "density", "error_feedback", "iteration", "worker", "bucket", "numel", "selected",
    "achieved_density", "achieved_over_target", "threshold", "stages", "compress_s", "decompress_s",
    "wire_bytes", "rel_error", "backend", "call_index", "energy", "topk_energy", "fallback",
)
"""Columns of ``replay_rows`` besides ``replay_id`` (``backend``, ``call_index`` (schema v2), ``energy``,
``topk_energy`` (v4), ``fallback`` (v5: 1 when the count guard sent the exact top-k) may be absent
from a row)."""

SCENARIO_COLUMNS = (
    "compressor", "density", "nodes", "bandwidth_bps", "latency_s", "topology", "fidelity", "iteration_s",
    "samples_per_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s", "speedup",
    "iteration_s_low", "iteration_s_high", "speedup_low", "speedup_high",
)
"""The ``scenarios`` columns the dashboard reads (not the stored ``result_json``)."""

_SCENARIO_FILTERS = frozenset({"compressor", "density", "nodes", "bandwidth_bps", "latency_s", "topology", "fidelity"})
_RESUMABLE = frozenset({"replays", "sweeps", "convergences"})
_WITH_STATUS = frozenset({"replays", "sweeps", "emulations", "convergences"})


def config_key(config: Mapping[str, Any]) -> str:
    """Return a canonical string identifying ``config`` (sorted-key JSON)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


def _dicts(rows: Iterable[sqlite3.Row]) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def _insert_calibration(cur: sqlite3.Cursor, created: float, alpha_s: float, beta_s_per_byte: float,
                        efficiency: float, source: Mapping[str, Any], op: str | None,
                        fit_error_pct: float | None) -> int:
    """Insert one calibrations row (the one home of that INSERT); returns its id."""
    cur.execute("INSERT INTO calibrations(created, alpha_s, beta_s_per_byte, efficiency, source_json, op,"
                " fit_error_pct) VALUES(?, ?, ?, ?, ?, ?, ?)",
                (created, alpha_s, beta_s_per_byte, efficiency, json.dumps(source, sort_keys=True), op,
                 fit_error_pct))
    return int(cur.lastrowid)


class Queries:
    """Named reads and writes of the store's tables (mixed into :class:`results.store.Store`)."""

    conn: sqlite3.Connection
    path: Path
    transaction: Callable[[], AbstractContextManager[sqlite3.Cursor]]  # Store's

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Every row of a read; SQLite and OS errors become one-line :class:`StoreError` s."""
        with guard(self.path):
            return self.conn.execute(sql, params).fetchall()

    def _one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = self._rows(sql, params)
        return rows[0] if rows else None

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return _dicts(self._rows(sql, params))

    def _first(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        row = self._one(sql, params)
        return None if row is None else dict(row)

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._rows(sql, params)[0][0])

    # -- meta ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        """The text stored under ``key`` in the ``meta`` table, or ``None``."""
        row = self._one("SELECT value FROM meta WHERE key=?", (key,))
        return None if row is None else str(row[0])

    def pin_meta(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless a value is already there; return the stored one
        (one transaction: of two concurrent writers, both get the first one's value)."""
        with self.transaction() as cur:
            cur.execute("INSERT OR IGNORE INTO meta(key, value) VALUES(?, ?)", (key, value))
            return str(cur.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0])

    # -- resumable runs (replays, sweeps, convergences) and status ----------------------------

    def get_or_create(self, table: str, config: Mapping[str, Any], **columns: Any) -> tuple[int, bool]:
        """Find the row of ``table`` (replays, sweeps, convergences) with this ``config``, or create it.

        Returns ``(id, created)``; a rerun of the same configuration finds the same id,
        which is what makes replays and sweeps resumable.
        """
        if table not in _RESUMABLE:
            raise ValueError(f"{table!r} is not a resumable table ({', '.join(sorted(_RESUMABLE))})")
        key = config_key(config)
        with self.transaction() as cur:
            row = cur.execute(f"SELECT id FROM {table} WHERE config_key=?", (key,)).fetchone()
            if row is not None:
                return int(row[0]), False
            names = ["config_key", "config_json", "created", *columns]
            values = [key, json.dumps(config, sort_keys=True, default=str), time.time(), *columns.values()]
            cur.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({_marks(names)})", values)
            return int(cur.lastrowid), True

    def set_status(self, table: str, row_id: int, status: str) -> None:
        """Set ``status`` (and ``finished`` when done) of a replay, sweep, emulation or convergence."""
        if table not in _WITH_STATUS:
            raise ValueError(f"{table!r} has no status column")
        with self.transaction() as cur:
            if status == "done" and table != "emulations":
                cur.execute(f"UPDATE {table} SET status=?, finished=? WHERE id=?", (status, time.time(), row_id))
            else:
                cur.execute(f"UPDATE {table} SET status=? WHERE id=?", (status, row_id))

    # -- traces -------------------------------------------------------------------------------

    def register_trace(self, path: str | Path, manifest: Mapping[str, Any], content_sha256: str | None = None) -> int:
        """Register (or refresh) the trace at ``path``; return its id. ``content_sha256``: the digest of
        its files (:meth:`traces.Trace.content_sha256`) when the caller read them; without it a
        trace whose manifest changed has an unknown content (its replays are matched by the manifest's
        ``trace_id``, :meth:`replays_of_trace`)."""
        resolved = str(Path(path).resolve())
        layers = manifest.get("layers", [])
        numel = 0
        for layer in layers:
            count = 1
            for dim in layer.get("shape", []):
                count *= int(dim)
            numel += count
        iterations = manifest.get("iterations", [])
        text = json.dumps(manifest, sort_keys=True)
        values = (
            manifest.get("workload"),
            manifest.get("workers"),
            len(iterations) if isinstance(iterations, list) else iterations,
            numel,
            time.time(),
            text,
        )
        with self.transaction() as cur:
            row = cur.execute("SELECT id FROM traces WHERE path=?", (resolved,)).fetchone()
            if row is None:
                cur.execute(
                    "INSERT INTO traces(path, workload, workers, iterations, numel, created, manifest_json,"
                    " content_sha256) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                    (resolved, *values, content_sha256),
                )
                return int(cur.lastrowid)
            cur.execute(
                "UPDATE traces SET content_sha256=CASE WHEN ? IS NOT NULL THEN ? WHEN manifest_json=? THEN"
                " content_sha256 END, workload=?, workers=?, iterations=?, numel=?, created=?, manifest_json=?"
                " WHERE id=?",
                (content_sha256, content_sha256, text, *values, row[0]),
            )
            return int(row[0])

    def traces(self) -> list[dict[str, Any]]:
        """All registered traces (every column), newest first."""
        return [dict(r) for r in self._rows("SELECT * FROM traces ORDER BY created DESC, id DESC")]

    def trace_list(self) -> list[dict[str, Any]]:
        """Registered traces (id, path, workload, workers, iterations, numel), newest first."""
        return self._all("SELECT id, path, workload, workers, iterations, numel FROM traces"
                         " ORDER BY created DESC, id DESC")

    def trace(self, trace_id: int) -> dict[str, Any] | None:
        """One registered trace with its parsed ``manifest``, or ``None``."""
        rows = self._all("SELECT * FROM traces WHERE id=?", (int(trace_id),))
        if not rows:
            return None
        row = rows[0]
        row["manifest"] = json.loads(row.pop("manifest_json"))
        return row

    def trace_id_for_path(self, resolved_path: str) -> int | None:
        """The id of the trace registered at ``resolved_path`` (absolute), or ``None``."""
        row = self._one("SELECT id FROM traces WHERE path=?", (resolved_path,))
        return None if row is None else int(row[0])

    # -- replays ------------------------------------------------------------------------------

    def replay_list(self) -> list[dict[str, Any]]:
        """Replays with their trace's workload and path, newest first."""
        return self._all("SELECT r.id, r.trace_id, r.status, r.device, t.workload, t.path"
                         " FROM replays r JOIN traces t ON t.id = r.trace_id ORDER BY r.created DESC, r.id DESC")

    def replays_of_trace(self, trace_id: int) -> list[dict[str, Any]]:
        """The replays of one trace's current content (id, device, status, created, config_json), newest
        first. A replay whose configuration records a ``content_sha256`` belongs to it when that is the
        trace's (where the store knows the trace's); else one that records the manifest's ``trace_id``
        when that is the current one (a trace rewritten at the same path gets a new one); one that
        records neither is kept. A replay of files that changed since is left out: it describes other
        gradients."""
        trace = self._one("SELECT manifest_json, content_sha256 FROM traces WHERE id=?", (int(trace_id),))
        if trace is None:
            return []
        content = trace["content_sha256"]
        written = json.loads(trace["manifest_json"]).get("trace_id")

        def current(config: Mapping[str, Any]) -> bool:
            if content and config.get("content_sha256"):
                return config["content_sha256"] == content
            return "trace_id" not in config or config["trace_id"] == written

        replays = self._all("SELECT id, device, status, created, config_json FROM replays WHERE trace_id=?"
                            " ORDER BY created DESC, id DESC", (int(trace_id),))
        return [r for r in replays if current(json.loads(r["config_json"]))]

    def replay_rows(self, replay_id: int, error_feedback: bool | None = None,
                    compressors: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The rows of a replay (optionally only with/without error feedback, only of
        ``compressors``), in replay order."""
        where, params = "replay_id=?", [int(replay_id)]
        if error_feedback is not None:
            where += " AND error_feedback=?"
            params.append(int(error_feedback))
        if compressors is not None:
            where += f" AND compressor IN ({_marks(compressors)})"
            params.extend(compressors)
        return self._all(f"SELECT * FROM replay_rows WHERE {where}"
                         " ORDER BY compressor, density, iteration, worker, bucket", params)

    def add_replay_rows(self, replay_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert replay rows (dicts keyed by :data:`REPLAY_ROW_COLUMNS`) in one transaction; returns the count."""
        return self._insert_rows("replay_rows", ({"replay_id": replay_id, **row} for row in rows))

    def replace_replay_combination(self, replay_id: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write the rows of one (compressor, density, error feedback) in one transaction,
        replacing whatever a run that stopped halfway left of it."""
        first = rows[0]
        columns = ["replay_id", *(c for c in REPLAY_ROW_COLUMNS if c in first)]
        with self.transaction() as cur:
            cur.execute(
                "DELETE FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?",
                (replay_id, first["compressor"], first["density"], first["error_feedback"]),
            )
            cur.executemany(f"INSERT INTO replay_rows ({', '.join(columns)}) VALUES ({_marks(columns)})",
                            [(replay_id, *(row[c] for c in columns[1:])) for row in rows])

    def complete_combinations(self, replay_id: int, error_feedback: bool, calls: int) -> set[tuple[str, float]]:
        """The (compressor, density) pairs of a replay that hold all ``calls`` rows, each with its
        ``energy`` (rows stored before schema version 4 lack it: a rerun measures them again)."""
        rows = self._rows(
            "SELECT compressor, density, COUNT(energy) FROM replay_rows WHERE replay_id=? AND error_feedback=?"
            " GROUP BY compressor, density", (replay_id, int(error_feedback)),
        )
        return {(r[0], float(r[1])) for r in rows if r[2] == calls}

    def replay_summary(self, replay_id: int, compressor: str, density: float,
                       error_feedback: bool) -> dict[str, Any] | None:
        """Means over one combination's rows (seconds, bytes, elements), or ``None`` without rows."""
        row = self._all(
            "SELECT COUNT(*) AS calls, SUM(numel) AS elements, AVG(achieved_density) AS achieved_density,"
            " AVG(achieved_over_target) AS achieved_over_target, MIN(achieved_over_target) AS min_over_target,"
            " MAX(achieved_over_target) AS max_over_target, AVG(stages) AS mean_stages,"
            " AVG(compress_s) AS compress_s, AVG(decompress_s) AS decompress_s, SUM(compress_s) AS total_compress_s,"
            " AVG(wire_bytes) AS wire_bytes, AVG(numel) AS numel, AVG(rel_error) AS rel_error,"
            " GROUP_CONCAT(DISTINCT backend) AS backend"
            " FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?",
            (replay_id, compressor, density, int(error_feedback)),
        )[0]
        return row if row["calls"] else None

    def replay_quality(self, replay_id: int, compressor: str, density: float,
                       error_feedback: bool = True) -> dict[str, Any] | None:
        """What one combination of a replay sends, over its calls: ``calls``, means of
        ``achieved_density``, ``achieved_over_target`` and ``energy`` (share of the input's squared
        norm sent), ``energy_vs_topk`` (mean of energy ÷ topk_energy over the calls where Top-k
        sends anything; ``None`` without Top-k's energy), ``measured`` (calls carrying an energy);
        ``None`` without rows."""
        row = self._all(
            "SELECT COUNT(*) AS calls, COUNT(energy) AS measured, AVG(achieved_density) AS achieved_density,"
            " AVG(achieved_over_target) AS achieved_over_target, AVG(energy) AS energy,"
            " AVG(CASE WHEN topk_energy > 0 THEN energy / topk_energy END) AS energy_vs_topk"
            " FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?",
            (int(replay_id), compressor, float(density), int(error_feedback)),
        )[0]
        return row if row["calls"] else None

    def replay_phases(self, replay_id: int, compressor: str, density: float, error_feedback: bool,
                      first_calls: int) -> dict[str, dict[str, Any]]:
        """Achieved/target of one combination's first ``first_calls`` calls of each compressor
        instance apart from its later (steady) calls: ``{"first"|"steady": {calls, mean, low, high}}``
        (rows without a ``call_index`` are left out)."""
        rows = self._all(
            "SELECT call_index >= ? AS steady, COUNT(*) AS calls, AVG(achieved_over_target) AS mean,"
            " MIN(achieved_over_target) AS low, MAX(achieved_over_target) AS high"
            " FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?"
            " AND call_index IS NOT NULL GROUP BY steady",
            (int(first_calls), replay_id, compressor, density, int(error_feedback)),
        )
        return {("steady" if row["steady"] else "first"): row for row in rows}

    def replay_series(self, replay_id: int) -> list[dict[str, Any]]:
        """Distinct (compressor, density, error_feedback) series of a replay."""
        return self._all("SELECT DISTINCT compressor, density, error_feedback FROM replay_rows WHERE replay_id=?"
                         " ORDER BY compressor, density DESC, error_feedback DESC", (int(replay_id),))

    def replay_iterations(self, replay_id: int) -> list[int]:
        """Recorded iteration numbers present in a replay."""
        rows = self._rows("SELECT DISTINCT iteration FROM replay_rows WHERE replay_id=? ORDER BY iteration",
                          (int(replay_id),))
        return [int(r[0]) for r in rows]

    def quality_by_iteration(self, replay_id: int) -> list[dict[str, Any]]:
        """Per (compressor, density, error_feedback, iteration), over workers and buckets:
        achieved/target of all elements together (Σ selected / Σ numel / density), the per-call
        min and max of achieved/target, mean threshold (|g| units), stage count and relative error."""
        return self._all(
            "SELECT compressor, density, error_feedback, iteration,"
            " SUM(selected) * 1.0 / SUM(numel) / density AS achieved_over_target,"
            " MIN(achieved_over_target) AS aot_min, MAX(achieved_over_target) AS aot_max,"
            " AVG(threshold) AS threshold, AVG(stages) AS stages, AVG(rel_error) AS rel_error"
            " FROM replay_rows WHERE replay_id=?"
            " GROUP BY compressor, density, error_feedback, iteration"
            " ORDER BY compressor, density DESC, error_feedback DESC, iteration",
            (int(replay_id),),
        )

    def compress_time_by_size(self, replay_id: int) -> list[dict[str, Any]]:
        """Per (compressor, density, bucket numel): calls and mean compress/decompress seconds;
        ``nbytes`` is the dense fp32 size (4 bytes per element)."""
        return self._all(
            "SELECT compressor, density, numel, numel * 4 AS nbytes, COUNT(*) AS calls,"
            " AVG(compress_s) AS compress_s, AVG(decompress_s) AS decompress_s"
            " FROM replay_rows WHERE replay_id=? GROUP BY compressor, density, numel"
            " ORDER BY compressor, density DESC, numel",
            (int(replay_id),),
        )

    # -- device profiles ----------------------------------------------------------------------

    def add_device_profile(self, device: str, identity: Mapping[str, Any], source: str,
                           rows: Iterable[Mapping[str, Any]]) -> int:
        """Store a device profile and its rows (compressor, density, numel, compress_s,
        decompress_s[, wire_bytes, backend]) in one transaction; returns its id."""
        with self.transaction() as cur:
            cur.execute("INSERT INTO device_profiles(device, identity_json, source, created) VALUES(?, ?, ?, ?)",
                        (device, json.dumps(identity, sort_keys=True), source, time.time()))
            profile_id = int(cur.lastrowid)
            cur.executemany(
                "INSERT INTO device_profile_rows(profile_id, compressor, density, numel, compress_s, decompress_s,"
                " wire_bytes, backend) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                [(profile_id, r["compressor"], float(r["density"]), int(r["numel"]), float(r["compress_s"]),
                  float(r["decompress_s"]), r.get("wire_bytes"), r.get("backend")) for r in rows],
            )
        return profile_id

    def device_profiles(self, device: str) -> list[dict[str, Any]]:
        """The stored profiles of ``device`` (id, identity_json, source, created), newest first."""
        return self._all("SELECT * FROM device_profiles WHERE device=? ORDER BY created DESC, id DESC", (device,))

    def device_profile_list(self) -> list[dict[str, Any]]:
        """Every stored device profile (id, device, source, created, row count), newest first."""
        return self._all("SELECT p.id, p.device, p.source, p.created, COUNT(r.profile_id) AS rows"
                         " FROM device_profiles p LEFT JOIN device_profile_rows r ON r.profile_id = p.id"
                         " GROUP BY p.id ORDER BY p.created DESC, p.id DESC")

    def device_profile_rows(self, profile_id: int) -> list[dict[str, Any]]:
        """The rows of one device profile."""
        return self._all("SELECT * FROM device_profile_rows WHERE profile_id=? ORDER BY compressor, density, numel",
                         (int(profile_id),))

    # -- step profiles (a model's training step, sidco profile --model) -------------------------

    def add_step_profile(self, model: str, device: str, precision: str, batch_size: int, tokens: int,
                         step_s: float, profile_json: str) -> int:
        """Store a measured training step of ``model`` on ``device`` (``step_s`` seconds at
        ``batch_size`` samples of ``tokens`` tokens in ``precision``; ``profile_json`` the whole
        step profile file); returns its id."""
        with self.transaction() as cur:
            cur.execute("INSERT INTO step_profiles(model, device, precision, batch_size, tokens, step_s, samples_per_s,"
                        " profile_json, created) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (model, device, precision, int(batch_size), int(tokens), float(step_s),
                         int(batch_size) / float(step_s), profile_json, time.time()))
            return int(cur.lastrowid)

    def step_profiles(self) -> list[dict[str, Any]]:
        """Every stored step profile (id, model, device, precision, batch_size, tokens, step_s,
        samples_per_s, profile_json, created), newest first."""
        return self._all("SELECT * FROM step_profiles ORDER BY created DESC, id DESC")

    def step_profile(self, profile_id: int) -> dict[str, Any] | None:
        """The stored step profile ``profile_id`` (the columns of :meth:`step_profiles`), ``None`` when
        there is none."""
        return self._first("SELECT * FROM step_profiles WHERE id=?", (int(profile_id),))

    # -- sweeps and scenarios -----------------------------------------------------------------

    def sweep_list(self) -> list[dict[str, Any]]:
        """Sweeps with their landed scenario count, newest first."""
        return self._all("SELECT s.id, s.trace_id, s.total, s.status, s.config_json,"
                         " (SELECT COUNT(*) FROM scenarios c WHERE c.sweep_id = s.id) AS landed"
                         " FROM sweeps s ORDER BY s.created DESC, s.id DESC")

    def sweep(self, sweep_id: int) -> dict[str, Any] | None:
        """One sweep (id, trace_id, total, status, config_json), ``None`` when there is none with that id."""
        return self._first("SELECT id, trace_id, total, status, config_json FROM sweeps WHERE id=?", (int(sweep_id),))

    def scenario_count(self, sweep_id: int) -> int:
        """Scenario rows of a sweep in the store so far (an index-only count)."""
        return self._count("SELECT COUNT(*) FROM scenarios WHERE sweep_id=?", (int(sweep_id),))

    def stored_scenario_keys(self, sweep_id: int, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` a sweep already holds."""
        if not keys:
            return set()
        rows = self._rows(f"SELECT scenario_key FROM scenarios WHERE sweep_id=? AND scenario_key IN"
                          f" ({_marks(keys)})", (int(sweep_id), *keys))
        return {r[0] for r in rows}

    def claim_scenarios(self, sweep_id: int, keys: Sequence[str], owner: str, *,
                        lease_s: float = CLAIM_LEASE_S) -> set[str]:
        """Claim for ``owner`` (one run of the sweep, in this process) the scenarios of ``keys``
        that are neither stored nor claimed by another owner whose claims hold, in one transaction;
        returns the keys ``owner`` holds now (the ones it computes). An owner's claims lapse when
        its process has provably ended or its heartbeat is older than ``lease_s`` seconds
        (:func:`results.claims.lapsed`); those are dropped, all of them, so a killed run, a container's
        PID 1 killed and rerun, or a stopped process never blocks another for longer than the lease.
        Records this process's identity (:func:`processes.liveness.this_process`) and a heartbeat."""
        if not keys:
            return set()
        marks = _marks(keys)
        with self.transaction() as cur:
            stored = {r[0] for r in cur.execute(
                f"SELECT scenario_key FROM scenarios WHERE sweep_id=? AND scenario_key IN ({marks})", (sweep_id, *keys))}
            held = cur.execute(f"SELECT c.scenario_key, o.* FROM scenario_claims c JOIN claim_owners o USING(owner)"
                               f" WHERE c.sweep_id=? AND c.scenario_key IN ({marks}) AND c.owner != ?",
                               (sweep_id, *keys, owner)).fetchall()
            now = time.time()
            owners = {r["owner"]: r for r in held}
            dead = {owner for owner, r in owners.items() if lapsed(r, now, lease_s)}
            for gone in dead:
                cur.execute("DELETE FROM scenario_claims WHERE owner=?", (gone,))
                cur.execute("DELETE FROM claim_owners WHERE owner=?", (gone,))
            taken = {r["scenario_key"] for r in held if r["owner"] not in dead}
            mine = [key for key in dict.fromkeys(keys) if key not in stored and key not in taken]
            me = this_process()
            cur.execute("INSERT INTO claim_owners(owner, host, boot_id, pid_ns, pid, start_ticks, heartbeat)"
                        " VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(owner) DO UPDATE SET heartbeat=excluded.heartbeat",
                        (owner, me.host, me.boot_id, me.pid_ns, me.pid, me.start_ticks, now))
            cur.executemany("INSERT OR REPLACE INTO scenario_claims(sweep_id, scenario_key, owner, claimed)"
                            " VALUES(?, ?, ?, ?)", [(sweep_id, key, owner, now) for key in mine])
            return set(mine)

    def scenario_claims(self, sweep_id: int, keys: Sequence[str], *,
                        lease_s: float = CLAIM_LEASE_S) -> dict[str, dict[str, Any]]:
        """Which of ``keys`` are claimed, and by whom: key → the owner (``owner``, ``host``, ``pid``,
        ``heartbeat`` (Unix s), ``expires`` (Unix s: when its claims lapse unless it beats again)
        and ``lapsed`` (whether they lapsed already, :func:`results.claims.lapsed`))."""
        if not keys:
            return {}
        rows = self._rows(f"SELECT c.scenario_key, o.* FROM scenario_claims c JOIN claim_owners o USING(owner)"
                          f" WHERE c.sweep_id=? AND c.scenario_key IN ({_marks(keys)})", (int(sweep_id), *keys))
        now = time.time()
        verdicts: dict[str, bool] = {}  # one look per owner, not per scenario
        for r in rows:
            if r["owner"] not in verdicts:
                verdicts[r["owner"]] = lapsed(r, now, lease_s)
        return {r["scenario_key"]: {"owner": r["owner"], "host": r["host"], "pid": int(r["pid"]),
                                    "heartbeat": float(r["heartbeat"]), "expires": float(r["heartbeat"]) + lease_s,
                                    "lapsed": verdicts[r["owner"]]} for r in rows}

    def renew_claims(self, owner: str) -> None:
        """The heartbeat of ``owner``'s claims: their lease starts again now."""
        with self.transaction() as cur:
            cur.execute("UPDATE claim_owners SET heartbeat=? WHERE owner=?", (time.time(), owner))

    def claims_kept(self, owner: str, every_s: float = CLAIM_HEARTBEAT_S) -> AbstractContextManager[None]:
        """Keep ``owner``'s claims alive while the body runs: a heartbeat every ``every_s`` seconds,
        on a connection of its own (:func:`results.claims.heartbeat`)."""
        @contextmanager
        def renewer() -> Iterator[Callable[[], None]]:
            with type(self)(self.path) as store:
                yield lambda: store.renew_claims(owner)

        return heartbeat(renewer, every_s)

    def release_claims(self, sweep_id: int, owner: str) -> None:
        """Drop every claim ``owner`` holds on the sweep, and the owner (its run ended, finished or not)."""
        with self.transaction() as cur:
            cur.execute("DELETE FROM scenario_claims WHERE sweep_id=? AND owner=?", (int(sweep_id), owner))
            cur.execute("DELETE FROM claim_owners WHERE owner=? AND owner NOT IN (SELECT owner FROM scenario_claims)",
                        (owner,))

    def add_scenarios(self, sweep_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert scenario rows in one transaction, skipping keys already stored; returns the count offered."""
        return self._insert_rows("scenarios", ({"sweep_id": sweep_id, **row} for row in rows), or_ignore=True)

    def sweep_axes(self, sweep_id: int) -> dict[str, list]:
        """The distinct values of each sweep dimension, in two scans."""
        grid = self._rows(
            "SELECT nodes, bandwidth_bps, latency_s, topology, fidelity FROM scenarios WHERE sweep_id=?"
            " GROUP BY nodes, bandwidth_bps, latency_s, topology, fidelity", (int(sweep_id),))
        configs = self._rows("SELECT DISTINCT compressor, density FROM scenarios WHERE sweep_id=?",
                             (int(sweep_id),))
        out: dict[str, list] = {
            "compressor": sorted({r[0] for r in configs}),
            "density": sorted({r[1] for r in configs if r[1] is not None}),
        }
        for index, column in enumerate(("nodes", "bandwidth_bps", "latency_s", "topology", "fidelity")):
            out[column] = sorted({r[index] for r in grid})
        return out

    def scenarios(self, sweep_id: int, fields: Sequence[str] = (), **equal: Any) -> list[dict[str, Any]]:
        """Scenario rows of a sweep (:data:`SCENARIO_COLUMNS`), filtered by ``column=value``
        equalities (a ``None`` value is no filter), each with the ``fields`` of its stored
        ``result_json`` besides (``None`` where a row's JSON lacks one)."""
        where, params = ["sweep_id=?"], [int(sweep_id)]
        for column, value in equal.items():
            if column not in _SCENARIO_FILTERS:
                raise ValueError(f"unknown scenario column {column!r}")
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        columns = [*SCENARIO_COLUMNS, *(["result_json"] if fields else [])]
        rows = self._all(f"SELECT {', '.join(columns)} FROM scenarios WHERE {' AND '.join(where)}"
                         " ORDER BY compressor, density, nodes, bandwidth_bps", params)
        for row in rows if fields else ():
            stored = json.loads(row.pop("result_json"))
            row.update((name, stored.get(name)) for name in fields)
        return rows

    def best_two(self, sweep_id: int, latency_s: float, topology: str) -> list[dict[str, Any]]:
        """The fastest and the runner-up scenario (``rank`` 1 and 2) per (nodes, bandwidth) of a
        sweep, among its scenarios with this latency (s) and topology, those that fit in one GPU's
        memory first (as ``sidco sweep`` picks a cluster's best: a scenario whose stored ``fits`` is
        false ranks after every other; ``fits`` 0, 1 or ``None`` where unrecorded)."""
        return self._all(
            "SELECT nodes, bandwidth_bps, compressor, density, iteration_s, speedup, fits, rank FROM ("
            " SELECT nodes, bandwidth_bps, compressor, density, iteration_s, speedup,"
            " json_extract(result_json, '$.fits') AS fits,"
            " ROW_NUMBER() OVER (PARTITION BY nodes, bandwidth_bps"
            " ORDER BY json_extract(result_json, '$.fits') IS 0, iteration_s) AS rank"
            " FROM scenarios WHERE sweep_id=? AND latency_s=? AND topology=?)"
            " WHERE rank <= 2 ORDER BY nodes, bandwidth_bps, rank",
            (int(sweep_id), float(latency_s), str(topology)),
        )

    def crossover_points(self, sweep_id: int, bandwidth_bps: float, latency_s: float,
                         topology: str) -> list[dict[str, Any]]:
        """Per (compressor, nodes) at one bandwidth (bits/s), latency (s) and topology: the largest
        density whose speed-up over none is > 1."""
        return self._all(
            "SELECT compressor, nodes, MAX(density) AS density FROM scenarios"
            " WHERE sweep_id=? AND bandwidth_bps=? AND latency_s=? AND topology=? AND compressor != 'none'"
            " AND density IS NOT NULL AND speedup > 1 GROUP BY compressor, nodes ORDER BY compressor, nodes",
            (int(sweep_id), float(bandwidth_bps), float(latency_s), str(topology)),
        )

    # -- emulations, measurements, calibrations, validation -----------------------------------

    def start_emulation(self, kind: str, config: Mapping[str, Any], cores: int) -> int:
        """Record an emulation (``kind``: collective, train, ...) as running; returns its id."""
        with self.transaction() as cur:
            cur.execute("INSERT INTO emulations(created, kind, config_json, cores, status)"
                        " VALUES(?, ?, ?, ?, 'running')", (time.time(), kind, json.dumps(config, sort_keys=True), cores))
            return int(cur.lastrowid)

    def add_collective_measurements(self, emulation_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert measured collectives (op, workers, nbytes, bandwidth_bps, seconds) of an emulation."""
        return self._insert_rows("collective_measurements", ({"emulation_id": emulation_id, **r} for r in rows))

    def collective_measurements(self, emulation_ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """Measured collectives of finished 'collective' emulations (all, or of ``emulation_ids``)."""
        sql = ("SELECT m.* FROM collective_measurements m JOIN emulations e ON e.id = m.emulation_id"
               " WHERE e.kind = 'collective' AND e.status = 'done'")
        params: list[int] = []
        if emulation_ids:
            sql += f" AND m.emulation_id IN ({_marks(emulation_ids)})"
            params = [int(i) for i in emulation_ids]
        return self._all(sql, params)

    def add_calibration(self, alpha_s: float, beta_s_per_byte: float, efficiency: float,
                        source: Mapping[str, Any], *, op: str | None = None,
                        fit_error_pct: float | None = None) -> int:
        """Store a fitted calibration (α in s, β in s/byte, efficiency in (0, 1]; ``op`` NULL: one
        fit for every operation; ``fit_error_pct``: the fit's median |relative residual|, %);
        returns its id."""
        with self.transaction() as cur:
            return _insert_calibration(cur, time.time(), alpha_s, beta_s_per_byte, efficiency, source, op,
                                       fit_error_pct)

    def insert_calibration(self, pooled: Mapping[str, Any], per_op: Mapping[str, Mapping[str, Any]]) -> int:
        """Store one calibration: the ``pooled`` fit (``op`` NULL) and one row per operation, in one
        transaction with one ``created`` time. Each fit maps ``alpha_s`` (s), ``beta_s_per_byte``
        (s/byte), ``efficiency``, ``fit_error_pct`` (%) and ``source`` (a JSON-serialisable dict).
        Returns the pooled row's id."""
        created = time.time()
        with self.transaction() as cur:
            calibration_id = _insert_calibration(
                cur, created, pooled["alpha_s"], pooled["beta_s_per_byte"], pooled["efficiency"],
                pooled["source"], None, pooled.get("fit_error_pct"))
            for op, f in sorted(per_op.items()):
                _insert_calibration(cur, created, f["alpha_s"], f["beta_s_per_byte"], f["efficiency"],
                                    {**f["source"], "calibration_id": calibration_id}, op, f.get("fit_error_pct"))
        return calibration_id

    def latest_calibration(self) -> dict[str, Any] | None:
        """The most recent pooled calibration row (``op`` NULL), or ``None``."""
        return self._first("SELECT * FROM calibrations WHERE op IS NULL ORDER BY created DESC, id DESC LIMIT 1")

    def calibration_rows(self, calibration_id: int | None = None) -> list[dict[str, Any]]:
        """The rows of one calibration: its pooled row (``op`` NULL; id ``calibration_id``, the
        newest when ``None``) and the per-operation rows written with it (same ``created``),
        pooled row first; empty when there is none."""
        if calibration_id is None:
            pooled = self.latest_calibration()
        else:
            pooled = self._first("SELECT * FROM calibrations WHERE id=? AND op IS NULL", (int(calibration_id),))
        if pooled is None:
            return []
        return [pooled, *self._all("SELECT * FROM calibrations WHERE created=? AND op IS NOT NULL ORDER BY op",
                                   (pooled["created"],))]

    def add_validation(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert validation rows (measured vs projected iteration time) in one transaction."""
        return self._insert_rows("validation", rows)

    def validation(self) -> list[dict[str, Any]]:
        """Validation rows (measured vs projected iteration time, seconds; error in %; the projection's
        ``fidelity`` and ``network_share``, transfer time ÷ iteration, 0..1; both NULL in older rows)."""
        return self._all(
            "SELECT v.emulation_id, v.workload, v.compressor, v.density, v.workers, v.bandwidth_bps,"
            " v.measured_s, v.projected_s, v.error_pct, v.calibrated, v.fidelity, v.network_share"
            " FROM validation v ORDER BY v.workload, v.compressor, v.workers, v.bandwidth_bps"
        )

    # -- convergence runs (sidco converge) ------------------------------------------------------

    def convergence(self, convergence_id: int | str) -> dict[str, Any] | None:
        """The convergence run ``convergence_id`` (an id, or ``"latest"``: the newest), or ``None``."""
        if convergence_id == "latest":
            rows = self._all("SELECT * FROM convergences ORDER BY created DESC, id DESC LIMIT 1")
        else:
            rows = self._all("SELECT * FROM convergences WHERE id=?", (int(convergence_id),))
        return rows[0] if rows else None

    def convergences(self) -> list[dict[str, Any]]:
        """All convergence runs, newest first, each with ``pairs``: its stored (compressor, density) count."""
        return self._all(
            "SELECT c.*, (SELECT COUNT(*) FROM (SELECT DISTINCT compressor, density FROM convergence_rows r"
            " WHERE r.convergence_id = c.id)) AS pairs FROM convergences c ORDER BY c.created DESC, c.id DESC"
        )

    def convergence_rows(self, convergence_id: int) -> list[dict[str, Any]]:
        """Rows of a convergence run in (compressor, density, iteration) order."""
        return self._all(
            "SELECT * FROM convergence_rows WHERE convergence_id=? ORDER BY compressor, density, iteration",
            (int(convergence_id),),
        )

    def convergence_done(self, convergence_id: int, iterations: int) -> set[tuple[str, float]]:
        """(compressor, density) pairs of a convergence run that have all ``iterations`` rows."""
        rows = self._all(
            "SELECT compressor, density, COUNT(*) AS n FROM convergence_rows WHERE convergence_id=? "
            "GROUP BY compressor, density",
            (int(convergence_id),),
        )
        return {(r["compressor"], float(r["density"])) for r in rows if r["n"] == iterations}

    def best_accuracy(self, convergence_id: int) -> float | None:
        """The best held-out accuracy (fraction) any pair of a convergence run reached, or ``None``."""
        row = self._one("SELECT MAX(accuracy) FROM convergence_rows WHERE convergence_id=?",
                        (int(convergence_id),))
        return None if row is None or row[0] is None else float(row[0])

    def write_convergence(self, convergence_id: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Store pairs' rows in one transaction, replacing any partial leftovers of those pairs.

        Each row: ``compressor``, ``density``, ``iteration``, ``loss`` (nats) and optional
        ``eval_loss`` (nats), ``accuracy`` (fraction).
        """
        pairs = {(r["compressor"], float(r["density"])) for r in rows}
        with self.transaction() as cur:
            for compressor, density in pairs:
                cur.execute("DELETE FROM convergence_rows WHERE convergence_id=? AND compressor=? AND density=?",
                            (int(convergence_id), compressor, density))
            cur.executemany(
                "INSERT INTO convergence_rows(convergence_id, compressor, density, iteration, loss, eval_loss, "
                "accuracy) VALUES(?, ?, ?, ?, ?, ?, ?)",
                [(int(convergence_id), r["compressor"], float(r["density"]), int(r["iteration"]), float(r["loss"]),
                  r.get("eval_loss"), r.get("accuracy")) for r in rows],
            )

    def set_convergence_trace(self, convergence_id: int, trace_id: int) -> None:
        """Record which registered trace holds the gradients a convergence run saw."""
        with self.transaction() as cur:
            cur.execute("UPDATE convergences SET trace_id=? WHERE id=?", (int(trace_id), int(convergence_id)))

    # -- the one generic insert the named writes share ----------------------------------------

    def _insert_rows(self, table: str, rows: Iterable[Mapping[str, Any]], *, or_ignore: bool = False) -> int:
        rows = list(rows)
        if not rows:
            return 0
        columns = list(rows[0])
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        with self.transaction() as cur:
            cur.executemany(f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)})",
                            [tuple(r[c] for c in columns) for r in rows])
        return len(rows)
