"""The measuring lab: host timing loops (:mod:`measuring.host`), the profiling children that
time compressors (:mod:`measuring.profiling`) and a model's training step built in torch from its
config (:mod:`measuring.model_step`). It runs only as an explicit job (``sidco profile``);
the cost inputs (:mod:`costs`) read what it measures and the cluster model (:mod:`simulator`) takes
them as input: neither measures. Dependencies point one way: measuring imports compressors, costs
and processes, never the reverse.
"""
