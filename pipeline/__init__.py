"""The orchestration layer: plain library code that both front doors (the ``sidco`` command line
and the dashboard) call.

==========================  ===================================================================
:mod:`pipeline.request`     the request both doors fill: every rule of a projection, checked once;
                            the modelled device looked up once (``resolve_device``)
:mod:`pipeline.capture`     capture a trace from a built-in workload and register it
:mod:`pipeline.replay`      replay a trace through compressors into the store (measures costs)
:mod:`pipeline.costs`       the one compression-profile policy (replay rows, device profiles, ...)
:mod:`pipeline.project`     project one iteration per compressor (``simulate``, What-if, Timeline)
:mod:`pipeline.sweep`       simulate a grid into the store, resumably (``sweep``, Sweeps page)
:mod:`pipeline.emulate`     real runs on shaped links, stored with their projections
:mod:`pipeline.calibrate`   fit α, β, efficiency to measured collectives
:mod:`pipeline.converge`    train with compressed gradients into the store, resumably (``converge``)
:mod:`pipeline.tta`         time to accuracy: iterations to target × projected iteration time
==========================  ===================================================================

Dependencies point one way: processes ← results ← compressors ← traces ← {costs ← simulator,
convergence} ← {measuring, emulation} ← pipeline ← {sidco, dashboard}. Nothing here imports the
front doors.
"""
