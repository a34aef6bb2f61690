"""The results store: one SQLite file that every part of the testbed writes to.

Schema (version 1; all times in seconds, sizes in bytes, bandwidths in bits/s):

``traces``       one row per registered trace directory (``path`` is unique).
``replays``      one row per replay run of a trace; ``config_key`` identifies the
                 configuration so a rerun resumes the same replay.
``replay_rows``  one row per compressor call: (replay, compressor, density,
                 error_feedback, iteration, worker, bucket) is the primary key.
``sweeps``       one row per simulator sweep; ``config_key`` makes reruns resume.
``scenarios``    one row per simulated scenario of a sweep; (sweep_id,
                 scenario_key) is the primary key, so each scenario lands once.
``calibrations`` fitted α (s), β (s/byte) and efficiency from emulated collectives.
``emulations``   one row per real emulated run (configuration, core count).
``collective_measurements`` measured collective times of an emulation.
``validation``   measured vs projected iteration time per emulated scenario.

The database runs in WAL mode so the dashboard can read while a sweep writes.
Every write goes through :meth:`Store.transaction`, so a crash leaves either
all of a batch or none of it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
DEFAULT_PATH = Path("runs/results.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS traces (
    id            INTEGER PRIMARY KEY,
    path          TEXT NOT NULL UNIQUE,
    workload      TEXT,
    workers       INTEGER,
    iterations    INTEGER,
    numel         INTEGER,
    created       REAL NOT NULL,
    manifest_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS replays (
    id          INTEGER PRIMARY KEY,
    trace_id    INTEGER NOT NULL REFERENCES traces(id),
    config_key  TEXT NOT NULL UNIQUE,
    config_json TEXT NOT NULL,
    device      TEXT,
    status      TEXT NOT NULL DEFAULT 'running',
    created     REAL NOT NULL,
    finished    REAL
);
CREATE TABLE IF NOT EXISTS replay_rows (
    replay_id            INTEGER NOT NULL REFERENCES replays(id),
    compressor           TEXT NOT NULL,
    density              REAL NOT NULL,
    error_feedback       INTEGER NOT NULL,
    iteration            INTEGER NOT NULL,
    worker               INTEGER NOT NULL,
    bucket               INTEGER NOT NULL,
    numel                INTEGER NOT NULL,
    selected             INTEGER NOT NULL,
    achieved_density     REAL NOT NULL,
    achieved_over_target REAL NOT NULL,
    threshold            REAL,
    stages               INTEGER,
    compress_s           REAL NOT NULL,
    decompress_s         REAL NOT NULL,
    wire_bytes           INTEGER NOT NULL,
    rel_error            REAL NOT NULL,
    backend              TEXT,
    call_index           INTEGER,
    PRIMARY KEY (replay_id, compressor, density, error_feedback, iteration, worker, bucket)
);
CREATE TABLE IF NOT EXISTS sweeps (
    id          INTEGER PRIMARY KEY,
    trace_id    INTEGER REFERENCES traces(id),
    config_key  TEXT NOT NULL UNIQUE,
    config_json TEXT NOT NULL,
    total       INTEGER NOT NULL,
    status      TEXT NOT NULL DEFAULT 'running',
    created     REAL NOT NULL,
    finished    REAL
);
CREATE TABLE IF NOT EXISTS scenarios (
    sweep_id       INTEGER NOT NULL REFERENCES sweeps(id),
    scenario_key   TEXT NOT NULL,
    compressor     TEXT NOT NULL,
    density        REAL,
    nodes          INTEGER NOT NULL,
    bandwidth_bps  REAL NOT NULL,
    latency_s      REAL NOT NULL,
    topology       TEXT NOT NULL,
    fidelity       TEXT NOT NULL,
    iteration_s    REAL NOT NULL,
    samples_per_s  REAL,
    forward_s      REAL,
    backward_s     REAL,
    compress_s     REAL,
    exposed_comm_s REAL,
    idle_s         REAL,
    speedup        REAL,
    result_json    TEXT NOT NULL,
    PRIMARY KEY (sweep_id, scenario_key)
);
CREATE TABLE IF NOT EXISTS calibrations (
    id              INTEGER PRIMARY KEY,
    created         REAL NOT NULL,
    alpha_s         REAL NOT NULL,
    beta_s_per_byte REAL NOT NULL,
    efficiency      REAL NOT NULL,
    source_json     TEXT NOT NULL,
    op              TEXT,
    fit_error_pct   REAL
);
CREATE TABLE IF NOT EXISTS emulations (
    id          INTEGER PRIMARY KEY,
    created     REAL NOT NULL,
    kind        TEXT NOT NULL,
    config_json TEXT NOT NULL,
    cores       INTEGER NOT NULL,
    status      TEXT NOT NULL DEFAULT 'running'
);
CREATE TABLE IF NOT EXISTS collective_measurements (
    emulation_id  INTEGER NOT NULL REFERENCES emulations(id),
    op            TEXT NOT NULL,
    workers       INTEGER NOT NULL,
    nbytes        INTEGER NOT NULL,
    bandwidth_bps REAL NOT NULL,
    seconds       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS validation (
    emulation_id   INTEGER NOT NULL REFERENCES emulations(id),
    workload       TEXT NOT NULL,
    compressor     TEXT NOT NULL,
    density        REAL,
    workers        INTEGER NOT NULL,
    bandwidth_bps  REAL,
    measured_s     REAL NOT NULL,
    projected_s    REAL NOT NULL,
    error_pct      REAL NOT NULL,
    calibrated     INTEGER NOT NULL,
    detail_json    TEXT NOT NULL,
    network_share  REAL,
    fidelity       TEXT
);
CREATE INDEX IF NOT EXISTS replay_rows_by_compressor ON replay_rows(replay_id, compressor, density);
CREATE INDEX IF NOT EXISTS scenarios_by_compressor ON scenarios(sweep_id, compressor, density);
"""


