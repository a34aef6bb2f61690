"""Simulator benchmarks: ``python -m benchmarks.simulator_bench [--quick]``.

Prints a Markdown report:

1. ``analytic`` scenarios per second on one core (in-process, a realistic trace-like
   workload, every compressor and the ``none`` baselines; best of 3 after a warm-up), and the
   same with the cost model's costs on an H200 instead of replayed ones;
2. a 10,000-scenario ``sidco sweep`` (``analytic``, local processes) run as a separate
   command: wall time, and the sweep process's peak RSS next to a 3,060-scenario sweep
   (flat memory means the two peaks are about equal);
3. ``des``: one iteration of a 64-node ring with 50 buckets;
4. ``des``: cost of one iteration from 8 to 1,024 nodes (50 buckets), with the growth
   exponent fitted between successive sizes.

``--scale`` instead measures one resnet50 iteration (5 DDP buckets, ring, ``none`` and
``topk`` at δ = 0.01) at 1,024 and 8,192 nodes, both fidelities, each in its own process:
wall time (s) and peak RSS (MiB) of that process, start-up included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from costs.profile import CompressionProfile
from machine import host_identity
from simulator.scenario import Scenario
from simulator.simulate import iteration
from simulator.sweep import Grid, SweepContext, run_chunk
from simulator.workload import Layer, Workload, workload_from_trace

NODES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCIES = ("1us", "5us", "10us", "50us", "100us")
BANDWIDTHS = ("1Gbit", "2Gbit", "5Gbit", "10Gbit", "20Gbit", "25Gbit", "40Gbit", "50Gbit", "100Gbit", "200Gbit",
              "400Gbit", "800Gbit")


def make_trace(root: Path) -> Path:
    """A 20-layer synthetic trace of 262,144 fp32 elements (≈1 MB, ResNet-20-like size)."""
    import traces

    sizes = [6000 + 600 * i for i in range(20)]
    sizes[-1] += 262_144 - sum(sizes)
    trace = traces.synthetic(
        root / "bench-trace", "laplace", 262_144, workers=2, iterations=1, seed=0,
        layers=[(f"layer{i}", (s,)) for i, s in enumerate(sizes)],
        timings={"forward_s": 0.010, "backward_s": [0.001] * 20, "optimizer_s": 0.001, "batch_size": 128,
                 "device": "cpu"},
    )
    return Path(trace)


def analytic_rate(trace_dir: Path, scenarios: int) -> tuple[float, int]:
    """Scenarios per second of :func:`run_chunk` in this process (one core)."""
    import compressors
    import traces
    from traces.replay import replay

    trace = traces.open(trace_dir)
    names = compressors.names()
    sparse = [n for n in names if n != "none"]
    profile = CompressionProfile.from_replay_rows(replay(trace, sparse, [0.01, 0.001]), source=f"replay of {trace}")
    return _sweep_rate(SweepContext(workload_from_trace(trace), profile), names, scenarios)


def _sweep_rate(context: SweepContext, names: list[str], scenarios: int) -> tuple[float, int]:
    """Scenarios per second (best of 3, after a 100-scenario warm-up) of :func:`run_chunk` over
    the first ``scenarios`` points of the benchmark grid, and how many points that was."""
    grid = Grid(NODES, (1e9, 2e9, 5e9, 10e9, 25e9, 100e9), (1e-6, 1e-5, 5e-5), tuple(names), (0.01, 0.001))
    points = [p for _, p in zip(range(scenarios), grid.points())]
    run_chunk(context, points[:100])
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        run_chunk(context, points)
        best = min(best, time.perf_counter() - start)
    return len(points) / best, len(points)


def model_rate(trace_dir: Path, scenarios: int, device: str = "h200") -> tuple[float, int, float]:
    """:func:`analytic_rate` with the cost model's costs of every compressor on ``device``
    instead of replayed ones (same trace workload, same grid); also the seconds taken to model
    the costs of all compressor × density pairs."""
    import compressors
    import traces
    from costs import costmodel, devices

    names = compressors.names()
    start = time.perf_counter()
    profile = costmodel.compression_profile(devices.get(device), [(n, d) for n in names for d in (0.01, 0.001)])
    modelled = time.perf_counter() - start
    rate, count = _sweep_rate(SweepContext(workload_from_trace(traces.open(trace_dir)), profile), names, scenarios)
    return rate, count, modelled


def sweep_command(trace_dir: Path, store: Path, nodes: tuple[int, ...]) -> dict:
    """Run ``sidco sweep`` as its own process; wall time (s), peak RSS (bytes) of the main process."""
    argv = [sys.executable, "-m", "sidco", "sweep", "--trace", str(trace_dir), "--nodes", ",".join(map(str, nodes)),
            "--bandwidth", ",".join(BANDWIDTHS), "--latency", ",".join(LATENCIES), "--compressors", "all",
            "--densities", "0.01,0.001", "--store", str(store), "--json", "--no-progress", "--jobs", "2"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.1)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"sidco sweep failed: {err.strip()[-300:]}")
    return {**json.loads(out), "wall_s": wall, "peak_rss_bytes": peak}


def des_time(nodes: int, buckets: int = 50, repeats: int = 1) -> float:
    """Best wall time (s) of one ``des`` iteration of a ring with ``buckets`` 1 MB buckets."""
    wl = Workload(tuple(Layer(f"l{i}", 1_000_000, 0.001) for i in range(buckets)), 0.01, 0.001, 32)
    sc = Scenario(wl, nodes, 10e9, 50e-6, bucket_mode="layer", fidelity="des")
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        iteration(sc)
        best = min(best, time.perf_counter() - start)
    return best


SCALE_SNIPPET = """
import json, resource, sys, time
import simulator
from costs.profile import CompressionCost, CompressionProfile
p, fidelity, compressor = int(sys.argv[1]), sys.argv[2], sys.argv[3]
wl = simulator.workload_from_layout("resnet50")
profile = CompressionProfile({("topk", 0.01): CompressionCost(1e-4, 1e-9, 1e-5, 1e-10, (0.08,))}, "fixed")
dense = compressor == "none"
sc = simulator.Scenario(wl, p, 10e9, 50e-6, compressor, None if dense else 0.01, fidelity=fidelity,
                        profile=None if dense else profile)
