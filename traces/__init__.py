"""Gradient traces: capture from training, a versioned safetensors format, replay through compressors.

>>> import traces
>>> t = traces.open("traces/resnet20")        # lazy; TraceError names file + problem
>>> t.workers, t.iterations, t.layers
>>> g = t.gradient(t.iterations[0], 0)        # 1-D float32 tensor
>>> traces.synthetic("/tmp/lap", "laplace", numel=10**6, workers=2, iterations=3, seed=0)

Submodules: :mod:`traces.workloads` (built-in models and data), :mod:`traces.layouts`
(full-size layer layouts with FLOPs), :mod:`traces.replay` (replay through
compressors), :mod:`traces.capture` (simulated data-parallel capture).
The format is documented in ``traces/FORMAT.md``.
"""

from __future__ import annotations

from traces import layouts, workloads
from traces.capture import capture
from traces.errors import TraceError
from traces.format import SCHEMA_VERSION
from traces.reader import Trace
from traces.reader import open_trace as open
from traces.recorder import Recorder
from traces.synthetic import KINDS as SYNTHETIC_KINDS
from traces.synthetic import synthetic

__all__ = [
    "SCHEMA_VERSION",
    "SYNTHETIC_KINDS",
    "Recorder",
    "Trace",
    "TraceError",
    "capture",
    "layouts",
    "open",
    "synthetic",
    "workloads",
]
