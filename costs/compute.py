"""What the model asks of a device's compute: a layer's forward and backward seconds from its
FLOPs at a FLOP rate, an optimizer step's seconds from the memory bandwidth (a roofline of each).

The cluster model builds a workload's compute from these (:func:`simulator.workload.workload_from_layout`,
:func:`simulator.workload.workload_by_flops`); the effective FLOP rate comes from
:mod:`costs.throughput` or :mod:`costs.anchor`. Units: seconds, FLOP, FLOP/s, bytes/s.
"""

from __future__ import annotations

from collections.abc import Sequence


OPTIMIZER_BYTES_PER_PARAMETER = 20.0
"""Bytes an SGD-with-momentum step moves per fp32 parameter: reads parameter, gradient and
momentum, writes parameter and momentum (5 × 4 bytes)."""


def compute_from_flops(forward_flops: Sequence[float], batch_size: int,
                       device_flops_per_s: float) -> tuple[float, list[float]]:
    """Forward time (s) and per-layer backward times (s) of layers doing ``forward_flops`` FLOPs
    per sample each, for ``batch_size`` samples at ``device_flops_per_s`` FLOP/s: forward =
    Σ FLOPs × batch ÷ FLOP/s, a layer's backward = 2 × its forward FLOPs × batch ÷ FLOP/s (the
    input and the weight gradient each cost one forward)."""
    if not device_flops_per_s > 0 or batch_size < 1:
        raise ValueError("device FLOP/s must be > 0 and batch size >= 1")
    forward_s = sum(forward_flops) * batch_size / device_flops_per_s
    return forward_s, [2.0 * f * batch_size / device_flops_per_s for f in forward_flops]


def optimizer_from_bandwidth(numel: int, memory_bandwidth_Bps: float) -> float:
    """Seconds of one optimizer step over ``numel`` fp32 parameters at ``memory_bandwidth_Bps``
    (bytes/s): :data:`OPTIMIZER_BYTES_PER_PARAMETER` bytes moved per parameter."""
    if not memory_bandwidth_Bps > 0:
        raise ValueError("memory bandwidth must be > 0")
    return OPTIMIZER_BYTES_PER_PARAMETER * numel / memory_bandwidth_Bps
