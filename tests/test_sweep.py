"""Sweeps and the simulate/sweep commands: store rows, resume after SIGKILL, Dask = local."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidco.cli import main
from results.store import Store
from pipeline.request import pair
from simulator.sweep import Grid, scenario_key
from killing import kill_while_claiming

SIDCO = [sys.executable, "-m", "sidco"]
PAIRS = [("topk", 0.01), ("topk", 0.001), ("sidco-e", 0.01), ("sidco-e", 0.001)]


def make_trace(root: Path, layers: int = 6) -> Path:
    """A small synthetic trace with measured-looking timings."""
    import traces

    sizes = [20_000 + 7_000 * i for i in range(layers)]
    trace = traces.synthetic(
        root / "trace", "laplace", sum(sizes), workers=2, iterations=1, seed=3,
        layers=[(f"l{i}", (s,)) for i, s in enumerate(sizes)],
        timings={"forward_s": 0.02, "backward_s": [0.003 + 0.001 * i for i in range(layers)],
                 "optimizer_s": 0.002, "batch_size": 32, "device": "cpu"},
    )
    return Path(trace)


def add_replay(store_path: Path, trace_dir: Path) -> None:
    """Stored replay rows for the trace, so every run uses the same compression profile."""
    import traces

    trace = traces.open(trace_dir)
    with Store(store_path) as store:
        trace_id = store.register_trace(str(trace_dir.resolve()), trace.manifest)
        replay_id, _ = store.get_or_create("replays", {"test": str(trace_dir)}, trace_id=trace_id, device="cpu")
        rows = []
        for c, d in PAIRS:
            for worker in range(2):
                selected = int(d * trace.numel * (1 + 0.1 * worker))
                rows.append({
                    "compressor": c, "density": d, "error_feedback": 1, "iteration": 1,
                    "worker": worker, "bucket": 0, "numel": trace.numel, "selected": selected,
                    "achieved_density": selected / trace.numel, "achieved_over_target": selected / trace.numel / d,
                    "threshold": 0.1, "stages": 1, "compress_s": 2e-8 * trace.numel, "decompress_s": 1e-9 * trace.numel,
                    "wire_bytes": 8 * selected, "rel_error": 0.5,
                })
        store.add_replay_rows(replay_id, rows)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("sweep"))


def scenario_rows(store_path: Path) -> list[tuple]:
    with sqlite3.connect(store_path) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(scenarios)") if r[1] != "sweep_id"]
        return conn.execute(f"SELECT {', '.join(cols)} FROM scenarios ORDER BY scenario_key").fetchall()


def test_grid_is_lazy_and_keys_are_unique():
    grid = Grid((2, 4), (1e9, 1e10), (5e-5,), ("none", "topk", "sidco-e"), (0.01, 0.001), ("ring", "tree"))
    points = list(grid.points())
    assert len(points) == len(grid) == 2 * 2 * 2 * (1 + 4)
    assert len({scenario_key(p) for p in points}) == len(points)
    with pytest.raises(ValueError, match="nodes"):
        Grid((0,), (1e9,), (0.0,), ("none",), ())


def test_sweep_stores_every_scenario_once_and_resumes(tmp_path, trace_dir, capsys):
    store = tmp_path / "r.sqlite"
    add_replay(store, trace_dir)
    argv = ["sweep", "--trace", str(trace_dir), "--nodes", "2,8,32", "--bandwidth", "1Gbit,100Gbit",
            "--compressors", "none,topk,sidco-e", "--densities", "0.01,0.001", "--store", str(store),
            "--jobs", "2", "--chunk-size", "7", "--json", "--no-progress"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    sources = first.pop("cost_sources")
    found, stored_rows = first.pop("findings"), first.pop("rows")
    assert len(stored_rows) == 42 and len(found) == 6  # 3 node counts x 2 bandwidths x (none, fp16, powersgd, 4)
    for cluster in found:
        mine = [r for r in stored_rows if (r["nodes"], r["bandwidth_bps"]) == (cluster["nodes"], cluster["bandwidth_bps"])]
        fastest = min(mine, key=lambda r: r["iteration_s"])
        none = next(r for r in mine if r["compressor"] == "none")
        assert cluster["iteration_s"] == fastest["iteration_s"]
        assert cluster["best"] == pair(fastest["compressor"], fastest["density"]).label
        assert cluster["speedup"] == pytest.approx(none["iteration_s"] / fastest["iteration_s"])
        dense = min(r["iteration_s"] for r in mine if r["compressor"] in ("none", "fp16", "powersgd"))
        assert cluster["speedup_over_baseline"] == pytest.approx(dense / fastest["iteration_s"])
        assert cluster["verdict"]["winner"] == cluster["best"]
    assert first == {"computed": 42, "fidelity": "analytic", "resumed": False, "store": str(store),
                     "stored": 42, "sweep_id": first["sweep_id"], "total": 42, "device": "cpu",
                     "compute_source": "trace timings (cpu)", "memory_capacity_gib": None}  # a CPU's is unknown
    replayed = {label: where for label, where in sources.items() if label not in ("fp16", "powersgd")}
    assert replayed and all(where.startswith("replay #") for where in replayed.values())  # the baselines: modelled
    rows = scenario_rows(store)
    assert len(rows) == 42
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["computed"] == 0 and again["resumed"] and scenario_rows(store) == rows
    with Store(store) as s:
        by_key = {r["scenario_key"]: r for r in s.query("SELECT * FROM scenarios")}
        none = by_key["ring|n=8|bw=1e+09|lat=5e-05|none|d=-"]
        topk = by_key["ring|n=8|bw=1e+09|lat=5e-05|topk|d=0.001"]
        assert none["speedup"] == 1.0
        assert topk["speedup"] == pytest.approx(none["iteration_s"] / topk["iteration_s"])
        assert s.query("SELECT status FROM sweeps")[0]["status"] == "done"
        assert (none["device"], none["cost_source"]) == ("cpu", None)
        assert topk["device"] == "cpu" and topk["cost_source"].startswith("replay #")
        detail = json.loads(topk["result_json"])
        assert detail["workers"] == 8 and detail["wire_bytes"] < detail["dense_bytes"]


def test_sweep_killed_with_sigkill_resumes_to_exactly_once(tmp_path, trace_dir):
    store = tmp_path / "r.sqlite"
    add_replay(store, trace_dir)
    argv = SIDCO + ["sweep", "--trace", str(trace_dir), "--nodes", "8,32,64", "--bandwidth",
                    "1Gbit,10Gbit,100Gbit", "--latency", "1us,10us,100us,1ms", "--compressors",
                    "none,topk,sidco-e", "--densities", "0.01,0.001", "--fidelity", "des", "--bucket-mode", "layer",
                    "--store", str(store), "--jobs", "1", "--chunk-size", "3", "--no-progress"]
    total = 3 * 3 * 4 * (3 + 2 * 2)  # none, fp16, powersgd and two sparsifiers at two densities
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    seen = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            try:
                with sqlite3.connect(store, timeout=1) as conn:
                    seen = conn.execute("SELECT COUNT(*) FROM scenarios").fetchone()[0]
            except sqlite3.OperationalError:
                continue
            if seen >= 12:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert 12 <= seen < total, proc.stderr.read().decode()[-500:]
    done = subprocess.run(argv + ["--json", "--chunk-size", "50", "--jobs", "2", "--fidelity", "des"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    summary = json.loads(done.stdout)
    assert summary["resumed"] and summary["stored"] == total and summary["computed"] <= total - seen
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT scenario_key) FROM scenarios").fetchone() == (total, total)
        assert conn.execute("SELECT COUNT(*) FROM sweeps").fetchone()[0] == 1


@pytest.mark.slow
def test_dask_cluster_gives_the_same_rows_as_local(tmp_path, trace_dir):
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen(dask + ["--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                      "--scheduler-file", str(sched_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "2", "--nthreads", "1",
             "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        common = ["sweep", "--trace", str(trace_dir), "--nodes", "2,4,16", "--bandwidth", "1Gbit,25Gbit",
                  "--compressors", "none,topk,sidco-e", "--densities", "0.01,0.001", "--topology", "ring,ps",
                  "--chunk-size", "4", "--json", "--no-progress"]
        local, remote = tmp_path / "local.sqlite", tmp_path / "dask.sqlite"
        for store in (local, remote):
            add_replay(store, trace_dir)
        assert main(common + ["--store", str(local), "--jobs", "2"]) == 0
        assert main(common + ["--store", str(remote), "--dask", address]) == 0
        assert scenario_rows(remote) == scenario_rows(local)
        assert len(scenario_rows(local)) == 3 * 2 * 2 * 7
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_simulate_command_json_and_timeline(tmp_path, trace_dir, capsys):
    store = tmp_path / "r.sqlite"
    add_replay(store, trace_dir)
    timeline = tmp_path / "tl.json"
    argv = ["simulate", "--trace", str(trace_dir), "--nodes", "8", "--bandwidth", "10Gbit", "--latency", "50us",
            "--compressor", "sidco-e", "--density", "0.001", "--store", str(store), "--json",
            "--timeline", str(timeline)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("iteration_s", "samples_per_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s",
                "speedup", "timeline"):
        assert key in result
    assert result["forward_s"] == pytest.approx(0.02) and result["workers"] == 8
    assert json.loads(timeline.read_text())["traceEvents"]
    assert main(argv[:-3] + ["--topology", "ps", "--fidelity", "analytic"]) == 0
    assert "8 workers), ps," in capsys.readouterr().out
    assert main(["simulate", "--trace", str(trace_dir), "--nodes", "4", "--bandwidth", "1.25GB/s",
                 "--store", str(store)]) == 0
    assert "speed-up" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(trace_dir), "--nodes", "4", "--bandwidth", "10Gbit", "--jitter", "bad",
                 "--store", str(store)]) == 2
    assert "invalid --jitter" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--nodes", "0", "--bandwidth", "10Gbit"], "--nodes must be an integer >= 1"),
        (["--nodes", "4", "--bandwidth", "0Gbit"], "invalid bandwidth"),
        (["--nodes", "4", "--bandwidth", "10G"], "invalid bandwidth"),
        (["--nodes", "4", "--bandwidth", "10Gbit", "--latency", "50"], "invalid duration"),
        (["--nodes", "4", "--bandwidth", "10Gbit", "--compressor", "zip", "--density", "0.1"], "unknown compressor"),
        (["--nodes", "4", "--bandwidth", "10Gbit", "--compressor", "topk"], "--density is needed"),
    ],
)
def test_simulate_bad_input_is_one_line(tmp_path, trace_dir, extra, message, capsys):
    assert main(["simulate", "--trace", str(trace_dir), "--store", str(tmp_path / "r.sqlite"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and message in err


def test_bad_input_exit_code_from_the_console():
    out = subprocess.run(SIDCO + ["sweep", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10G"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == ("sidco sweep: error: invalid bandwidth '10G': give a unit, "
                                  "e.g. 10Gbit, 100Mbit/s or 1.25GB/s")


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--nodes", "2,0", "--bandwidth", "10Gbit"], "--nodes must be an integer >= 1"),
        (["--nodes", "2", "--bandwidth", "10Gbit,-1Gbit"], "invalid bandwidth"),
        (["--nodes", "2", "--bandwidth", "10Gbit", "--densities", "0.01,2"], "invalid density"),
        (["--nodes", "2", "--bandwidth", "10Gbit", "--topology", "mesh"], "unknown topology"),
        (["--nodes", "2", "--bandwidth", "10Gbit", "--compressors", "none", "--topology", "ps", "--ps-servers", "5"],
         "ps_servers"),
    ],
)
def test_sweep_bad_input_is_one_line(tmp_path, trace_dir, extra, message, capsys):
    assert main(["sweep", "--trace", str(trace_dir), "--store", str(tmp_path / "r.sqlite"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and message in err


def test_simulate_uses_the_latest_calibration(tmp_path, trace_dir, capsys):
    store = tmp_path / "r.sqlite"
    argv = ["simulate", "--trace", str(trace_dir), "--nodes", "8", "--bandwidth", "1Gbit", "--fidelity", "analytic",
            "--bucket-mode", "single", "--store", str(store), "--json"]
    assert main(argv + ["--calibration"]) == 2
    assert "no calibration" in capsys.readouterr().err
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    with Store(store) as s:
        s.add_calibration(1e-3, 1.6e-8, 0.5, {})
    assert main(argv + ["--calibration"]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    n, p = plain["dense_bytes"], 8
    expected = 2 * (p - 1) * (50e-6 + 1e-3) + 2 * (p - 1) / p * n / (0.5 * 1e9 / 8)
    assert calibrated["exposed_comm_s"] == pytest.approx(expected, rel=1e-9)
    assert calibrated["iteration_s"] > plain["iteration_s"]


def test_unreachable_dask_scheduler_is_a_one_line_error(tmp_path, trace_dir, capsys, monkeypatch):
    import pipeline.sweep

    monkeypatch.setattr(pipeline.sweep, "DASK_CONNECT_TIMEOUT_S", 1.0)  # the same error, sooner
    argv = ["sweep", "--trace", str(trace_dir), "--nodes", "2", "--bandwidth", "1Gbit", "--compressors", "none",
            "--store", str(tmp_path / "r.sqlite"), "--dask", "tcp://127.0.0.1:9", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sidco sweep: error:") and err.strip().count("\n") == 0


AT_ONCE = """
import sys, time
from sidco.cli import main
start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.001)
sys.exit(main(sys.argv[2:]))
"""
"""Runs ``sidco ARGS…`` once its imports are done and the wall clock reaches ``argv[1]``."""

TWIN_SWEEP = ["sweep", "--layout", "resnet50", "--nodes", "16,32", "--bandwidth", "1Gbit,10Gbit", "--latency",
              "10us,100us", "--compressors", "none,topk,sidco-e", "--densities", "0.1,0.01", "--fidelity", "des",
              "--bucket-mode", "layer", "--jobs", "1", "--chunk-size", "2", "--no-progress"]
TWIN_TOTAL = 2 * 2 * 2 * (3 + 2 * 2)


def test_two_identical_sweeps_started_at_once_compute_each_scenario_once(tmp_path):
    """Two ``sidco sweep`` processes of one grid on one store, started at the same instant: they
    share the work (each computes what it claimed, waits for the rest), so the scenarios they
    say they computed add up to the grid, and both print the same rows and findings."""
    store = tmp_path / "r.sqlite"
    start = time.time() + 3.0
    twins = [subprocess.Popen([sys.executable, "-c", AT_ONCE, repr(start), *TWIN_SWEEP, "--store", str(store),
                               "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [twin.communicate(timeout=300) for twin in twins]
    assert [twin.returncode for twin in twins] == [0, 0], [err[-500:] for _, err in outputs]
    first, second = (json.loads(out) for out, _ in outputs)
    assert first["computed"] + second["computed"] == TWIN_TOTAL
    assert first["stored"] == second["stored"] == TWIN_TOTAL
    assert first["rows"] == second["rows"] and first["findings"] == second["findings"]
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT scenario_key) FROM scenarios").fetchone() == (
            TWIN_TOTAL, TWIN_TOTAL)
        assert conn.execute("SELECT COUNT(*) FROM scenario_claims").fetchone()[0] == 0  # released at the end
    conn.close()


def test_claims_left_by_a_killed_sweep_do_not_block_its_twin(tmp_path):
    """A sweep killed with SIGKILL while it holds claims leaves them in the store; the same sweep
    run again takes them over (their process is gone) and finishes, computing only what is missing."""
    store = tmp_path / "r.sqlite"
    seen = kill_while_claiming(SIDCO + TWIN_SWEEP + ["--store", str(store)], store, TWIN_TOTAL)
    done = subprocess.run(SIDCO + TWIN_SWEEP + ["--store", str(store), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    summary = json.loads(done.stdout)
    assert summary["resumed"] and summary["stored"] == TWIN_TOTAL and summary["computed"] == TWIN_TOTAL - seen
