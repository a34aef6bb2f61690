"""Emulated DDP training: one real gloo process per namespace, one run per compressor.

:func:`run_training` builds the network once for a (workers, bandwidth) pair and
:func:`run_compressors` runs :mod:`emulation.worker` for every compressor in it (fresh processes
each time; :mod:`emulation.sites` runs it in the network of two sites), returning
per compressor the measured iteration time — the mean over the timed iterations of each
rank, averaged over ranks: the expected time, which a time to accuracy adds up (a median
would pick one of the two speeds of gloo's 2-rank all-gather, a coin toss per call, whichever
came up more often) — with the per-phase means and the per-bucket communication
log (medians). Every run also records a compute-only trace on rank 0 from iterations interleaved
with the timed ones (see :mod:`emulation.worker`), so the projection of that run uses
compute times sampled beside the measurement, under the same background load.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import compressors
import traces.workloads
from emulation.launch import run_workers
from emulation.network import shaped_links
from units import check_density
from emulation.plan import NetworkPlan

SECONDS_PER_ITERATION_GUESS = 2.0  # generous per-iteration compute bound on a busy 2-core machine (s)


def check_request(workload: str, names: Sequence[str], density: float, iterations: int, warmup: int, batch_size: int) -> None:
    """Raise ``ValueError`` naming the first bad argument of a training emulation."""
    if workload not in traces.workloads.NAMES:
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(traces.workloads.NAMES)}")
    compressors.check_names(names)
    if not names:
        raise ValueError("give at least one compressor")
    check_density(density)
    if iterations < 1 or warmup < 0 or batch_size < 1:
        raise ValueError("iterations and batch size must be >= 1, warm-up >= 0")


def _timeout_s(workers: int, bandwidth_bps: float | None, rounds: int, model_bytes: int) -> float:
    contention = max(1.0, workers / (os.cpu_count() or 1))
    comm = 0.0 if bandwidth_bps is None else 2.0 * model_bytes * 8.0 / bandwidth_bps
    return 120.0 + rounds * (SECONDS_PER_ITERATION_GUESS * contention + 3.0 * comm)


def summarize(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the workers' JSON results of one run into means (seconds) and bucket stats;
    ``compute_passes[r]`` are rank ``r``'s timed compute-only passes (``forward_s``,
    ``backward_s``, ``broadcast_s``, s; empty without ``--record-dir``), for the projection's
    compute model. ``phases_s``: the timed iterations' phases, ``broadcast_s`` (DDP's buffer
    broadcast) a part of ``forward_s``."""
    means = {
        key: statistics.fmean(statistics.fmean(step[key] for step in rank["steps"]) for rank in per_rank)
        for key in ("iteration_s", "forward_s", "backward_s", "optimizer_s", "broadcast_s")
    }
    buckets = [b for rank in per_rank for b in rank["buckets"]]
    by_bucket: dict[int, list[dict[str, Any]]] = {}
    for entry in buckets:
        by_bucket.setdefault(int(entry["bucket"]), []).append(entry)
    return {
        "measured_s": means["iteration_s"],
        "compute_passes": [rank.get("compute_passes") or [] for rank in per_rank],
        "phases_s": means,
        "per_rank_iteration_s": [statistics.fmean(s["iteration_s"] for s in rank["steps"]) for rank in per_rank],
        "buckets": [
            {
                "bucket": index,
                "path": entries[0]["path"],
                "numel": int(entries[0]["numel"]),
                "comm_s": statistics.median(e["comm_s"] for e in entries),
                "compress_s": statistics.median(e["compress_s"] for e in entries),
                "bytes_sent": statistics.median(e["bytes_sent"] for e in entries),
                "payload_bytes": statistics.median(e["payload_bytes"] for e in entries),
            }
            for index, entries in sorted(by_bucket.items())
        ],
    }


def run_training(
    workers: int,
    bandwidth_bps: float | None,
    workload: str,
    compressor_names: Sequence[str],
    density: float,
    *,
    iterations: int,
    warmup: int,
    batch_size: int,
    trace_dir: Path,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Run ``workload`` on ``workers`` ranks over links of ``bandwidth_bps`` bits/s (``None``:
    loopback, unshaped) once per compressor; each run records its compute trace into
    ``trace_dir/<compressor>``.

    Returns one dict per compressor: ``compressor``, ``trace`` (its path), ``measured_s`` (s),
    ``compute_passes``, ``phases_s``, ``per_rank_iteration_s``, ``buckets`` (see :func:`summarize`).
    """
    check_request(workload, compressor_names, density, iterations, warmup, batch_size)
    model_bytes = sum(p.numel() * 4 for p in traces.workloads.build(workload).model.parameters())
    timeout = _timeout_s(workers, bandwidth_bps, warmup + 2 * iterations, model_bytes)

    with shaped_links(workers, bandwidth_bps) as plan:
        return run_compressors(plan, workers, workload, compressor_names, density, iterations=iterations,
                               warmup=warmup, batch_size=batch_size, trace_dir=trace_dir, seed=seed, timeout_s=timeout)


def run_compressors(
    plan: NetworkPlan | None,
    workers: int,
    workload: str,
    compressor_names: Sequence[str],
    density: float,
    *,
    iterations: int,
    warmup: int,
    batch_size: int,
    trace_dir: Path,
    seed: int,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Run :mod:`emulation.worker` on ``workers`` ranks in ``plan``'s network (``None``: loopback)
    once per compressor, fresh processes each, every run recording its compute trace into
    ``trace_dir/<compressor>``; each run must end within ``timeout_s`` seconds. Returns one dict
    per compressor: ``compressor``, ``trace`` (its path) and :func:`summarize`'s fields."""
    base = [
        "--workload", workload, "--density", str(density), "--iterations", str(iterations),
        "--warmup", str(warmup), "--batch-size", str(batch_size), "--seed", str(seed),
    ]
    results = []
    for name in compressor_names:
        trace = Path(trace_dir) / name
        args = [*base, "--compressor", name, "--record-dir", str(trace)]
        per_rank = run_workers("emulation.worker", args, workers, plan, timeout_s)
        results.append({"compressor": name, "trace": str(trace), **summarize(per_rank)})
    return results
