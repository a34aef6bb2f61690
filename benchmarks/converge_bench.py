"""How fast ``sidco converge`` trains on this machine: iterations per second per worker count and thread count.

``python -m benchmarks.converge_bench [--workloads resnet20:0.5,lstm:1] [--workers 1,2,4] [--threads 1,2]
[--iterations 6]`` times :func:`convergence.train` (compressor ``none``, no trace, no evaluation
but the last) for every (workload, workers, threads) in one run, the configurations interleaved
round by round so a load change on a shared machine touches them alike; prints one JSON line per
configuration: seconds per iteration (median of the rounds), iterations/s and worker passes/s
(workers × iterations/s), with the CPU, torch version and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch

from convergence import RunConfig, train
from machine import host_identity


def _flags() -> str:
    """This CPU's widest x86 vector extension in words (:func:`machine.host_identity`)."""
    flags = host_identity()["flags"]
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"


def seconds_per_iteration(workload: str, width: float, workers: int, iterations: int) -> float:
    """Wall seconds per training iteration of ``workers`` simulated workers (``none``; the first,
    slower iteration — buckets, allocator — is excluded)."""
    config = RunConfig(workload, workers=workers, iterations=iterations + 1, eval_every=iterations + 1, width=width,
                       eval_samples=8)
    stamps: list[float] = []
    for _ in train(config, "none", 1.0, progress=lambda i, loss: stamps.append(time.perf_counter())):
        pass
    return (stamps[-1] - stamps[0]) / iterations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--workloads", default="resnet20:0.5,lstm:1", help="workload:width list")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--iterations", type=int, default=6, help="timed iterations per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    configs = [(name, float(width), int(w), int(t)) for name, width in (x.split(":") for x in args.workloads.split(","))
               for w in args.workers.split(",") for t in args.threads.split(",")]
    times: dict[tuple, list[float]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for config in configs:
            name, width, workers, threads = config
            torch.set_num_threads(threads)
            times[config].append(seconds_per_iteration(name, width, workers, args.iterations))
    for config in configs:
        name, width, workers, threads = config
        seconds = statistics.median(times[config])
        record: dict[str, Any] = {
            "bench": "converge", "workload": name, "width": width, "workers": workers, "threads": threads,
            "s_per_iteration": seconds, "iterations_per_s": 1 / seconds, "worker_passes_per_s": workers / seconds,
            "rounds": times[config], "cpu": host_identity()["cpu"], "flags": _flags(), "torch": torch.__version__,
            "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        print(json.dumps(record, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
