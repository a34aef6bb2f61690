"""The results store: one SQLite file that every part of the testbed writes to.

Schema (version 10; all times in seconds, sizes in bytes, bandwidths in bits/s):

``traces``       one row per registered trace directory (``path`` is unique); v7 adds
                 ``content_sha256``, the digest of its files when last read.
``replays``      one row per replay run of a trace; ``config_key`` identifies the
                 configuration so a rerun resumes the same replay.
``replay_rows``  one row per compressor call: (replay, compressor, density,
                 error_feedback, iteration, worker, bucket) is the primary key.
``sweeps``       one row per simulator sweep; ``config_key`` makes reruns resume.
``scenarios``    one row per simulated scenario of a sweep; (sweep_id,
                 scenario_key) is the primary key, so each scenario lands once.
``scenario_claims`` one row per scenario a running sweep is computing and its owner (one
                 run), so a second run of the same sweep waits for it instead of
                 computing it again.
``claim_owners`` one row per run holding claims: its process identity (host, boot id,
                 PID namespace, PID, start time) and heartbeat; its claims lapse when
                 that process has provably ended or its heartbeat is older than the
                 lease (:mod:`results.claims`).
``calibrations`` fitted α (s), β (s/byte) and efficiency from emulated collectives.
``emulations``   one row per real emulated run (configuration, core count).
``collective_measurements`` measured collective times of an emulation.
``validation``   measured vs projected iteration time per emulated scenario.
``device_profiles`` / ``device_profile_rows`` measured (or modelled) compression
                 costs of one device, per (compressor, density, numel).
``convergences`` / ``convergence_rows`` loss (and accuracy) per iteration of
                 training runs with a compressor, for time-to-accuracy.

Version 2 added ``replay_rows.backend`` / ``call_index``, ``calibrations.op`` /
``fit_error_pct``, ``validation.network_share`` / ``fidelity``,
``scenarios.device`` / ``cost_source`` and the four tables above; version 3 the scenarios'
error band; version 4 ``replay_rows.energy`` / ``topk_energy`` (what a call sends of its input's
squared norm, and what exact Top-k at the target density would send); version 5
``replay_rows.fallback`` (1 when the count guard sent the exact top-k); version 6
``scenario_claims``; version 7 ``convergences.sync_every`` / ``outer_compressor`` /
``outer_density`` (a DiLoCo run's H and outer exchange; 1 and null for per-step runs); version 8
``claim_owners`` (the owner's identity beyond a PID and its heartbeat; the PID moved there, v7
claims keep their owner with an unknown identity and lapse by their lease) and
``traces.content_sha256``; version 9 ``step_profiles``; version 10 no table: a sweep's
``--parallel`` family in its ``config_json`` (``options.sharding``), which v9 held as the text of a
Python object (``"Sharding(parallel='hsdp', ...)"``), becomes its JSON fields (``parallel``,
``shard_size``, ``reduce_dtype``, ``param_dtype``, ``micro_batch``, ``checkpointing``), and its
``config_key`` with it, so the same sweep run again resumes. A store is
brought up to date by :data:`MIGRATIONS`: step *n* takes a store from version
*n - 1* to *n*; the missing steps run in order inside one transaction, so an
upgrade either completes or leaves the file as it was.

The database runs in WAL mode so the dashboard can read while a sweep writes.
Every write goes through :meth:`Store.transaction`, so a crash leaves either
all of a batch or none of it.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from results.errors import StoreError, guard
from results.queries import Queries, config_key

__all__ = ["DEFAULT_PATH", "MAX_ROW_ID", "MIGRATIONS", "SCHEMA_VERSION", "Store", "StoreError", "config_key", "row_id"]

DEFAULT_PATH = Path("runs/results.sqlite")

MAX_ROW_ID = 2**63 - 1
"""The largest id a row can have: SQLite's largest INTEGER (a larger number cannot even be looked up)."""


def row_id(value: object, what: str) -> int:
    """The one rule of a stored row's id (a trace's, a sweep's, a device profile's): a whole number
    from 1 to :data:`MAX_ROW_ID`, given as an int or as its ASCII digits. Returns it as an int;
    ValueError ``unknown <what> <value>`` (one line) otherwise, as no row can have that id."""
    number = 0
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= len(str(MAX_ROW_ID)):
        number = int(value)
    if not 1 <= number <= MAX_ROW_ID:
        raise ValueError(f"unknown {what} {value!r:.40}")
    return number