def config_key(config: Mapping[str, Any]) -> str:
    """Return a canonical string identifying ``config`` (sorted-key JSON)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


class Store:
    """A results store backed by one SQLite file at ``path`` (created if missing)."""

    def __init__(self, path: str | Path = DEFAULT_PATH, *, timeout_s: float = 30.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        with self.transaction() as cur:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    cur.execute(statement)
            row = cur.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                cur.execute(
                    "INSERT INTO meta(key, value) VALUES('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) != SCHEMA_VERSION:
                raise ValueError(
                    f"{self.path}: results store has schema version {row[0]}, "
                    f"this sidco understands {SCHEMA_VERSION}"
                )

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """Run the body in one ``BEGIN IMMEDIATE`` transaction; roll back on any error."""
        cur = self.conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Run a read-only query and return all rows."""
        return self.conn.execute(sql, params).fetchall()

    def insert_many(self, table: str, rows: Iterable[Mapping[str, Any]], *, or_ignore: bool = False) -> int:
        """Insert ``rows`` (dicts with the same keys) into ``table`` in one transaction.

        With ``or_ignore`` rows whose primary key already exists are skipped.
        Returns the number of rows offered.
        """
        rows = list(rows)
        if not rows:
            return 0
        columns = list(rows[0])
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        sql = (
            f"{verb} INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})"
        )
        with self.transaction() as cur:
            cur.executemany(sql, [tuple(r[c] for c in columns) for r in rows])
        return len(rows)

    def register_trace(self, path: str | Path, manifest: Mapping[str, Any]) -> int:
        """Register (or refresh) the trace at ``path``; return its id."""
        resolved = str(Path(path).resolve())
        layers = manifest.get("layers", [])
        numel = 0
        for layer in layers:
            count = 1
            for dim in layer.get("shape", []):
                count *= int(dim)
            numel += count
        iterations = manifest.get("iterations", [])
        values = (
            manifest.get("workload"),
            manifest.get("workers"),
            len(iterations) if isinstance(iterations, list) else iterations,
            numel,
            time.time(),
            json.dumps(manifest, sort_keys=True),
        )
        with self.transaction() as cur:
            row = cur.execute("SELECT id FROM traces WHERE path=?", (resolved,)).fetchone()
            if row is None:
                cur.execute(
                    "INSERT INTO traces(path, workload, workers, iterations, numel, created, manifest_json)"
                    " VALUES(?, ?, ?, ?, ?, ?, ?)",
                    (resolved, *values),
                )
                return int(cur.lastrowid)
            cur.execute(
                "UPDATE traces SET workload=?, workers=?, iterations=?, numel=?, created=?, manifest_json=?"
                " WHERE id=?",
                (*values, row[0]),
            )
            return int(row[0])

    def traces(self) -> list[sqlite3.Row]:
        """All registered traces, newest first."""
        return self.query("SELECT * FROM traces ORDER BY created DESC")

    def get_or_create(self, table: str, config: Mapping[str, Any], **columns: Any) -> tuple[int, bool]:
        """Find the row of ``table`` (replays, sweeps) with this ``config``, or create it.

        Returns ``(id, created)``; a rerun of the same configuration finds the
        same id, which is what makes replays and sweeps resumable.
        """
        key = config_key(config)
        with self.transaction() as cur:
            row = cur.execute(f"SELECT id FROM {table} WHERE config_key=?", (key,)).fetchone()
            if row is not None:
                return int(row[0]), False
            names = ["config_key", "config_json", "created", *columns]
            values = [key, json.dumps(config, sort_keys=True, default=str), time.time(), *columns.values()]
            cur.execute(
                f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                values,
            )
            return int(cur.lastrowid), True

    def set_status(self, table: str, row_id: int, status: str) -> None:
        """Set ``status`` (and ``finished`` when done) of a replay, sweep or emulation."""
        with self.transaction() as cur:
            if status == "done" and table != "emulations":
                cur.execute(
                    f"UPDATE {table} SET status=?, finished=? WHERE id=?", (status, time.time(), row_id)
                )
            else:
                cur.execute(f"UPDATE {table} SET status=? WHERE id=?", (status, row_id))

    def latest_calibration(self) -> sqlite3.Row | None:
        """The most recent pooled calibration row (``op`` NULL), or ``None``."""
        rows = self.query("SELECT * FROM calibrations WHERE op IS NULL ORDER BY created DESC, id DESC LIMIT 1")
        return rows[0] if rows else None

    def calibration_rows(self, calibration_id: int | None = None) -> list[sqlite3.Row]:
        """The rows of one calibration: its pooled row (``op`` NULL; id ``calibration_id``, the
        newest when ``None``) and the per-operation rows written with it (same ``created``),
        pooled row first; empty when there is none."""
        if calibration_id is None:
            pooled = self.latest_calibration()
        else:
            found = self.query("SELECT * FROM calibrations WHERE id=? AND op IS NULL", (int(calibration_id),))
            pooled = found[0] if found else None
        if pooled is None:
            return []
        return [pooled, *self.query("SELECT * FROM calibrations WHERE created=? AND op IS NOT NULL ORDER BY op",
                                    (pooled["created"],))]

    def insert_calibration(self, pooled: Mapping[str, Any], per_op: Mapping[str, Mapping[str, Any]]) -> int:
        """Store one calibration: the ``pooled`` fit and one row per operation, in one transaction
        with one ``created`` time. Each fit maps ``alpha_s``, ``beta_s_per_byte``, ``efficiency``,
        ``fit_error_pct`` and ``source`` (a JSON-serialisable dict). Returns the pooled row's id."""
        created = time.time()
        sql = ("INSERT INTO calibrations(created, alpha_s, beta_s_per_byte, efficiency, source_json, op, fit_error_pct)"
               " VALUES(?, ?, ?, ?, ?, ?, ?)")
        with self.transaction() as cur:
            cur.execute(sql, (created, pooled["alpha_s"], pooled["beta_s_per_byte"], pooled["efficiency"],
                              json.dumps(pooled["source"], sort_keys=True), None, pooled.get("fit_error_pct")))
            calibration_id = int(cur.lastrowid)
            for op, f in sorted(per_op.items()):
                cur.execute(sql, (created, f["alpha_s"], f["beta_s_per_byte"], f["efficiency"],
                                  json.dumps({**f["source"], "calibration_id": calibration_id}, sort_keys=True),
                                  op, f.get("fit_error_pct")))
        return calibration_id
