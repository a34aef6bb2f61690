"""The simulator's projection of an emulated scenario, from the trace recorded in the same run.

- Compute (seconds): the trace's forward, per-layer backward and optimizer times, rescaled
  from the mean to the median over the recorded passes (one pass disturbed by another
  tenant of the machine must not move the estimate).
- Compute variability: the coefficient of variation of the recorded passes' forward +
  backward time becomes the simulator's per-worker ``jitter``; the projection is the mean
  over :data:`JITTER_SEEDS` seeded draws. With ``p`` workers an iteration waits for the
  slowest, so variability lengthens it (≈ +0.56σ at p = 2, +1.03σ at p = 4).
- Compression costs and wire sizes: the trace's gradients replayed through the compressor
  (:func:`traces.replay.replay`, error feedback, one thread as in the workers; the first
  recorded iteration is a warm-up and its rows are dropped).
- Network: the emulated link rate (bits/s), no added latency, and optionally a
  :class:`simulator.Calibration` (α per message step, efficiency × bandwidth).
- Buckets: what DDP uses in steady state, buckets of ``bucket_cap_mb`` in backward order
  (after its first iteration DDP no longer caps the first bucket at 1 MiB).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

import torch

import simulator
import traces
from traces.replay import replay

LINK_LATENCY_S = 0.0  # the emulated links add no delay (no netem); α comes from calibration
JITTER_SEEDS = 16


def compression_profile(trace: traces.Trace, compressor_names: Sequence[str], density: float) -> simulator.CompressionProfile | None:
    """Replay ``trace`` through the sparse compressors at ``density`` on one CPU thread and fit
    their costs, leaving out the first (cold) iteration; ``None`` when only ``none`` is asked."""
    names = [n for n in compressor_names if n != "none"]
    if not names:
        return None
    if len(trace.iterations) < 2:
        raise ValueError(f"{trace}: need at least 2 recorded iterations (the first is a warm-up)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [r for r in replay(trace, names, [density], error_feedback=True) if r["iteration"] != trace.iterations[0]]
    finally:
        torch.set_num_threads(threads)
    return simulator.CompressionProfile.from_replay_rows(rows, source=f"replay of {trace}, warm, 1 thread")


def compute_model(trace: traces.Trace) -> tuple[simulator.Workload, float]:
    """The trace's workload with median compute times, and the passes' coefficient of variation."""
    workload = simulator.workload_from_trace(trace)
    passes = trace.timings.get("per_pass") or []
    forward = [float(p["forward_s"]) for p in passes]
    backward = [float(p["backward_s"]) for p in passes]
    if len(passes) < 2 or not statistics.fmean(forward) > 0 or not statistics.fmean(backward) > 0:
        return workload, 0.0
    forward_scale = statistics.median(forward) / statistics.fmean(forward)
    backward_scale = statistics.median(backward) / statistics.fmean(backward)
    layers = tuple(layer._replace(backward_s=layer.backward_s * backward_scale) for layer in workload.layers)
    totals = [f + b for f, b in zip(forward, backward)]
    jitter = statistics.pstdev(totals) / statistics.fmean(totals)
    return dataclasses.replace(workload, layers=layers, forward_s=workload.forward_s * forward_scale), jitter


def _mean_over_seeds(scenario: simulator.Scenario) -> dict[str, Any]:
    if scenario.jitter == 0:
        return simulator.simulate(scenario)
    runs = [simulator.simulate(dataclasses.replace(scenario, seed=seed)) for seed in range(JITTER_SEEDS)]
    return {
        key: statistics.fmean(run[key] for run in runs) if isinstance(value, float) else value
        for key, value in runs[0].items()
    }


def project(
    trace_path: str,
    workers: int,
    bandwidth_bps: float,
    compressor_names: Sequence[str],
    density: float,
    *,
    calibration: simulator.Calibration | None = None,
    bucket_cap_mb: float = 25.0,
) -> dict[str, dict[str, Any]]:
    """Project the iteration of each compressor; returns ``{compressor: simulate() result}``
    (float fields averaged over the jitter seeds; ``jitter`` added)."""
    trace = traces.open(trace_path)
    workload, jitter = compute_model(trace)
    profile = compression_profile(trace, compressor_names, density)
    cap = int(bucket_cap_mb * 1024 * 1024)
    results = {}
    for name in compressor_names:
        scenario = simulator.Scenario(
            workload,
            workers,
            bandwidth_bps,
            LINK_LATENCY_S,
            compressor=name,
            density=None if name == "none" else density,
            profile=None if name == "none" else profile,
            calibration=calibration,
            bucket_mode="ddp",
            bucket_cap_bytes=cap,
            first_bucket_bytes=cap,
            jitter=jitter,
        )
        results[name] = {**_mean_over_seeds(scenario), "jitter": jitter}
    return results