_V1 = """
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
    source_json     TEXT NOT NULL
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
    detail_json    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS replay_rows_by_compressor ON replay_rows(replay_id, compressor, density);
CREATE INDEX IF NOT EXISTS scenarios_by_compressor ON scenarios(sweep_id, compressor, density);
"""

_V2 = """
ALTER TABLE replay_rows ADD COLUMN backend TEXT;
ALTER TABLE replay_rows ADD COLUMN call_index INTEGER;
CREATE TABLE device_profiles (
    id            INTEGER PRIMARY KEY,
    device        TEXT NOT NULL,
    identity_json TEXT NOT NULL,
    source        TEXT NOT NULL,
    created       REAL NOT NULL
);
CREATE TABLE device_profile_rows (
    profile_id   INTEGER NOT NULL REFERENCES device_profiles(id),
    compressor   TEXT NOT NULL,
    density      REAL NOT NULL,
    numel        INTEGER NOT NULL,
    compress_s   REAL NOT NULL,
    decompress_s REAL NOT NULL,
    wire_bytes   INTEGER,
    backend      TEXT,
    PRIMARY KEY (profile_id, compressor, density, numel)
);
CREATE TABLE convergences (
    id          INTEGER PRIMARY KEY,
    config_key  TEXT NOT NULL UNIQUE,
    config_json TEXT NOT NULL,
    trace_id    INTEGER REFERENCES traces(id),
    status      TEXT NOT NULL DEFAULT 'running',
    created     REAL NOT NULL,
    finished    REAL
);
CREATE TABLE convergence_rows (
    convergence_id INTEGER NOT NULL REFERENCES convergences(id),
    compressor     TEXT NOT NULL,
    density        REAL NOT NULL,
    iteration      INTEGER NOT NULL,
    loss           REAL NOT NULL,
    eval_loss      REAL,
    accuracy       REAL,
    PRIMARY KEY (convergence_id, compressor, density, iteration)
);
ALTER TABLE calibrations ADD COLUMN op TEXT;
ALTER TABLE calibrations ADD COLUMN fit_error_pct REAL;
ALTER TABLE validation ADD COLUMN network_share REAL;
ALTER TABLE validation ADD COLUMN fidelity TEXT;
ALTER TABLE scenarios ADD COLUMN device TEXT;
ALTER TABLE scenarios ADD COLUMN cost_source TEXT;
CREATE INDEX device_profiles_by_device ON device_profiles(device, created);
"""

_V3 = """
ALTER TABLE scenarios ADD COLUMN iteration_s_low REAL;
ALTER TABLE scenarios ADD COLUMN iteration_s_high REAL;
ALTER TABLE scenarios ADD COLUMN speedup_low REAL;
ALTER TABLE scenarios ADD COLUMN speedup_high REAL;
"""

_V4 = """
ALTER TABLE replay_rows ADD COLUMN energy REAL;
ALTER TABLE replay_rows ADD COLUMN topk_energy REAL;
"""

_V5 = """
ALTER TABLE replay_rows ADD COLUMN fallback INTEGER;
"""

_V6 = """
CREATE TABLE scenario_claims (
    sweep_id     INTEGER NOT NULL REFERENCES sweeps(id),
    scenario_key TEXT NOT NULL,
    owner        TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    claimed      REAL NOT NULL,
    PRIMARY KEY (sweep_id, scenario_key)
);
CREATE INDEX scenario_claims_by_owner ON scenario_claims(sweep_id, owner);
"""

_V7 = """
ALTER TABLE convergences ADD COLUMN sync_every INTEGER NOT NULL DEFAULT 1;
ALTER TABLE convergences ADD COLUMN outer_compressor TEXT;
ALTER TABLE convergences ADD COLUMN outer_density REAL;
"""

_V8 = """
CREATE TABLE claim_owners (
    owner       TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    boot_id     TEXT NOT NULL,
    pid_ns      TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    start_ticks INTEGER,
    heartbeat   REAL NOT NULL
);
INSERT INTO claim_owners(owner, host, boot_id, pid_ns, pid, start_ticks, heartbeat)
    SELECT owner, '', '', '', MAX(pid), NULL, MAX(claimed) FROM scenario_claims GROUP BY owner;
CREATE TABLE scenario_claims_v7 (
    sweep_id     INTEGER NOT NULL REFERENCES sweeps(id),
    scenario_key TEXT NOT NULL,
    owner        TEXT NOT NULL REFERENCES claim_owners(owner),
    claimed      REAL NOT NULL,
    PRIMARY KEY (sweep_id, scenario_key)
);
INSERT INTO scenario_claims_v7(sweep_id, scenario_key, owner, claimed)
    SELECT sweep_id, scenario_key, owner, claimed FROM scenario_claims;
DROP TABLE scenario_claims;
ALTER TABLE scenario_claims_v7 RENAME TO scenario_claims;
CREATE INDEX scenario_claims_by_owner ON scenario_claims(sweep_id, owner);
ALTER TABLE traces ADD COLUMN content_sha256 TEXT;
"""

