"""The cluster simulator: SimPy and closed-form models of data-parallel training iterations.

>>> import simulator
>>> simulator.collective_time("allreduce", 100e6, 8, 10e9, 50e-6, algorithm="ring", fidelity="des")
>>> wl = simulator.workload_from_layout("resnet50")
>>> simulator.simulate(simulator.Scenario(wl, nodes=8, bandwidth_bps=10e9, latency_s=50e-6))

The model takes its costs as input, asked through the one interface of :mod:`costs` (its top
level: compression costs, compute from FLOPs and bandwidth); it measures nothing, starts no
process and reads no store. Units everywhere: seconds, bytes, bits/s (bandwidths), elements (numel).
"""

from __future__ import annotations

from costs import CompressionCost, CompressionProfile
from simulator.calibration import Calibration
from simulator.collectives import collective_time
from simulator.scenario import FIDELITIES, TOPOLOGIES, Scenario
from simulator.simulate import simulate
from simulator.timeline import check_output_path, chrome_trace, write_chrome_trace
from simulator.workload import Bucket, Layer, Workload, workload_from_layout, workload_from_trace

__all__ = [
    "FIDELITIES",
    "TOPOLOGIES",
    "Bucket",
    "Calibration",
    "CompressionCost",
    "CompressionProfile",
    "Layer",
    "Scenario",
    "Workload",
    "check_output_path",
    "chrome_trace",
    "collective_time",
    "simulate",
    "workload_from_layout",
    "workload_from_trace",
    "write_chrome_trace",
]
