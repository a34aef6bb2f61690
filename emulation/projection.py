"""The simulator's projection of an emulated scenario, from the trace recorded in the same run.

Compute times (forward, per-layer backward, optimizer; seconds) come from the trace's
timings, compression costs and wire sizes from replaying its gradients through the
compressors (:func:`traces.replay.replay` with error feedback, one thread as in the workers;
the first recorded iteration is a warm-up and its rows are dropped), the network from the
emulated link rate (bits/s), and optionally a :class:`simulator.Calibration`. The bucket
layout mirrors what DDP uses in steady state: buckets of ``bucket_cap_mb`` in backward
order (after its first iteration DDP no longer caps the first bucket at 1 MiB).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import simulator
import traces
from traces.replay import replay

LINK_LATENCY_S = 0.0  # the emulated links add no delay (no netem); α comes from calibration


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
    """Project the iteration of each compressor; returns ``{compressor: simulate() result}``."""
    trace = traces.open(trace_path)
    workload = simulator.workload_from_trace(trace)
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
        )
        results[name] = simulator.simulate(scenario)
    return results
