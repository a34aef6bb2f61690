"""Benchmarks of the traces package; prints one JSON line per result (see BENCHMARKS.md).

``python -m benchmarks.trace_bench capture``  capture overhead of the Recorder at every-10th iteration:
    the same training loop with and without a recorder, alternated block by block in one run;
    ratio of step times.
``python -m benchmarks.trace_bench replay``   replay throughput: GB of float32 gradient compressed per
    second of compress time, per compressor and density, on this machine's CPU (or --run-on).
``python -m benchmarks.trace_bench open``     seconds to open a ≈1 GB trace (written to a temporary
    directory, deleted afterwards) and to read one gradient of it.
``python -m benchmarks.trace_bench all``      all three.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import compressors
import traces
from machine import cpu_identity
from traces.recorder import Recorder
from traces.replay import replay


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


def _step(workload: traces.workloads.Workload, optimizer: torch.optim.Optimizer, batches, recorder: Recorder | None) -> float:
    """One training step; returns the seconds spent inside recorder calls (0 without one)."""
    x, y = next(batches)
    optimizer.zero_grad()
    workload.loss(workload.model(x), y).backward()
    if recorder is None:
        optimizer.step()
        return 0.0
    start = time.perf_counter()
    recorder.capture()
    inside = time.perf_counter() - start
    with recorder.optimizer():
        optimizer.step()
    start = time.perf_counter()
    recorder.step()
    return inside + time.perf_counter() - start


def capture_overhead(workload: str = "resnet20", steps: int = 120, every: int = 10) -> dict[str, Any]:
    """Step time (s) with and without a Recorder recording every ``every``-th step, side by side.

    Two identical models train in alternation, one step each in turn, so both arms see the
    same machine load; one Recorder stays attached to the second model for the whole run
    (file writes included). Reports the mean step time per arm and their ratio, the median
    ratio over windows of ``every`` steps, and the share of the recorded arm's time spent
    inside the recorder's calls (capture copy and file write), which is the least noisy figure.
    """
    plain_work = traces.workloads.build(workload)
    rec_work = traces.workloads.build(workload)
    plain_opt, rec_opt = plain_work.optimizer(), rec_work.optimizer()
    plain_batches, rec_batches = plain_work.batches(0, 1), rec_work.batches(0, 1)
    for _ in range(3):
        _step(plain_work, plain_opt, plain_batches, None)
        _step(rec_work, rec_opt, rec_batches, None)
    plain_s: list[float] = []
    recorded_s: list[float] = []
    inside_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        recorder = Recorder(rec_work.model, Path(tmp) / "t", every=every, batch_size=rec_work.batch_size)
        for _ in range(steps):
            start = time.perf_counter()
            _step(plain_work, plain_opt, plain_batches, None)
            plain_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            inside_s += _step(rec_work, rec_opt, rec_batches, recorder)
            recorded_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        trace = recorder.close()
        close_s = time.perf_counter() - start
    windows = [
        sum(recorded_s[i : i + every]) / sum(plain_s[i : i + every]) - 1.0 for i in range(0, steps - every + 1, every)
    ]
    return {
        "bench": "capture_overhead",
        "workload": workload,
        "every": every,
        "steps_per_arm": steps,
        "recorded_iterations": len(trace.iterations),
        "plain_step_s": statistics.mean(plain_s),
        "recorded_step_s": statistics.mean(recorded_s),
        "overhead_ratio_of_means": sum(recorded_s) / sum(plain_s) - 1.0,
        "overhead_ratio_median_window": statistics.median(windows),
        "recorder_time_share": inside_s / sum(recorded_s),
        "close_s": close_s,
    }


def replay_throughput(numel: int = 2_621_440, densities: tuple[float, ...] = (0.01, 0.001), device: str = "cpu",
                      names: list[str] | None = None) -> list[dict[str, Any]]:
    """GB/s of float32 gradient per second of compress time, per compressor and density (once for
    a compressor that takes no density), with the code path (backend) each row ran."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = traces.synthetic(Path(tmp) / "t", "gamma", numel=numel, workers=2, iterations=3, seed=0)
        for name in names or compressors.names():
            for density in densities if compressors.takes_density(name) else densities[:1]:
                rows = list(replay(trace, [name], [density], device=device))
                compress_s = sum(r["compress_s"] for r in rows)
                decompress_s = sum(r["decompress_s"] for r in rows)
                gbytes = 4 * sum(r["numel"] for r in rows) / 1e9
                results.append({
                    "bench": "replay_throughput", "compressor": name, "density": density, "numel": numel,
                    "calls": len(rows), "device": device, "backend": rows[0]["backend"],
                    "compress_gb_per_s": gbytes / compress_s,
                    "decompress_gb_per_s": gbytes / decompress_s if decompress_s else None,
                    "mean_achieved_over_target": statistics.mean(r["achieved_over_target"] for r in rows),
                })
    return results


def open_time(gigabytes: float = 1.0, workers: int = 4, iterations: int = 2, repeats: int = 5) -> dict[str, Any]:
    """Seconds to open a trace of ``gigabytes`` GB (10^9 bytes) and to read one gradient of it."""
    numel = int(gigabytes * 1e9 / (4 * workers * iterations))
    tmp = tempfile.mkdtemp()
    try:
        start = time.perf_counter()
        traces.synthetic(Path(tmp) / "big", "laplace", numel=numel, workers=workers, iterations=iterations, seed=0)
        write_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in (Path(tmp) / "big").iterdir())
        opens = []
        for _ in range(repeats):
            start = time.perf_counter()
            trace = traces.open(Path(tmp) / "big")
            opens.append(time.perf_counter() - start)
        start = time.perf_counter()
        trace.gradient(trace.iterations[-1], workers - 1)
        read_s = time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "bench": "open_time", "trace_bytes": size, "files": iterations, "workers": workers,
        "open_s_first": opens[0], "open_s_median": statistics.median(opens), "write_s": write_s,
        "read_one_gradient_s": read_s, "gradient_bytes": 4 * numel,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: run the chosen benchmark(s) and print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_bench", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("which", choices=["capture", "replay", "open", "all"])
    parser.add_argument("--run-on", default="cpu", help="torch device the replay benchmark runs on (cpu, cuda)")
    parser.add_argument("--numel", type=int, default=2_621_440, help="elements per replayed gradient (default 10 MB fp32)")
    parser.add_argument("--workload", default="resnet20", help="workload of the capture benchmark")
    parser.add_argument("--gigabytes", type=float, default=1.0, help="size of the trace for the open benchmark (10^9 bytes)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier on a shared machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    _emit({"bench": "machine", "platform": platform.platform(), "processor": cpu_identity(),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    if args.which in ("capture", "all"):
        _emit(capture_overhead(args.workload))
    if args.which in ("replay", "all"):
        for record in replay_throughput(args.numel, device=args.run_on):
            _emit(record)
    if args.which in ("open", "all"):
        _emit(open_time(args.gigabytes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