start = time.perf_counter()
simulator.simulate(sc)
print(json.dumps({"s": time.perf_counter() - start,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def scale_table() -> None:
    """Print the 1,024 / 8,192-node table (one process per cell)."""
    print("| nodes | fidelity | compressor | s / iteration | peak RSS (MiB) |")
    print("|---:|---|---|---:|---:|")
    for nodes in (1024, 8192):
        for fidelity in ("analytic", "des"):
            for compressor in ("none", "topk"):
                out = subprocess.run([sys.executable, "-c", SCALE_SNIPPET, str(nodes), fidelity, compressor],
                                     capture_output=True, text=True, check=True).stdout
                res = json.loads(out)
                print(f"| {nodes:,} | {fidelity} | {compressor} | {res['s']:.3f} | {res['rss'] / 2**20:.0f} |")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print the report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulator_bench", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not the figures)")
    parser.add_argument("--scale", action="store_true", help="only the 1,024 / 8,192-node time and memory table")
    args = parser.parse_args(argv)
    if args.scale:
        scale_table()
        return 0
    print(f"# simulator benchmarks — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{host_identity()['cpu']}, {os.cpu_count()} cores, Python {platform.python_version()}\n")
    with tempfile.TemporaryDirectory(prefix="sidco-bench-") as tmp:
        root = Path(tmp)
        trace_dir = make_trace(root)
        rate, count = analytic_rate(trace_dir, 500 if args.quick else 4000)
        print(f"analytic, one core: {rate:,.0f} scenarios/s ({count} scenarios, 20-layer 1 MB trace, "
              f"all compressors, nodes 2..1024, best of 3)\n")
        rate, count, modelled = model_rate(trace_dir, 500 if args.quick else 4000)
        print(f"analytic with the cost model (h200), one core: {rate:,.0f} scenarios/s ({count} scenarios, same "
              f"trace and grid; modelling the costs of every pair took {modelled * 1e3:.1f} ms)\n")
        small = sweep_command(trace_dir, root / "small.sqlite", NODES[:1] if args.quick else NODES[:3])
        big = sweep_command(trace_dir, root / "big.sqlite", NODES[:2] if args.quick else NODES)
        for name, res in (("small", small), ("large", big)):
            print(f"sidco sweep ({name}): {res['stored']:,} scenarios in {res['wall_s']:.1f} s "
                  f"(incl. start-up and profiling), peak RSS {res['peak_rss_bytes'] / 2**20:.0f} MiB")
        print()
        print(f"des, 64-node ring, 50 buckets: {des_time(64, repeats=3):.3f} s per iteration\n")
        print("| nodes | des s/iteration | growth exponent vs previous |")
        print("|---:|---:|---:|")
        prev = None
        for nodes in ((8, 64) if args.quick else (8, 16, 32, 64, 128, 256, 512, 1024)):
            t = des_time(nodes)
            exponent = "" if prev is None else f"{math.log(t / prev[1]) / math.log(nodes / prev[0]):.2f}"
            print(f"| {nodes} | {t:.3f} | {exponent} |")
            prev = (nodes, t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
