"""The testbed's benchmarks, one module per room; each runs as ``python -m benchmarks.<module>``.
The compressor benchmark, which ``sidco bench`` runs, is :mod:`pipeline.bench` (the doors may
not import this package).

- :mod:`benchmarks.ddp_bench`: the DDP communication hook per compressor, side by side;
- :mod:`benchmarks.trace_bench`: capture overhead, replay throughput, opening a 1 GB trace;
- :mod:`benchmarks.simulator_bench`: analytic and SimPy scenarios per second;
- :mod:`benchmarks.dashboard_bench`: dashboard page loads over a large store.

Figures and the machines they were measured on are in BENCHMARKS.md.
"""
