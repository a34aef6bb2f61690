"""The cost inputs of the cluster model: what a device, a compressor and a layout's compute cost.

- :mod:`costs.profile`: compression costs per compressor and density (the answer the model asks for).
- :mod:`costs.devices`: device specifications (spec sheets, published rules, this host's numbers).
- :mod:`costs.costmodel`: a compressor's declared work in seconds on a device.
- :mod:`costs.device_profile`, :mod:`costs.published`: measured and published device profiles.
- :mod:`costs.kernel_bands`: the error band of each kind of kernel, from published GPU timings.
- :mod:`costs.throughput`, :mod:`costs.anchor`: single-GPU compute, fitted to published throughput
  or anchored on a measured one.

Pricing reads numbers; it never compiles, measures or reads the results store.
"""
