"""The measuring lab: host timing loops (:mod:`measuring.host`), the profiling children that
time compressors (:mod:`measuring.profiling`) and the gloo ranks the DDP benchmark and tests start
on this machine (:mod:`processes.ranks`). It runs only as an explicit job (``sidco profile``);
the cluster model (:mod:`simulator`) takes the costs it measures as input and measures nothing.
Dependencies point one way: measuring imports compressors and simulator, never the reverse.
"""