_V9 = """
CREATE TABLE step_profiles (
    id           INTEGER PRIMARY KEY,
    model        TEXT NOT NULL,
    device       TEXT NOT NULL,
    precision    TEXT NOT NULL,
    batch_size   INTEGER NOT NULL,
    tokens       INTEGER NOT NULL,
    step_s       REAL NOT NULL,
    samples_per_s REAL NOT NULL,
    profile_json TEXT NOT NULL,
    created      REAL NOT NULL
);
CREATE INDEX step_profiles_by_model ON step_profiles(model, device, created);
"""

_V10 = """
CREATE TABLE sweep_sharding_v9 AS
    SELECT id, replace(replace(replace(replace(replace(replace(replace(replace(
        json_extract(config_json, '$.options.sharding'), 'Sharding(', '{"'), '=', '":'), ', ', ', "'), '''', '"'),
        'None', 'null'), 'True', 'true'), 'False', 'false'), ')', '}') AS fields
    FROM sweeps WHERE json_type(config_json, '$.options.sharding') = 'text';
UPDATE sweeps SET config_key = json_set(config_key, '$.options.sharding', json((SELECT json_object(
        'checkpointing', json(CASE json_extract(v.fields, '$.checkpointing') WHEN 1 THEN 'true' ELSE 'false' END),
        'micro_batch', json_extract(v.fields, '$.micro_batch'), 'parallel', json_extract(v.fields, '$.parallel'),
        'param_dtype', json_extract(v.fields, '$.param_dtype'), 'reduce_dtype', json_extract(v.fields, '$.reduce_dtype'),
        'shard_size', json_extract(v.fields, '$.shard_size'))
    FROM sweep_sharding_v9 v WHERE v.id = sweeps.id)))
    WHERE id IN (SELECT id FROM sweep_sharding_v9);
UPDATE sweeps SET config_json = config_key WHERE id IN (SELECT id FROM sweep_sharding_v9);
DROP TABLE sweep_sharding_v9
"""
"""A sweep's ``--parallel`` family (``options.sharding`` of its configuration), which version 9
stored as the text of a Python object, as its JSON fields, in ``config_json`` and ``config_key``
(keys in sorted order, as :func:`results.queries.config_key` writes them)."""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10)
"""``MIGRATIONS[n - 1]`` is the DDL taking a store from schema version ``n - 1`` to ``n``
(version 0 is an empty file). Append a step to change the schema; never edit one."""

SCHEMA_VERSION = len(MIGRATIONS)


SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_header(path: Path) -> None:
    """Refuse an existing non-empty file that is not SQLite before SQLite may write to it (it
    would take a file shorter than its header for an empty database and overwrite it)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or device: never opened (it could block)
            raise sqlite3.DatabaseError("file is not a database")
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    if head and head != SQLITE_MAGIC:
        raise sqlite3.DatabaseError("file is not a database")


def _schema_version(cur: sqlite3.Cursor, path: Path) -> int:
    """The schema version recorded in the file at ``path`` (0 for a file without a ``meta``
    table); ValueError naming the file when it is not a whole number >= 0."""
    has_meta = cur.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if has_meta is None:
        return 0
    row = cur.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        return 0
    text = str(row[0]).strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{path}: results store has schema version {str(row[0])[:40]!r}, not a whole number; "
                         "the file is damaged or not a store of this testbed")
    return int(text)


def _enter_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch ``conn``'s file to write-ahead logging, waiting up to ``timeout_s`` seconds for others.

    SQLite does not call its busy handler for a journal-mode change: when several processes open
    one fresh file at once, all but one are told "database is locked" at once. The change is
    retried every few milliseconds until it takes or ``timeout_s`` has passed (then the last
    error stands)."""
    deadline = time.monotonic() + timeout_s
    pause_s = 0.002
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                raise
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.05)


