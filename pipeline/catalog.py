"""What the layers below offer the front doors: names to choose from, their checks and readers.

The doors (``sidco``, the dashboard) import the pipeline, the store and :mod:`units` only
(``tests/test_architecture.py``); the names here are the library's own, re-exported once.
"""

from __future__ import annotations

from compressors import takes_density
from compressors import names as compressor_names
from compressors.machine import device_identity
from convergence import RunConfig
from convergence.curves import document as curves_document
from convergence.curves import load as load_curves
from convergence.tta import check_target, target_text
from emulation.collectives import OPS as COLLECTIVES
from emulation.network import remove_stale, require_emulation
from emulation.plan import check_shaping
from emulation.training import check_request as check_training_request
from simulator import FIDELITIES, Workload, check_output_path, chrome_trace, devices, write_chrome_trace
from simulator.limits import JOB_BYTES, MESSAGE_BUDGET, check_jobs, max_jobs
from simulator.children import adopt
from simulator.pool import local_pool
from simulator.scenario import COMPRESS_ON, TOPOLOGIES
from simulator.sweep import Grid
from simulator.throughput import DEFAULT_PRECISION, PRECISIONS
from simulator.workload import BUCKET_MODES
from traces import open as open_trace
from traces.capture import check_request as check_capture_request
from traces.layouts import names as layout_names
from traces.workloads import data_source
from traces.workloads import names as workload_names

__all__ = [
    "adopt", "BUCKET_MODES", "COLLECTIVES", "COMPRESS_ON", "DEFAULT_PRECISION", "FIDELITIES", "JOB_BYTES",
    "MESSAGE_BUDGET", "PRECISIONS", "TOPOLOGIES", "check_capture_request", "check_jobs", "check_shaping",
    "check_output_path", "check_target", "curves_document", "data_source", "load_curves", "check_training_request", "chrome_trace", "compressor_names",
    "device_identity", "devices", "Grid", "layout_names", "local_pool", "max_jobs", "takes_density",
    "open_trace", "remove_stale", "require_emulation", "RunConfig", "target_text", "Workload",
    "workload_names", "write_chrome_trace",
]
