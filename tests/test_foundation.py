"""The front door: CLI basics, the results store, unit parsing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from sidco import __version__
from sidco.cli import main
from results.store import SCHEMA_VERSION, Store
from units import parse_bandwidth, parse_bytes, parse_duration


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out
    out = subprocess.run([sys.executable, "-m", "sidco", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: sidco" in out.stdout


def test_store_is_wal_and_versioned(tmp_path):
    s = Store(tmp_path / "r.sqlite")
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s.query("SELECT value FROM meta WHERE key='schema_version'")[0][0] == str(SCHEMA_VERSION)
    s.close()
    with sqlite3.connect(tmp_path / "r.sqlite") as raw:
        raw.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(ValueError, match="schema version 99"):
        Store(tmp_path / "r.sqlite")


def test_store_transaction_rolls_back(store):
    trace_id = store.register_trace("/tmp/x", {"workload": "w", "workers": 2, "iterations": [0, 10],
                                              "layers": [{"shape": [3, 4]}]})
    assert store.traces()[0]["numel"] == 12
    with pytest.raises(RuntimeError):
        with store.transaction() as cur:
            cur.execute("DELETE FROM traces WHERE id=?", (trace_id,))
            raise RuntimeError("boom")
    assert len(store.traces()) == 1
    assert store.register_trace("/tmp/x", {"workload": "w2"}) == trace_id


def test_get_or_create_is_idempotent(store):
    first = store.get_or_create("sweeps", {"a": 1, "b": [1, 2]}, total=4)
    again = store.get_or_create("sweeps", {"b": [1, 2], "a": 1}, total=4)
    assert first == (again[0], True) and again[1] is False


@pytest.mark.parametrize(
    "text,bps",
    [("10Gbit", 10e9), ("10Gbit/s", 10e9), ("100Mbps", 100e6), ("1.25GB/s", 10e9), ("800kbit", 8e5)],
)
def test_parse_bandwidth(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text", ["10", "10G", "-1Gbit", "0Mbit", "fast", "10 Gbits/h"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(ValueError):
        parse_bandwidth(text)


def test_parse_bytes_and_duration():
    assert parse_bytes("64KB") == 64_000
    assert parse_bytes("1MiB") == 2**20
    assert parse_bytes("512B") == 512
    assert parse_duration("50us") == pytest.approx(50e-6)
    assert parse_duration("1.5ms") == pytest.approx(1.5e-3)
    for bad in ("1M", "12", "0.5B"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    with pytest.raises(ValueError):
        parse_duration("50")


@given(st.floats(min_value=1.0, max_value=1e6, allow_nan=False), st.sampled_from(["k", "M", "G"]))
def test_bandwidth_roundtrip(value, prefix):  # from 1 kbit/s: below is outside the physical range
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}[prefix]
    assert parse_bandwidth(f"{value!r}{prefix}bit/s") == pytest.approx(value * scale, rel=1e-12)


@pytest.mark.parametrize("parse, text, said", [
    (parse_bandwidth, "-10Gbit", "negative, bandwidth must be > 0"),
    (parse_bytes, "-1MB", "negative, size must be >= 0"),
    (parse_duration, "-2ms", "negative, duration must be >= 0"),
])
def test_a_negative_quantity_is_named_as_negative_not_as_missing_its_unit(parse, text, said):
    with pytest.raises(ValueError, match=said):
        parse(text)


def test_a_list_keeps_each_value_once_in_first_place_order():
    """``--densities 0.01,0.01`` once printed every bench row twice."""
    from units import parse_density, parse_list

    assert parse_list("0.01,0.001,0.01,0.010", parse_density) == [0.01, 0.001]
    assert parse_list("1MB,64KB,1000KB", parse_bytes) == [1_000_000, 64_000]
    assert parse_list("topk,dgc,topk", str) == ["topk", "dgc"]