def _check_link(path: Path) -> None:
    """Refuse a symbolic link whose target does not exist: SQLite would follow it and create the
    target, a file the user never named (or fail with a message about the link's directory)."""
    if path.is_symlink() and not path.exists():
        raise StoreError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist: "
                         "pass the store's own path, or a link to an existing store")


def _unwritable(path: Path) -> str | None:
    """Why the existing store at ``path`` cannot be written from here (its filesystem is mounted
    read-only, or the file or its directory, where SQLite keeps its write-ahead log, is not
    writable), or None when it can (or does not exist yet)."""
    try:
        if not path.is_file():
            return None
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "its filesystem is mounted read-only"
    except OSError:
        return None
    if not os.access(path, os.W_OK):
        return "the file is not writable"
    if not os.access(path.parent, os.W_OK):
        return f"its directory {path.parent} is not writable"
    return None


def _connect_read_only(path: Path, timeout_s: float) -> sqlite3.Connection:
    """A read-only connection to ``path``. A store in WAL mode needs its shared-memory file: where
    that is missing and cannot be created (a read-only mount), the file is opened as immutable
    (nothing can write it through this mount)."""
    uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=timeout_s, isolation_level=None)


class Store(Queries):
    """A results store backed by one SQLite file at ``path`` (created if missing); its reads and
    writes are the named queries of :class:`results.queries.Queries`. An existing store that cannot
    be written from here (a read-only mount, a read-only file) opens read-only: every read works,
    a write is a one-line :class:`StoreError` naming the file (``read_only`` says why, else None)."""

    def __init__(self, path: str | Path = DEFAULT_PATH, *, timeout_s: float = 30.0):
        self.path = Path(path)
        self.conn: sqlite3.Connection | None = None
        self.read_only: str | None = None
        try:
            with guard(self.path):
                _check_link(self.path)
                if self.path.is_dir():
                    raise IsADirectoryError(errno.EISDIR, "is a directory", str(self.path))
                _check_header(self.path)
                self.read_only = _unwritable(self.path)
                if self.read_only:
                    self.conn = _connect_read_only(self.path, timeout_s)
                else:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self.conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
                self.conn.row_factory = sqlite3.Row
                if not self.read_only:
                    _enter_wal(self.conn, timeout_s)
                    self.conn.execute("PRAGMA synchronous=NORMAL")
                self.conn.execute("PRAGMA foreign_keys=ON")
                self._migrate()
        except BaseException:
            if self.conn is not None:
                self.conn.close()
            raise

    def _migrate(self) -> None:
        """Bring the file up to :data:`SCHEMA_VERSION`, all missing steps in one transaction (a
        read-only store must be up to date already)."""
        if self.read_only:
            with guard(self.path):
                version = _schema_version(self.conn.cursor(), self.path)
            if version != SCHEMA_VERSION:
                raise StoreError(f"{self.path} has schema version {version} and is read-only here "
                                 f"({self.read_only}): this testbed reads version {SCHEMA_VERSION}; copy it "
                                 "somewhere writable (it is upgraded when opened) and pass that --store")
            return
        with self.transaction() as cur:
            version = _schema_version(cur, self.path)
            if version > SCHEMA_VERSION:
                raise ValueError(
                    f"{self.path}: results store has schema version {version}, "
                    f"this testbed understands up to {SCHEMA_VERSION}; use a newer testbed or another --store"
                )
            if version == SCHEMA_VERSION:
                return
            for step in MIGRATIONS[version:]:
                for statement in step.split(";"):
                    if statement.strip():
                        cur.execute(statement)
            cur.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)", (str(SCHEMA_VERSION),)
            )

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """Run the body in one ``BEGIN IMMEDIATE`` transaction; roll back on any error.

        SQLite and OS errors (full disk, read-only or damaged file) become one-line
        :class:`~results.errors.StoreError`; what earlier transactions committed stays. A store
        opened read-only refuses every write with one line."""
        if self.read_only:
            raise StoreError(f"cannot write to the results store {self.path}: it is read-only here "
                             f"({self.read_only}); pass a writable --store")
        with guard(self.path):
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    with suppress(sqlite3.Error):
                        cur.execute("ROLLBACK")
                raise
            finally:
                cur.close()

    def close(self) -> None:
        """Close the connection."""
        if self.conn is not None:
            self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Run an ad-hoc read-only query and return all rows (for inspection and tests; the
        testbed itself reads through the named queries of :class:`results.queries.Queries`)."""
        with guard(self.path):
            return self.conn.execute(sql, params).fetchall()
