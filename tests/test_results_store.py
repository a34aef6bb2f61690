"""The results store's schema versions: a v1 file opens with this code and is upgraded in place."""

from __future__ import annotations

import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from results.errors import StoreError
from results.store import MAX_ROW_ID, SCHEMA_VERSION, Store, row_id

# The schema as version 1 wrote it (frozen here: it is the format of files already on disk).
V1_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE traces (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, workload TEXT, workers INTEGER,
    iterations INTEGER, numel INTEGER, created REAL NOT NULL, manifest_json TEXT NOT NULL);
CREATE TABLE replays (id INTEGER PRIMARY KEY, trace_id INTEGER NOT NULL REFERENCES traces(id),
    config_key TEXT NOT NULL UNIQUE, config_json TEXT NOT NULL, device TEXT,
    status TEXT NOT NULL DEFAULT 'running', created REAL NOT NULL, finished REAL);
CREATE TABLE replay_rows (replay_id INTEGER NOT NULL REFERENCES replays(id), compressor TEXT NOT NULL,
    density REAL NOT NULL, error_feedback INTEGER NOT NULL, iteration INTEGER NOT NULL, worker INTEGER NOT NULL,
    bucket INTEGER NOT NULL, numel INTEGER NOT NULL, selected INTEGER NOT NULL, achieved_density REAL NOT NULL,
    achieved_over_target REAL NOT NULL, threshold REAL, stages INTEGER, compress_s REAL NOT NULL,
    decompress_s REAL NOT NULL, wire_bytes INTEGER NOT NULL, rel_error REAL NOT NULL,
    PRIMARY KEY (replay_id, compressor, density, error_feedback, iteration, worker, bucket));
CREATE TABLE sweeps (id INTEGER PRIMARY KEY, trace_id INTEGER REFERENCES traces(id),
    config_key TEXT NOT NULL UNIQUE, config_json TEXT NOT NULL, total INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'running', created REAL NOT NULL, finished REAL);
CREATE TABLE scenarios (sweep_id INTEGER NOT NULL REFERENCES sweeps(id), scenario_key TEXT NOT NULL,
    compressor TEXT NOT NULL, density REAL, nodes INTEGER NOT NULL, bandwidth_bps REAL NOT NULL,
    latency_s REAL NOT NULL, topology TEXT NOT NULL, fidelity TEXT NOT NULL, iteration_s REAL NOT NULL,
    samples_per_s REAL, forward_s REAL, backward_s REAL, compress_s REAL, exposed_comm_s REAL, idle_s REAL,
    speedup REAL, result_json TEXT NOT NULL, PRIMARY KEY (sweep_id, scenario_key));
CREATE TABLE calibrations (id INTEGER PRIMARY KEY, created REAL NOT NULL, alpha_s REAL NOT NULL,
    beta_s_per_byte REAL NOT NULL, efficiency REAL NOT NULL, source_json TEXT NOT NULL);
CREATE TABLE emulations (id INTEGER PRIMARY KEY, created REAL NOT NULL, kind TEXT NOT NULL,
    config_json TEXT NOT NULL, cores INTEGER NOT NULL, status TEXT NOT NULL DEFAULT 'running');
CREATE TABLE collective_measurements (emulation_id INTEGER NOT NULL REFERENCES emulations(id),
    op TEXT NOT NULL, workers INTEGER NOT NULL, nbytes INTEGER NOT NULL, bandwidth_bps REAL NOT NULL,
    seconds REAL NOT NULL);
CREATE TABLE validation (emulation_id INTEGER NOT NULL REFERENCES emulations(id), workload TEXT NOT NULL,
    compressor TEXT NOT NULL, density REAL, workers INTEGER NOT NULL, bandwidth_bps REAL,
    measured_s REAL NOT NULL, projected_s REAL NOT NULL, error_pct REAL NOT NULL, calibrated INTEGER NOT NULL,
    detail_json TEXT NOT NULL);
