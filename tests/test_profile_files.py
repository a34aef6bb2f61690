"""``--profile FILE`` is read by one loader (:func:`costs.device_profile.load`) for simulate,
sweep, tta and ``profile --check``: regular files only, at most ``MAX_PROFILE_BYTES`` bytes and
``MAX_PROFILE_ROWS`` rows, any bytes refused in one line (exit 2 from the CLI)."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costs import device_profile as dp
from sidco.cli import main

ROW = {"compressor": "topk", "density": 0.01, "numel": 1048576, "compress_s": 0.001, "decompress_s": 0.0001}
SIMULATE = ["simulate", "--layout", "resnet50", "--nodes", "8", "--bandwidth", "10Gbit", "--compressor", "topk",
            "--density", "0.01", "--fidelity", "analytic"]


def _profile(rows: int = 1) -> dict:
    return {"device": "cpu", "source": "test", "rows": [dict(ROW, numel=ROW["numel"] + i) for i in range(rows)]}


def test_a_valid_profile_loads(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile(3)))
    assert len(dp.load(path).rows) == 3


def test_dev_zero_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(ValueError, match="a device; a profile must be a regular file"):
        dp.load("/dev/zero")
    assert time.monotonic() - start < 1.0


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(ValueError, match="a FIFO; a profile must be a regular file"):
        dp.load(fifo)
    assert time.monotonic() - start < 1.0


def test_a_directory_and_a_socket_are_refused(tmp_path):
    with pytest.raises(ValueError, match="a directory|Is a directory"):
        dp.load(tmp_path)
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(ValueError, match="socket"):
            dp.load(path)


def test_a_file_over_the_size_limit_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(50 * 2**30)  # sparse: reading it would take minutes and 50 GB
    start = time.monotonic()
    with pytest.raises(ValueError, match=f"more than the {dp.MAX_PROFILE_BYTES} bytes a profile may hold"):
        dp.load(path)
    assert time.monotonic() - start < 1.0


def test_too_many_rows_are_refused(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(_profile(dp.MAX_PROFILE_ROWS + 1), separators=(",", ":")))
    assert path.stat().st_size < dp.MAX_PROFILE_BYTES
    with pytest.raises(ValueError, match=f"more than the {dp.MAX_PROFILE_ROWS} a profile may hold"):
        dp.load(path)


def test_deep_nesting_and_huge_numbers_are_one_line(tmp_path):
    for text in ("[" * 200_000, '{"device": "cpu", "source": "x", "rows": [' + "9" * 100_000 + "]}"):
        path = tmp_path / "deep.json"
        path.write_text(text)
        with pytest.raises(ValueError) as info:
            dp.load(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(
    st.binary(max_size=300),
    st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                 max_leaves=30).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"device": st.text(max_size=5), "source": st.text(max_size=5),
                           "rows": st.lists(st.dictionaries(st.sampled_from(list(ROW)), st.floats() | st.text(max_size=3)
                                                            | st.integers(), max_size=6), max_size=3)})
    .map(lambda v: json.dumps(v).encode()),
))
def test_arbitrary_bytes_load_or_are_one_line_errors(tmp_path, data):
    path = tmp_path / "fuzz.json"
    path.write_bytes(data)
    try:
        profile = dp.load(path)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        assert profile.rows and all(0 < r["density"] <= 1 for r in profile.rows)


@pytest.mark.parametrize("argv", [
    SIMULATE,
    ["sweep", "--layout", "resnet50", "--nodes", "8", "--bandwidth", "10Gbit", "--compressors", "topk",
     "--densities", "0.01", "--fidelity", "analytic", "--jobs", "1"],
    ["profile", "--check"],
])
@pytest.mark.parametrize("bad", ["/dev/zero", "fifo", "big"])
def test_the_cli_refuses_bad_profile_files_in_one_line(tmp_path, capsys, argv, bad):
    if bad == "fifo":
        os.mkfifo(tmp_path / "fifo")
    if bad == "big":
        with open(tmp_path / "big", "wb") as fh:
            fh.truncate(dp.MAX_PROFILE_BYTES + 1)
    path = bad if bad.startswith("/") else str(tmp_path / bad)
    try:
        code = main([*argv, "--profile", path, "--store", str(tmp_path / "r.sqlite")])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and path in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("reader", ["curves", "text"])
def test_curves_and_text_files_are_read_as_bounded_regular_files_too(tmp_path, reader):
    """The one bounded reader (traces.files.read_regular) serves --curves and --data text files:
    a FIFO is refused at once (it would block a plain read), a directory and a file over the limit
    in one line naming the file."""
    from convergence import curves
    from traces.workloads import corpus

    read = curves.load if reader == "curves" else corpus.file_texts
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="a FIFO"):
        read(fifo)
    with pytest.raises(ValueError, match="a directory"):
        read(tmp_path)
    limit = curves.MAX_BYTES if reader == "curves" else corpus.MAX_TEXT_BYTES
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(limit + 1)
    with pytest.raises(ValueError, match=f"more than the {limit} bytes"):
        read(big)


@pytest.mark.parametrize("change, said", [
    ({"compress_s": 1e308}, "longer than the 3600 s"),
    ({"decompress_s": 3601.0}, "longer than the 3600 s"),
    ({"numel": 1e30}, "more than the 1099511627776 elements"),
    ({"wire_bytes": 1e300}, "more than 16 bytes per element"),
])
def test_rows_no_measurement_could_give_are_refused_in_one_line(tmp_path, capsys, change, said):
    """compress_s 1e308 once ended in a ZeroDivisionError in the band; wire_bytes 1e300 printed 'to inf s'."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"device": "cpu", "source": "test", "rows": [dict(ROW, **change)]}))
    with pytest.raises(ValueError, match=said):
        dp.load(path)
    code = main([*SIMULATE, "--profile", str(path), "--store", str(tmp_path / "r.sqlite")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and said in lines[0]


def test_the_largest_message_a_row_may_carry_is_accepted(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"device": "cpu", "source": "test", "rows": [
        dict(ROW, numel=1000, wire_bytes=16 * 1000, compress_s=3600.0)]}))
    assert dp.load(path).rows[0]["wire_bytes"] == 16_000


def test_contradicting_duplicate_rows_are_refused_and_repeats_are_not(tmp_path):
    """Two rows for one (compressor, density, numel) once moved the answer silently (12.1 s → 32.2 s)."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"device": "cpu", "source": "test", "rows": [ROW, dict(ROW)]}))
    assert len(dp.load(path).rows) == 2
    path.write_text(json.dumps({"device": "cpu", "source": "test", "rows": [ROW, dict(ROW, compress_s=0.5)]}))
    with pytest.raises(ValueError, match="row 1: topk at density 0.01 on 1048576 elements contradicts row 0"):
        dp.load(path)


def test_a_profile_that_is_a_symbolic_link_is_refused_in_one_line(tmp_path, capsys):
    """A linked --profile was followed (as root it read /etc/shadow before calling it 'not JSON')."""
    real = tmp_path / "real.json"
    real.write_text(json.dumps(_profile()))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="a symbolic link; a profile must be a regular file"):
        dp.load(link)
    assert len(dp.load(real).rows) == 1
    code = main([*SIMULATE, "--profile", str(link), "--store", str(tmp_path / "r.sqlite")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "symbolic link" in lines[0]
