"""Property tests of every entry point with generated bad input: the CLI's argument parser (each
subcommand), the dashboard's controls, the trace loader (file kinds) and opening the store (garbage
bytes). Each asserts: one line, exit code 2 (or the one-line exception), nothing written."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import compressors
import traces
from machine.device import resolve as resolve_device
from results import Store, StoreError
from sidco.cli import main
from units import parse_bandwidth, parse_bytes, parse_density, parse_duration

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

JUNK = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    st.sampled_from(["", " ", "-1", "0", "-0", "nan", "inf", "-inf", "1e309", "10G", "4,,8", ",", "1,", "１",
                     "0x10", "1_000", "2.5", "1e-400", "--help-me", "10Gbit,", "999999999999999999999999"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(max_value=0).map(str),
)


def _valid(parse, text: str) -> bool:
    try:
        parse(text)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        value = int(str(text).strip())
        if value < minimum:
            raise ValueError
        return value
    return parse


def _float_in(low: float, high: float, *, open_low: bool = False):
    def parse(text: str) -> float:
        value = float(text)
        if not (low < value <= high if open_low else low <= value <= high):
            raise ValueError
        return value
    return parse


def _list_of(parse):
    def parse_all(text: str) -> list:
        items = [item.strip() for item in str(text).split(",")]
        if not all(items):
            raise ValueError
        return [parse(item) for item in items]
    return parse_all


def _choice(options):
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError
        return text
    return parse


def _calibration(text: str):
    from pipeline.request import parse_calibration

    return parse_calibration(text)


def _positive_bytes(text: str) -> int:
    value = parse_bytes(text)
    if not value > 0:
        raise ValueError
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError
    return value


def _non_negative_or_trace(text: str) -> float:
    if text.strip() == "trace":
        return 0.0
    value = float(text)
    if not value >= 0:
        raise ValueError
    return value


def _never(text: str):
    raise ValueError


TOPOLOGY = _choice({"ring", "tree", "halving-doubling", "ps", "hierarchical"})
LAYOUT = ["--layout", "resnet50", "--fidelity", "analytic"]
# subcommand -> (valid argv, takes --store, {option: says whether a value is valid (raises if not)})
CASES = {
    "simulate": (["simulate", *LAYOUT, "--nodes", "4", "--bandwidth", "10Gbit"], True, {
        "--nodes": _int_at_least(1), "--bandwidth": parse_bandwidth, "--latency": parse_duration,
        "--bucket-cap": parse_bytes, "--first-bucket": parse_bytes, "--intra-latency": parse_duration,
        "--intra-bandwidth": parse_bandwidth, "--batch-size": _int_at_least(1), "--topology": TOPOLOGY,
        "--fidelity": _choice({"analytic", "des"}), "--jitter": _non_negative_or_trace,
        "--density": parse_density,
        "--timeline": _never,  # generated names are relative to a fresh directory: see the junk check below
    }),
    "sweep": (["sweep", *LAYOUT, "--nodes", "4", "--bandwidth", "10Gbit", "--compressors", "none"], True, {
        "--nodes": _list_of(_int_at_least(1)), "--bandwidth": _list_of(parse_bandwidth),
        "--latency": _list_of(parse_duration), "--jobs": _int_at_least(1), "--chunk-size": _int_at_least(1),
        "--topology": _list_of(TOPOLOGY),
    }),
    "replay": (["replay", "TRACE", "--compressors", "topk", "--densities", "0.1"], True, {
        "--densities": _list_of(parse_density), "--compressors": _list_of(_choice(set(compressors.names()))),
        "--run-on": resolve_device, "--device": _never, "--bucket-cap": _positive_bytes,
        "--bucket-mb": _never, "--threads": _int_at_least(1),
    }),
    "capture": (["capture", "--workload", "resnet20", "--out", "OUT", "--iterations", "1", "--every", "1",
                 "--workers", "1"], True, {
        "--workers": _int_at_least(1), "--iterations": _int_at_least(1), "--every": lambda t: int(t) == 1 or _never(t),
        "--width": _positive_float, "--run-on": resolve_device, "--device": _never, "--lr": _positive_float,
        "--batch-size": _int_at_least(1), "--threads": _int_at_least(1),
        "--workload": _choice(set(traces.workloads.names())),
    }),
    "emulate": (["emulate", "--no-shaping", "--workers", "2"], True, {
        "--workers": _list_of(_int_at_least(2)), "--densities": _list_of(_float_in(0, 1, open_low=True)),
        "--density": _never, "--calibration": _calibration,
        "--iterations": _int_at_least(1),
    }),
    "bench": (["bench", "--size", "1000", "--densities", "0.1", "--compressors", "topk"], False, {
        "--size": _int_at_least(1), "--densities": _list_of(parse_density), "--run-on": resolve_device,
        "--device": _never,
        "--repeats": _int_at_least(1), "--compressors": _list_of(_choice(set(compressors.names()))),
    }),
    "dashboard": (["dashboard"], True, {"--port": lambda t: _float_in(1, 65535)(int(t))}),
}


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    return Path(traces.synthetic(tmp_path_factory.mktemp("fuzz-cli") / "t", "laplace", 2000, workers=1,
                                 iterations=1, seed=0).path)


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("command", sorted(CASES))
@FUZZ
@given(data=st.data())
def test_cli_bad_values_are_one_line_exit_2_and_write_nothing(command, trace_dir, data, capsys):
    base, has_store, options = CASES[command]
    option = data.draw(st.sampled_from(sorted(options)), label="option")
    value = data.draw(JUNK, label="value")
    if option == "--timeline":
        value = f"missing-dir/{value}.json"
    assume(not _valid(options[option], value))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        argv = [str(trace_dir) if a == "TRACE" else str(root / "out") if a == "OUT" else a for a in base]
        argv += [f"{option}={value}"] + (["--store", str(root / "r.sqlite")] if has_store else [])
        before = os.getcwd()
        os.chdir(root)
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        finally:
            os.chdir(before)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert _listing(root) == set(), (argv, _listing(root))


@FUZZ
@given(option=st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10), command=st.sampled_from(sorted(CASES)))
def test_cli_unknown_options_are_one_line(option, command, capsys):
    assume(not option.startswith("-"))
    with pytest.raises(SystemExit) as info:
        main([command, f"--zz{option}=1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("sidco") and ": error: " in err


@pytest.fixture(scope="module")
def dashboard_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz-dash") / "r.sqlite"
    Store(path).close()
    return path


def _state(path: Path) -> tuple:
    with sqlite3.connect(path) as conn:
        counts = tuple(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                       for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'"))
    return counts


@FUZZ
@given(field=st.sampled_from(["source", "compressors", "density", "nodes", "bandwidth", "latency", "topology"]),
       value=st.one_of(JUNK, st.none(), st.integers(), st.floats(allow_nan=True), st.lists(JUNK, max_size=3)))
def test_dashboard_controls_refuse_bad_values_in_one_line(dashboard_store, field, value):
    from dashboard import projection

    good = {"source": "layout:resnet50", "compressors": ["none"], "density": "0.01", "nodes": "4",
            "bandwidth": "10Gbit", "latency": "50us", "topology": "ring"}
    controls = {**good, field: value}
    before = _state(dashboard_store)
    try:
        chosen = projection.parse_controls(**controls)
        with Store(dashboard_store) as store:
            projection.project(store, chosen)
    except projection.ProjectionError as exc:
        assert "\n" not in str(exc) and str(exc).strip()
    assert _state(dashboard_store) == before


@FUZZ
@given(field=st.sampled_from(["source", "densities", "nodes", "bandwidths", "latency", "topology"]), value=JUNK)
def test_dashboard_sweep_form_refuses_bad_values_in_one_line(dashboard_store, field, value):
    from dashboard import sweep_runner

    good = {"source": "layout:resnet50", "compressors": ["none", "topk"], "densities": "0.01", "nodes": "2,4",
            "bandwidths": "10Gbit", "latency": "50us", "topology": "ring"}
    spec = {**good, field: value}
    before = _state(dashboard_store)
    try:
        sweep_runner.parse_spec(**spec)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc).strip()
    assert _state(dashboard_store) == before


@pytest.fixture(scope="module")
def original_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz-kinds") / "t"
    traces.synthetic(path, "laplace", numel=64, workers=1, iterations=2, seed=3)
    return path


KINDS = ["regular", "symlink-inside", "symlink-outside", "fifo", "directory", "missing"]


@FUZZ
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=3, max_size=3))
def test_trace_loader_accepts_only_regular_files(original_trace, kinds):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        shutil.copytree(original_trace, root)
        files = [root / "manifest.json", *sorted(root.glob("grad-*.safetensors"))]
        for path, kind in zip(files, kinds):
            if kind == "regular":
                continue
            data = path.read_bytes()
            path.unlink()
            if kind == "symlink-inside":
                (root / "copy.bin").write_bytes(data)
                path.symlink_to(root / "copy.bin")
            elif kind == "symlink-outside":
                (Path(tmp) / "outside.bin").write_bytes(data)
                path.symlink_to(Path(tmp) / "outside.bin")
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "directory":
                path.mkdir()
        listing = _listing(Path(tmp))
        try:
            t = traces.open(root)
            for it in t.iterations:
                t.gradient(it, 0)
            outcome = "ok"
        except traces.TraceError as exc:
            assert "\n" not in str(exc)
            outcome = str(exc)
        assert (outcome == "ok") == all(k == "regular" for k in kinds), (kinds, outcome)
        assert _listing(Path(tmp)) == listing


SQLITE_MAGIC = b"SQLite format 3\x00"


@FUZZ
@given(garbage=st.binary(min_size=1, max_size=8192))
def test_store_open_on_garbage_is_one_line_and_writes_nothing(garbage):
    assume(not garbage.startswith(SQLITE_MAGIC[:6]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.sqlite"
        path.write_bytes(garbage)
        with pytest.raises(StoreError) as info:
            Store(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
        assert path.read_bytes() == garbage
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["r.sqlite"]
        assert stat.S_ISREG(path.stat().st_mode)