CREATE INDEX replay_rows_by_compressor ON replay_rows(replay_id, compressor, density);
CREATE INDEX scenarios_by_compressor ON scenarios(sweep_id, compressor, density);
INSERT INTO meta(key, value) VALUES('schema_version', '1');
"""

V2_COLUMNS = {
    "replay_rows": {"backend", "call_index"},
    "calibrations": {"op", "fit_error_pct"},
    "validation": {"network_share", "fidelity"},
    "scenarios": {"device", "cost_source"},
    "device_profiles": {"id", "device", "identity_json", "source", "created"},
    "device_profile_rows": {"profile_id", "compressor", "density", "numel", "compress_s", "decompress_s",
                            "wire_bytes", "backend"},
    "convergences": {"id", "config_key", "config_json", "trace_id", "status", "created", "finished"},
    "convergence_rows": {"convergence_id", "compressor", "density", "iteration", "loss", "eval_loss", "accuracy"},
}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _v1_store(path) -> None:
    with sqlite3.connect(path) as raw:
        raw.executescript(V1_DDL)
        raw.execute("INSERT INTO traces VALUES(1, '/t', 'resnet20', 2, 3, 12, 1.0, '{}')")
        raw.execute("INSERT INTO replays VALUES(1, 1, 'k', '{}', 'cpu', 'done', 2.0, 3.0)")
        raw.execute("INSERT INTO replay_rows VALUES(1, 'topk', 0.01, 0, 0, 0, 0, 100, 1, 0.01, 1.0, 0.5, 1,"
                    " 1e-5, 2e-6, 8, 0.9)")
        raw.execute("INSERT INTO calibrations VALUES(1, 4.0, 1e-5, 1e-9, 0.9, '{}')")
    raw.close()


def test_v1_store_upgrades_to_the_current_version_and_keeps_its_rows(tmp_path):
    path = tmp_path / "v1.sqlite"
    _v1_store(path)
    with Store(path) as store:
        assert store.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert {"iteration_s_low", "iteration_s_high", "speedup_low", "speedup_high"} <= _columns(store.conn,
                                                                                                   "scenarios")
        assert {"energy", "topk_energy", "fallback"} <= _columns(store.conn, "replay_rows")
        assert {"sync_every", "outer_compressor", "outer_density"} <= _columns(store.conn, "convergences")
        for table, columns in V2_COLUMNS.items():
            assert columns <= _columns(store.conn, table), table
        row = store.conn.execute("SELECT * FROM replay_rows").fetchone()
        assert (row["compressor"], row["density"], row["compress_s"], row["backend"]) == ("topk", 0.01, 1e-5, None)
        assert store.latest_calibration()["alpha_s"] == 1e-5
        assert [t["workload"] for t in store.traces()] == ["resnet20"]
    with Store(path) as again:  # opening an up-to-date store changes nothing
        assert again.conn.execute("SELECT COUNT(*) FROM replay_rows").fetchone()[0] == 1


def test_fresh_store_has_the_same_schema_as_an_upgraded_one(tmp_path):
    _v1_store(tmp_path / "old.sqlite")
    with Store(tmp_path / "old.sqlite") as old, Store(tmp_path / "new.sqlite") as new:
        tables = "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"
        names = [r[0] for r in new.conn.execute(tables)]
        assert names == [r[0] for r in old.conn.execute(tables)]
        for name in names:
            assert _columns(new.conn, name) == _columns(old.conn, name), name
    assert SCHEMA_VERSION == 10


def test_newer_store_is_refused_with_one_line_naming_the_file(tmp_path):
    path = tmp_path / "future.sqlite"
    Store(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    raw.close()
    with pytest.raises(ValueError) as exc:
        Store(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and f"schema version {SCHEMA_VERSION + 1}" in message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.one_of(st.text(max_size=12), st.integers(min_value=-10, max_value=-1).map(str),
                         st.sampled_from(["abc", "1.5", "-1", "", " ", "２", "1e3", "0x2", "nan"])))
def test_a_schema_version_that_is_not_a_whole_number_is_one_line_naming_the_file(tmp_path, version):
    path = tmp_path / "odd.sqlite"
    path.unlink(missing_ok=True)
    Store(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
    raw.close()
    stripped = version.strip()
    if stripped.isascii() and stripped.isdigit():
        return
    with pytest.raises(ValueError) as exc:
        Store(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and "schema version" in message
    with sqlite3.connect(path) as raw:  # nothing migrated over it
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == version
    raw.close()


def test_failed_upgrade_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "v1.sqlite"
    _v1_store(path)
    with sqlite3.connect(path) as raw:  # a table v2 wants to create already exists: the upgrade fails
        raw.execute("CREATE TABLE convergences (x INTEGER)")
    raw.close()
    with pytest.raises(StoreError, match="convergences already exists"):
        Store(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "1"
        assert "backend" not in _columns(raw, "replay_rows")
    raw.close()


OPEN_AT_ONCE = """
import sys, time
from results.store import Store
path, value, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < start:
    pass
