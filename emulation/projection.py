"""The simulator's projection of an emulated scenario, from the trace recorded in the same run.

Compute times (forward, per-layer backward, optimizer; seconds) come from the trace's
timings, compression costs and wire sizes from replaying its gradients through the
compressors (:meth:`simulator.CompressionProfile.from_trace`), the network from the
emulated link rate (bits/s), and optionally a :class:`simulator.Calibration`. The bucket
layout mirrors what DDP uses in steady state: buckets of ``bucket_cap_mb`` in backward
order (after its first iteration DDP no longer caps the first bucket at 1 MiB).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import simulator
import traces

LINK_LATENCY_S = 0.0  # the emulated links add no delay (no netem); α comes from calibration


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
    profile = simulator.CompressionProfile.from_trace(
        trace, list(compressor_names), [density], iterations=len(trace.iterations)
    )
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
