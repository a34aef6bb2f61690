"""The cost inputs of the cluster model: what a device, a compressor and a layout's compute cost.

The model asks this package, and only its top level, for costs (as a simulator asks a compute
back end for a kernel's time; the model takes costs as input): the names below are that one
interface. Everything else here builds those answers:

- :mod:`costs.profile`: compression costs per compressor and density (:class:`CompressionProfile`).
- :mod:`costs.compute`: a layer's forward and backward from FLOPs, the optimizer step from bandwidth.
- :mod:`costs.devices`: device specifications (spec sheets, published rules, this host's numbers).
- :mod:`costs.costmodel`: a compressor's declared work in seconds on a device.
- :mod:`costs.device_profile`, :mod:`costs.published`: measured and published device profiles.
- :mod:`costs.kernel_bands`: the error band of each kind of kernel, from published GPU timings.
- :mod:`costs.throughput`, :mod:`costs.anchor`: single-GPU compute, fitted to published throughput
  or anchored on a measured one.
- :mod:`costs.memory`: memory per GPU under DDP (model states, a compressor's state) against the device's.

Pricing reads numbers: it never compiles, measures, starts a process or reads the results store,
and it never imports the model (``tests/test_architecture.py``). Units: seconds, bytes, elements.
"""

from __future__ import annotations

from costs.compute import compute_from_flops, optimizer_from_bandwidth
from costs.profile import CompressionCost, CompressionProfile, density_key

__all__ = ["CompressionCost", "CompressionProfile", "compute_from_flops", "density_key", "optimizer_from_bandwidth"]