store = Store(path)
print(store.pin_meta("first", value))
store.close()
"""


def test_processes_opening_one_fresh_store_at_once_all_open_it(tmp_path):
    """Four processes open one file that does not exist yet at the same instant (a sweep and its
    twin, a dashboard and a capture): each opens it and all read the one value the first writer
    pinned. SQLite answers "database is locked" at once to all but one switch to write-ahead
    logging; before the store waited for it, about half of such rounds failed one process."""
    import subprocess
    import sys
    import time

    for round_ in range(6):
        path = tmp_path / f"fresh{round_}.sqlite"
        start = time.time() + 1.0
        children = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(path), str(i), repr(start)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
        results = [child.communicate(timeout=60) for child in children]
        assert [child.returncode for child in children] == [0] * 4, [err for _, err in results]
        assert len({out.strip() for out, _ in results}) == 1


@pytest.mark.parametrize("value", [1, "1", 42, "42", MAX_ROW_ID, str(MAX_ROW_ID)])
def test_a_row_id_is_a_whole_number_sqlite_can_hold(value):
    assert row_id(value, "trace") == int(value)


@pytest.mark.parametrize("value", [0, -1, "0", "-1", MAX_ROW_ID + 1, str(MAX_ROW_ID + 1), "9" * 5000, True, 1.0, "1.0",
                                   " 1", "²", "١", "", None, "abc"])
def test_an_id_no_row_can_have_is_one_line_naming_it(value, tmp_path):
    with pytest.raises(ValueError) as info:
        row_id(value, "sweep")
    message = str(info.value)
    assert message.startswith("unknown sweep ") and "\n" not in message and len(message) < 60
    with Store(tmp_path / "r.sqlite") as store:  # what the rule lets through, SQLite can look up
        assert store.trace(MAX_ROW_ID) is None


def test_a_scenario_is_claimed_once_and_a_dead_processs_claims_lapse(tmp_path):
    """Claims: stored scenarios are never claimed; another live run's claims are kept (this
    process's other run counts as alive); a finished process's claims are taken over, all of them."""
    import subprocess
    import sys

    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        sweep_id, _ = store.get_or_create("sweeps", {"claims": 1}, total=6)
        store.add_scenarios(sweep_id, [{"scenario_key": "a", "compressor": "none", "density": None, "nodes": 2,
                                        "bandwidth_bps": 1e9, "latency_s": 1e-5, "topology": "ring",
                                        "fidelity": "analytic", "iteration_s": 1.0, "result_json": "{}"}])
        assert store.claim_scenarios(sweep_id, ["a", "b", "c"], "first") == {"b", "c"}
        assert store.claim_scenarios(sweep_id, ["b", "c", "d"], "second") == {"d"}
        assert store.claim_scenarios(sweep_id, ["b", "c"], "first") == {"b", "c"}  # its own, kept
        child = subprocess.run([sys.executable, "-c", "import sys; from results.store import Store;"
                                "s = Store(sys.argv[1]); print(sorted(s.claim_scenarios(int(sys.argv[2]),"
                                " ['e', 'f'], 'gone')))", str(path), str(sweep_id)],
                               capture_output=True, text=True, timeout=60)
        assert child.stdout.strip() == "['e', 'f']", child.stderr
        assert set(store.scenario_claims(sweep_id, ["e", "f"])) == {"e", "f"}
        assert store.claim_scenarios(sweep_id, ["e"], "second") == {"e"}
        holders = store.scenario_claims(sweep_id, ["e", "f"])
        assert list(holders) == ["e"] and holders["e"]["pid"] == os.getpid()  # every claim of the dead one went
        store.release_claims(sweep_id, "first")
        assert store.claim_scenarios(sweep_id, ["b", "c", "d"], "third") == {"b", "c"}


@pytest.mark.parametrize("target", ["missing.sqlite", "no-such-dir/missing.sqlite"])
def test_a_dangling_store_link_is_refused_and_its_target_never_created(tmp_path, target):
    link = tmp_path / "link.sqlite"
    link.symlink_to(tmp_path / target)
    with pytest.raises(StoreError) as info:
        Store(link)
    message = str(info.value)
    assert "\n" not in message and str(link) in message and "does not exist" in message
    assert not (tmp_path / target).exists() and not (tmp_path / "no-such-dir").exists()
    Store(tmp_path / "real.sqlite").close()
    (tmp_path / "good.sqlite").symlink_to(tmp_path / "real.sqlite")
    with Store(tmp_path / "good.sqlite") as store:  # a link to a store is a store
        assert store.read_only is None and store.get_meta("schema_version") == str(SCHEMA_VERSION)


READ_ONLY_MOUNT = """
import sys
from results.errors import StoreError
from results.store import Store
with Store(sys.argv[1]) as store:
    print(store.read_only, store.get_meta("schema_version"), len(store.query("SELECT * FROM sweeps")))
    try:
        store.pin_meta("x", "y")
    except StoreError as exc:
        print(exc)
