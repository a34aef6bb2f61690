"""One training iteration: what every bucket costs, and the closed-form (analytic) schedule.

DDP semantics (docs/model.md): buckets in backward order; a bucket's collective starts
when every worker has produced (and, with ``compress_on="compute"``, compressed) it and
the previous collective has finished; collectives run one at a time on one
communication stream; each worker decompresses after its collective; the optimizer
waits for everything. :func:`prepare` turns a :class:`~simulator.scenario.Scenario`
into per-bucket arrays shared by both fidelities; :func:`run_analytic` schedules them
with closed-form collective times; :mod:`simulator.des` runs the same with link-level
messages. :func:`summarize` turns a :class:`Record` into the output fields.

Every compressor is scheduled from the kind of message it sends:

- sparse (Top-k, DGC, SIDCo, ...): compress, all-gather the selections (padded: counts first),
  decompress every worker's message;
- block-quantized (``int8``, ``fp8``, ``int4``): the same with no counts (every rank's message has
  the size its bucket sets: :func:`compressors.messages.wire.counts_first`);
- dense 16-bit (``fp16``, ``bf16``): cast, all-reduce half the bytes of fp32, cast back;
- low-rank (``powersgd``), per bucket: ``P = M·Q`` on the compute stream (half the profiled
  compression time), all-reduce of the uncompressed rest and of P, then the orthogonalisation and
  ``Q = Mᵀ·P`` (the other half, a gap in the communication stream that delays Q's all-reduce),
  all-reduce of Q, then ``P·Qᵀ``. P and Q sizes follow the layer shapes and the scenario's
  ``rank``; the compute times come from the profile (measured at the rank it was replayed with).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from compressors.rules import plan
from compressors.messages.wire import allreduce_bytes, counts_first
from simulator import topologies
from simulator.interference import advance
from simulator.links import Level
from simulator.scenario import Scenario
from simulator.topologies import Phase, Topology
from simulator.workload import Bucket, Workload

MIN_COMPRESSION_RATE = 2.0
"""PowerSGD compresses a matrix only when that shrinks it at least this much (PyTorch's default)."""


@dataclass
class Prepared:
    """Per-bucket inputs of one scenario; arrays are per worker (seconds, bytes)."""

    scenario: Scenario
    workers: int
    scale: np.ndarray
    backward_s: np.ndarray
    compress_s: np.ndarray
    decompress_s: np.ndarray
    wire_bytes: np.ndarray
    phases: list[list[Phase]]
    op_name: str
    flat: Level
    intra: Level
    extra_ranks: int = 0
    sites: int = 1
    wan: Level | None = None


@dataclass
class Record:
    """When things happened (s) on every worker, per bucket ``[bucket, worker]``."""

    forward_end: np.ndarray
    backward_end: np.ndarray
    ready: np.ndarray
    comm_start: np.ndarray
    compress_end: np.ndarray
    transfer_start: np.ndarray
    transfer_end: np.ndarray
    decompress_end: np.ndarray


def worker_scales(sc: Scenario) -> np.ndarray:
    """Per-worker compute-time multipliers: lognormal jitter (mean 1, CV ``jitter``) and stragglers."""
    p = sc.workers
    scale = np.ones(p)
    if sc.jitter == 0 and sc.stragglers == 0:
        return scale
    rng = np.random.default_rng(sc.seed)
    if sc.jitter > 0:
        sigma = np.sqrt(np.log1p(sc.jitter**2))
        scale = np.exp(sigma * rng.standard_normal(p) - sigma**2 / 2)
    if sc.stragglers:
        scale[rng.choice(p, sc.stragglers, replace=False)] *= sc.straggler_slowdown
    return scale


def _levels(sc: Scenario, op: str | None = None, ranks: int | None = None) -> tuple[Level, Level]:
    """The flat and intra-node link levels; the flat one with the calibration of ``op``
    (``allreduce``, ``allgather``, ``ps``; ``None``: the pooled fit) on ``ranks`` nodes (default
    ``sc.nodes``: a collective over every node) applied."""
    bandwidth, latency = sc.bandwidth_bps, sc.latency_s
    if sc.calibration is not None:
        bandwidth = sc.calibration.bandwidth(bandwidth, op, ranks or sc.nodes)
        latency = sc.calibration.latency(latency, op, ranks or sc.nodes)
    flat = Level(bandwidth / 8.0 / sc.oversubscription, latency)
    return flat, Level(sc.intra_bandwidth_bps / 8.0, sc.intra_latency_s)


def wan_level(sc: Scenario) -> Level | None:
    """The WAN between ``sc``'s sites: bytes/s per site and direction, one-way delay (half the
    round trip, s); ``None`` with one site."""
    if sc.sites <= 1:
        return None
    return Level(sc.wan_bandwidth_bps / 8.0, sc.wan_rtt_s / 2.0)


def topology(sc: Scenario) -> Topology:
    """The topology of ``sc`` (:mod:`simulator.topologies`) on its nodes, GPUs, servers and intra-node
    links; across its sites (:class:`simulator.topologies.Sites`) when it has more than one."""
    if sc.sites > 1:
        return topologies.Sites(sc.nodes, sites=sc.sites, wan=wan_level(sc), gpus=sc.gpus_per_node,
                                intra=_levels(sc)[1], inside=sc.topology)
    return topologies.get(sc.topology)(sc.nodes, gpus=sc.gpus_per_node, servers=sc.ps_servers, intra=_levels(sc)[1])


def lowrank_elements(workload: Workload, bucket: Bucket, rank: int) -> tuple[int, int, int]:
    """Elements PowerSGD sends for ``bucket`` at ``rank``: ``(rest, P, Q)``, with PyTorch's rule of
    which layers are compressed (:func:`compressors.powersgd.plan`); layers without a shape are 1-D."""
    layers = [workload.layers[i] for i in bucket.layers]
    shapes = [layer.shape if layer.shape is not None else (layer.nbytes // workload.itemsize,) for layer in layers]
    blocks, rest, _ = plan(shapes, bucket.numel, rank, MIN_COMPRESSION_RATE)
    return (sum(n for _, n in rest), sum(b.rows * b.rank for b in blocks), sum(b.cols * b.rank for b in blocks))


def _lowrank_phases(sc: Scenario, topo: Topology, elements: tuple[int, int, int], middle_s: float,
                    flat: Level) -> list[Phase]:
    """PowerSGD's collectives for one bucket, in PyTorch's order: all-reduce of the uncompressed
    rest (when there is one), of P, then, after ``middle_s`` of compute, of Q."""
    rest, p_elements, q_elements = (n * sc.workload.itemsize for n in elements)
    phases = [topo.dense_phase(float(rest), flat)] if rest else []
    phases.append(topo.dense_phase(float(p_elements), flat))
    q_phase = topo.dense_phase(float(q_elements), flat)
    phases.append(replace(q_phase, gap_s=middle_s))
    return phases


def prepare(sc: Scenario) -> Prepared:
    """Per-bucket compute, compression and communication of ``sc`` (both fidelities use it)."""
    wl = sc.workload
    buckets = wl.buckets(sc.bucket_mode, sc.bucket_cap_bytes, sc.first_bucket_bytes)
    p, g = sc.workers, sc.gpus_per_node
    topo = topology(sc)
    flat, intra = _levels(sc)
    dense_flat = _levels(sc, topo.calibration_op("allreduce"))[0]
    sparse_flat = _levels(sc, topo.calibration_op("allgather"))[0]
    n_b = len(buckets)
    comp = np.zeros((n_b, p))
    decomp = np.zeros((n_b, p))
    wire = np.zeros((n_b, p))
    phases: list[list[Phase]] = []
    cost = sc.profile.cost(sc.compressor, sc.density) if sc.compressor != "none" else None
    for b, bucket in enumerate(buckets):
        dense = float(bucket.nbytes)
        if cost is None:
            wire[b] = dense
            phases.append([topo.dense_phase(dense, dense_flat)])
            continue
        shard = bucket.numel / g
        comp[b] = cost.compress_s(shard)
        wire[b] = cost.wire_bytes(shard, p)
        if sc.message == "lowrank":
            elements = lowrank_elements(wl, bucket, sc.rank)
            comp[b] = cost.compress_s(shard) / 2
            wire[b] = sum(elements) * wl.itemsize
            decomp[b] = cost.decompress_s(bucket.numel)
            phases.append(_lowrank_phases(sc, topo, elements, cost.compress_s(shard) / 2, dense_flat))
        elif not sc.sparse:
            fixed = allreduce_bytes(sc.compressor, round(shard), sc.density, wl.itemsize, sc.compressor_options)
            if fixed is not None:
                wire[b] = fixed
            decomp[b] = cost.decompress_s(bucket.numel)
            phases.append([topo.dense_phase(float(wire[b].mean()), dense_flat)])
        else:
            decomp[b] = topo.sparse_decompress_s(cost.decompress_s, bucket.numel, shard)
            counts = counts_first(sc.compressor)
            phases.append(topo.sparse_phases(dense, wire[b], sparse_flat, sc.padded, counts))
    if cost is None:
        op = topo.dense_label
    elif sc.message == "lowrank":
        op = "all-reduce (P, Q)"
    elif sc.message == "dense":
        op = "all-reduce (16-bit)"
    elif not sc.sparse:
        op = "all-reduce (values)"
    else:
        op = topo.sparse_label
    return Prepared(
        sc, p, worker_scales(sc), np.array([bk.backward_s for bk in buckets]), comp, decomp, wire, phases, op,
        flat, intra, extra_ranks=topo.extra_ranks, sites=sc.sites, wan=wan_level(sc),
    )


def run_analytic(prep: Prepared) -> Record:
    """Schedule the iteration with closed-form collective times (all workers start together)."""
    sc, scale = prep.scenario, prep.scale
    n_b, p = prep.compress_s.shape
    on_compute = sc.compress_on == "compute"
    fwd_end = sc.workload.forward_s * scale
    bwd_end = np.empty((n_b, p))
    ready = np.empty((n_b, p))
    start = np.empty((n_b, p))
    comp_end = np.empty((n_b, p))
    xfer_start = np.empty((n_b, p))
    xfer_end = np.empty((n_b, p))
    dec_end = np.empty((n_b, p))
    free = np.zeros(p)
    intervals: list[tuple[np.ndarray, np.ndarray]] = []
    t = fwd_end
    for b in range(n_b):
        bwd_end[b] = advance(t, prep.backward_s[b] * scale, intervals, sc.interference)
        ready[b] = advance(bwd_end[b], prep.compress_s[b], intervals, sc.interference) if on_compute else bwd_end[b]
        t = ready[b]
        begin = np.maximum(ready[b], free)
        comp_end[b] = begin if on_compute else begin + prep.compress_s[b]
        t0 = comp_end[b].max()
        start[b] = begin
        xfer_start[b] = t0
        xfer_end[b] = t0 + sum(ph.gap_s + ph.analytic_s for ph in prep.phases[b])
        dec_end[b] = xfer_end[b] + prep.decompress_s[b]
        free = np.full(p, dec_end[b].max())
        if sc.interference:
            intervals.append((xfer_start[b], xfer_end[b]))
    return Record(fwd_end, bwd_end, ready, start, comp_end, xfer_start, xfer_end, dec_end)


def _exposed(start: np.ndarray, end: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Per worker, total length (s) of the intervals [start, end] that lie after ``after``."""
    return np.maximum(end - np.maximum(start, after), 0.0).sum(axis=0)


def _clean(residual: float, scale: float) -> float:
    """A residual time (s) with float rounding noise (< 1e-9 of ``scale``) set to 0."""
    return residual if residual > 1e-9 * scale else 0.0


def summarize(prep: Prepared, rec: Record) -> dict[str, Any]:
    """The output fields of one scenario (see the README): seconds, samples/s, bytes."""
    sc, scale = prep.scenario, prep.scale
    on_compute = sc.compress_on == "compute"
    compute_end = rec.ready[-1] if on_compute else rec.backward_end[-1]
    comm_end = rec.decompress_end.max(axis=0)
    opt = sc.workload.optimizer_s * scale
    end = np.maximum(compute_end, comm_end) + opt
    iteration = float(end.max())
    p = prep.workers
    compress_sum = float(prep.compress_s.sum())
    if on_compute:
        compress_exposed = compress_sum
    else:
        compress_exposed = float(_exposed(rec.comm_start, rec.compress_end, compute_end).sum())
    decompress = float(_exposed(rec.transfer_end, rec.decompress_end, compute_end).sum())
    compress = (compress_exposed + decompress) / p
    exposed = float(_exposed(rec.transfer_start, rec.transfer_end, compute_end).sum()) / p
    scale_mean = float(scale.sum()) / p
    forward = sc.workload.forward_s * scale_mean
    backward = float(prep.backward_s.sum()) * scale_mean
    optimizer = sc.workload.optimizer_s * scale_mean
    return {
        "iteration_s": iteration,
        "samples_per_s": sc.workload.batch_size * p / iteration if iteration > 0 else float("inf"),
        "forward_s": forward,
        "backward_s": backward,
        "compress_s": compress,
        "exposed_comm_s": exposed,
        "idle_s": _clean(iteration - forward - backward - optimizer - compress - exposed, iteration),
        "optimizer_s": optimizer,
        "comm_s": float((rec.transfer_end - rec.transfer_start).sum()) / p,
        "compress_total_s": compress_sum / p,
        "decompress_total_s": float(prep.decompress_s.sum()) / p,
        "wire_bytes": float(prep.wire_bytes.sum()) / p,
        "dense_bytes": float(sc.workload.nbytes),
        "buckets": int(len(prep.backward_s)),
        "workers": int(prep.workers),
    }
