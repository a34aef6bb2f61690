"""What one worker computes per iteration, and how DDP groups its gradients into buckets."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from compressors.ddp.buckets import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES, assign
from costs import compute_from_flops, optimizer_from_bandwidth

BUCKET_MODES = ("ddp", "single", "layer")


class Layer(NamedTuple):
    """One parameter tensor: ``name``, gradient size ``nbytes`` (bytes), ``backward_s`` (s), and its
    ``shape`` when known (PowerSGD compresses ≥ 2-D tensors as matrices; ``None`` counts as 1-D)."""

    name: str
    nbytes: int
    backward_s: float
    shape: tuple[int, ...] | None = None


class Bucket(NamedTuple):
    """A group of consecutive layers in backward (reverse parameter) order.

    ``layers``: indices into :attr:`Workload.layers`; ``nbytes``/``numel``: the bucket's
    gradient size; ``backward_s``: backward compute (s) from the previous bucket's last
    layer to this bucket's last layer.
    """

    layers: tuple[int, ...]
    nbytes: int
    numel: int
    backward_s: float


@dataclass(frozen=True)
class Workload:
    """Per-worker compute of one iteration.

    ``layers`` in parameter order (backward produces them in reverse); ``forward_s``,
    ``optimizer_s`` in seconds; ``batch_size`` samples per worker; ``itemsize`` bytes per
    gradient element (4 = fp32); ``compute_cv``: the measured coefficient of variation of a
    worker's forward + backward time across recorded passes (0 when unknown).
    """

    layers: tuple[Layer, ...]
    forward_s: float
    optimizer_s: float
    batch_size: int
    itemsize: int = 4
    name: str = ""
    compute_cv: float = 0.0
    _buckets: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("workload has no layers")
        if self.batch_size < 1:
            raise ValueError(f"workload batch_size must be >= 1, got {self.batch_size}")
        bad = [layer.name for layer in self.layers if layer.nbytes < 0 or not layer.backward_s >= 0]
        if bad or not self.forward_s >= 0 or not self.optimizer_s >= 0:
            raise ValueError(f"workload times and sizes must be >= 0 (layers {bad[:3]})")

    @property
    def nbytes(self) -> int:
        """Total gradient bytes of one worker."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def backward_s(self) -> float:
        """Total backward compute time (s)."""
        return sum(layer.backward_s for layer in self.layers)

    def buckets(
        self,
        mode: str = "ddp",
        cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
        first_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
    ) -> list[Bucket]:
        """Group the layers in backward order (memoised per arguments; treat the list as read-only).

        ``ddp``: PyTorch DDP's rule (:func:`compressors.ddp.buckets.assign`): fill in reverse
        parameter order and close a bucket once it holds ≥ ``first_bytes`` (the first) or
        ≥ ``cap_bytes`` (the others), caps in bytes;
        ``single``: one bucket for the whole model (the SIDCo paper's harness);
        ``layer``: one bucket per layer (wait-free backprop).
        """
        key = (mode, cap_bytes, first_bytes)
        if key in self._buckets:
            return self._buckets[key]
        if mode not in BUCKET_MODES:
            raise ValueError(f"unknown bucket mode {mode!r}; choose from {', '.join(BUCKET_MODES)}")
        if cap_bytes <= 0 or first_bytes <= 0:
            raise ValueError("bucket caps must be > 0 bytes")
        order = list(range(len(self.layers) - 1, -1, -1))
        if mode == "single":
            groups = [order]
        elif mode == "layer":
            groups = [[i] for i in order]
        else:
            groups = assign([layer.nbytes for layer in self.layers], cap_bytes=cap_bytes, first_bytes=first_bytes)
        result = []
        for group in groups:
            nbytes = sum(self.layers[i].nbytes for i in group)
            result.append(
                Bucket(tuple(group), nbytes, nbytes // self.itemsize, sum(self.layers[i].backward_s for i in group))
            )
        self._buckets[key] = result
        return result


def workload_from_trace(trace: Any) -> Workload:
    """Build a :class:`Workload` from an opened trace (or a trace directory path).

    Uses ``trace.timings``: ``forward_s`` (a total or per-layer list, s), ``backward_s``
    (per layer, s), ``optimizer_s`` (s), ``batch_size``, and ``per_pass`` (forward and
    backward totals per recorded iteration and worker) for ``compute_cv``. Gradients are fp32.
    """
    import traces

    if isinstance(trace, (str, os.PathLike)):
        trace = traces.open(trace)
    timings = trace.timings
    forward = timings["forward_s"]
    forward_s = float(sum(forward)) if isinstance(forward, Sequence) else float(forward)
    layers = tuple(
        Layer(name, 4 * math.prod(shape), float(bw), tuple(shape))
        for (name, shape), bw in zip(trace.layers, timings["backward_s"])
    )
    passes = [float(p["forward_s"]) + float(p["backward_s"]) for p in timings.get("per_pass") or []]
    mean = sum(passes) / len(passes) if passes else 0.0
    cv = 0.0
    if len(passes) >= 2 and mean > 0:
        cv = math.sqrt(sum((x - mean) ** 2 for x in passes) / (len(passes) - 1)) / mean
    return Workload(
        layers, forward_s, float(timings["optimizer_s"]), int(timings["batch_size"]),
        name=str(trace.manifest.get("workload", "")), compute_cv=cv,
    )


def scaled(workload: Workload, factor: float) -> Workload:
    """``workload`` with every compute time (forward, per-layer backward, optimizer) × ``factor``
    (> 0): the projection of a trace captured on one device onto another (see
    :func:`costs.devices.compute_ratio`)."""
    if not factor > 0:
        raise ValueError(f"compute scale must be > 0, got {factor!r}")
    if factor == 1.0:
        return workload
    layers = tuple(layer._replace(backward_s=layer.backward_s * factor) for layer in workload.layers)
    return Workload(layers, workload.forward_s * factor, workload.optimizer_s * factor, workload.batch_size,
                    workload.itemsize, workload.name, workload.compute_cv)


def workload_by_flops(trace: Any, device_flops_per_s: float, memory_bandwidth_Bps: float,
                      fallback_scale: float) -> Workload:
    """The workload of a trace that carries per-layer forward FLOPs (``trace.forward_flops``),
    projected onto a device running at ``device_flops_per_s`` FLOP/s with ``memory_bandwidth_Bps``
    bytes/s: forward and per-layer backward from the FLOPs for the trace's batch
    (:func:`costs.compute.compute_from_flops`), the optimizer from the bandwidth
    (:func:`costs.compute.optimizer_from_bandwidth`);
    a layer the counter gave no FLOPs keeps its measured backward time × ``fallback_scale``."""
    import traces

    if isinstance(trace, (str, os.PathLike)):
        trace = traces.open(trace)
    if trace.forward_flops is None:
        raise ValueError(f"{trace.path}: the trace carries no per-layer FLOPs")
    if not fallback_scale > 0:
        raise ValueError(f"compute scale must be > 0, got {fallback_scale!r}")
    measured = workload_from_trace(trace)
    per_sample = [f / trace.flops_batch_size for f in trace.forward_flops]
    forward_s, backward = compute_from_flops(per_sample, measured.batch_size, device_flops_per_s)
    layers = tuple(
        layer._replace(backward_s=bw if f > 0 else layer.backward_s * fallback_scale)
        for layer, f, bw in zip(measured.layers, per_sample, backward)
    )
    numel = sum(layer.nbytes for layer in measured.layers) // measured.itemsize
    return Workload(layers, forward_s, optimizer_from_bandwidth(numel, memory_bandwidth_Bps), measured.batch_size,
                    measured.itemsize, measured.name, measured.compute_cv)


def workload_from_layout(
    name: str,
    device_flops_per_s: float = 100e12,
    batch_size: int = 32,
    memory_bandwidth_Bps: float = 2e12,
    tokens: int | None = None,
) -> Workload:
    """Build a :class:`Workload` from a full-size layout (``traces.layouts.layout(name, tokens)``;
    ``tokens``: a transformer's sequence length, ``None`` for its stated input).

    Compute model: forward time of a layer = per-sample forward FLOPs × ``batch_size`` ÷
    ``device_flops_per_s`` (FLOP/s; default 100 TFLOP/s, a modern GPU at realistic
    utilisation); backward = 2 × forward (:func:`costs.compute.compute_from_flops`); optimizer = an
    SGD-with-momentum update moving 20 bytes per fp32 parameter at ``memory_bandwidth_Bps``
    (bytes/s; :func:`costs.compute.optimizer_from_bandwidth`).
    """
    import traces

    if not device_flops_per_s > 0 or not memory_bandwidth_Bps > 0 or batch_size < 1:
        raise ValueError("device FLOP/s and memory bandwidth must be > 0 and batch size >= 1")
    entries = traces.layouts.layout(name, tokens)
    forward_s, backward = compute_from_flops([e["forward_flops"] for e in entries], batch_size, device_flops_per_s)
    layers = tuple(
        Layer(e["name"], 4 * int(e["numel"]), bw, tuple(e["shape"]) if e.get("shape") else None)
        for e, bw in zip(entries, backward)
    )
    numel = sum(int(e["numel"]) for e in entries)
    return Workload(layers, forward_s, optimizer_from_bandwidth(numel, memory_bandwidth_Bps), batch_size, name=name)