"""


@pytest.mark.root
def test_a_store_on_a_read_only_mount_is_read_and_a_write_is_one_line(tmp_path):
    """On a read-only bind mount (its own mount namespace) a store cleanly closed in WAL mode, with no
    write-ahead files beside it, opens: its rows read, a write is one line naming the file."""
    import subprocess
    import sys

    folder = tmp_path / "ro"
    folder.mkdir()
    with Store(folder / "r.sqlite") as store:
        store.get_or_create("sweeps", {"ro": 1}, total=1)
    assert sorted(p.name for p in folder.iterdir()) == ["r.sqlite"]
    script = tmp_path / "read.py"
    script.write_text(READ_ONLY_MOUNT)
    done = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$1" "$1" && exec "$2" "$3" "$4"',
                           "sh", str(folder), sys.executable, str(script), str(folder / "r.sqlite")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
    first, second = done.stdout.strip().splitlines()
    assert first == f"its filesystem is mounted read-only {SCHEMA_VERSION} 1"
    assert second.startswith(f"cannot write to the results store {folder / 'r.sqlite'}: it is read-only here")
    compare = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$1" "$1" && shift && exec "$@"',
                              "sh", str(folder), sys.executable, "-m", "sidco", "compare", "--layout", "resnet50",
                              "--device", "a100", "--nodes", "8", "--bandwidth", "10Gbit", "--compressors", "topk",
                              "--densities", "0.01", "--store", str(folder / "r.sqlite"), "--json"],
                             capture_output=True, text=True, timeout=120)
    assert compare.returncode == 0 and compare.stdout.lstrip().startswith("{"), compare.stderr[-500:]
    assert sorted(p.name for p in folder.iterdir()) == ["r.sqlite"]
