"""The simulator's projection of an emulated scenario, from the trace recorded in the same run.

- Compute (seconds): the trace's forward, per-layer backward and optimizer times, rescaled
  from the mean to the median over the recorded passes (one pass disturbed by another
  tenant of the machine must not move the estimate). When every rank's compute-only passes
  are timed (``rank_passes``, :mod:`emulation.worker`), the median is taken over all ranks'
  passes: ``p`` times the samples, and not only rank 0's share of the cores.
- Compute variability: the simulator's per-worker ``jitter`` (coefficient of variation of
  a worker's forward + backward time); the projection is the mean over
  :data:`JITTER_SEEDS` seeded draws. With ``p`` workers an iteration waits for the slowest,
  so variability lengthens it (≈ +0.56σ at p = 2, +1.03σ at p = 4). Only variation that
  differs between workers makes one wait for another: a slowdown every rank sees in the
  same pass (background load, ranks sharing cores in lock-step) lengthens the compute of
  all of them alike, and is already in the median compute time. With ``rank_passes``,
  :func:`independent_jitter` measures that part alone; otherwise the recorded passes'
  pass-to-pass variation is used.
- Compression costs and wire sizes: a :class:`simulator.CompressionProfile` the caller
  passes (the orchestration layer replays the run's trace on one thread, as in the
  workers, and asks the one compression-profile policy for its costs).
- Network: the emulated link rate (bits/s), no added latency (a site's links; the WAN between
  two sites of one rank each gives its latency per dependent step, :mod:`emulation.sites`), and
  optionally a :class:`simulator.Calibration` (α per message step, added to the latency,
  efficiency × bandwidth; all-reduces and all-gathers each with their own fit when it has one).
- Buckets: what DDP uses in steady state (:mod:`compressors.ddp.buckets`): the workers
  build ``DistributedDataParallel(bucket_cap_mb=...)``, which caps every bucket, the first
  included, at ``bucket_cap_mb`` MiB.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import simulator
import traces
from compressors.ddp.buckets import bucket_caps

LINK_LATENCY_S = 0.0  # the emulated links add no delay (no netem); α comes from calibration
JITTER_SEEDS = 16


def compute_model(
    trace: traces.Trace, rank_passes: Sequence[Sequence[Mapping[str, float]]] | None = None
) -> tuple[simulator.Workload, float]:
    """The trace's workload with median compute times (s), and the per-worker jitter (CV).

    Without ``rank_passes`` (or with fewer than 2 ranks' passes) both come from the trace's
    recorded passes: medians of its forward and backward times, pass-to-pass CV. With
    ``rank_passes[r][k]`` (rank ``r``'s ``forward_s``/``backward_s`` of compute-only pass
    ``k``, s) the medians are over every rank's passes and the jitter is
    :func:`independent_jitter`.
    """
    workload = simulator.workload_from_trace(trace)
    recorded = trace.timings.get("per_pass") or []
    ranks = [list(r) for r in rank_passes or () if r]
    pooled = len(ranks) >= 2
    passes = [q for r in ranks for q in r] if pooled else recorded
    forward = [float(q["forward_s"]) for q in recorded]
    backward = [float(q["backward_s"]) for q in recorded]
    if len(passes) < 2 or not statistics.fmean(forward or [0.0]) > 0 or not statistics.fmean(backward or [0.0]) > 0:
        return workload, 0.0
    forward_scale = statistics.median(float(q["forward_s"]) for q in passes) / statistics.fmean(forward)
    backward_scale = statistics.median(float(q["backward_s"]) for q in passes) / statistics.fmean(backward)
    layers = tuple(layer._replace(backward_s=layer.backward_s * backward_scale) for layer in workload.layers)
    if pooled:
        jitter = independent_jitter(ranks) or 0.0
    else:
        totals = [f + b for f, b in zip(forward, backward)]
        jitter = statistics.pstdev(totals) / statistics.fmean(totals)
    return dataclasses.replace(workload, layers=layers, forward_s=workload.forward_s * forward_scale), jitter


def independent_jitter(per_rank_passes: Sequence[Sequence[Mapping[str, float]]]) -> float | None:
    """The per-worker compute variation that is not common to all ranks (dimensionless CV).

    ``per_rank_passes[r][k]`` holds rank ``r``'s ``forward_s`` and ``backward_s`` (s) of the
    ``k``-th compute-only pass (all ranks run pass ``k`` at the same time). Each rank's
    forward + backward time ``t[r, k]`` is compared with the mean over ranks of the same pass,
    ``d[r, k] = t[r, k] − mean_r t[r, k]``, which removes what every rank saw in that pass.
    For ``p`` independent workers ``var(d) = σ²·(p − 1)/p``, so the result is
    ``sqrt(mean(d²)·p/(p − 1)) / mean(t)``. A persistent difference between ranks stays in
    (it makes the others wait just the same).

    Returns ``None`` with fewer than 2 ranks or no pass that every rank timed.
    """
    ranks = len(per_rank_passes)
    passes = min((len(r) for r in per_rank_passes), default=0)
    if ranks < 2 or passes == 0:
        return None
    totals = [[float(r[k]["forward_s"]) + float(r[k]["backward_s"]) for r in per_rank_passes] for k in range(passes)]
    mean = statistics.fmean(t for per_pass in totals for t in per_pass)
    if not mean > 0:
        return None
    squares = [(t - statistics.fmean(per_pass)) ** 2 for per_pass in totals for t in per_pass]
    return math.sqrt(statistics.fmean(squares) * ranks / (ranks - 1)) / mean


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
    profile: simulator.CompressionProfile | None = None,
    calibration: simulator.Calibration | None = None,
    fidelity: str = "analytic",
    bucket_cap_mb: float = 25.0,
    rank_passes: Sequence[Sequence[Mapping[str, float]]] | None = None,
    latency_s: float = LINK_LATENCY_S,
) -> dict[str, dict[str, Any]]:
    """Project the iteration of each compressor; returns ``{compressor: simulate() result}``
    (float fields averaged over the jitter seeds; ``jitter`` added).

    ``profile``: the compression costs of the sparse compressors at ``density`` (needed
    unless only ``none`` is projected); ``rank_passes``: every rank's timed compute-only
    passes (see :func:`compute_model`); ``None`` uses only the trace's recorded passes.
    ``fidelity``: ``analytic`` (closed-form collectives) or ``des`` (SimPy compute streams,
    link-level messages). ``latency_s``: the link's latency per dependent message step (s), to
    which a calibration adds its α.
    """
    trace = traces.open(trace_path)
    workload, jitter = compute_model(trace, rank_passes)
    first, cap = bucket_caps(bucket_cap_mb)
    results = {}
    for name in compressor_names:
        scenario = simulator.Scenario(
            workload,
            workers,
            bandwidth_bps,
            latency_s,
            compressor=name,
            density=None if name == "none" else density,
            profile=None if name == "none" else profile,
            calibration=calibration,
            fidelity=fidelity,
            bucket_mode="ddp",
            bucket_cap_bytes=cap,
            first_bucket_bytes=first,
            jitter=jitter,
        )
        results[name] = {**_mean_over_seeds(scenario), "jitter": jitter}
    return results


def network_share(projected: Mapping[str, Any]) -> float:
    """The network share of a projected iteration (a :func:`simulator.simulate` result):
    transfer time, exposed and hidden behind backward (``comm_s``, s per worker), ÷ iteration
    time (``iteration_s``, s); dimensionless, 0..1."""
    return float(projected["comm_s"]) / float(projected["iteration_s"]) if projected["iteration_s"] > 0 else 0.0
