"""What the layers below offer the front doors to choose from: names and choices only.

The doors (``sidco``, the dashboard) import the pipeline, the store and :mod:`units` only
(``tests/test_architecture.py``); the names here are the library's own, re-exported once. Each
is a constant (a tuple of names, a default name, a stated limit) or one of :data:`CHOICES`, a
function that returns names only; behaviour the doors need is a function of the pipeline module
that owns it (``tests/test_architecture.py`` holds the catalog to this).
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM: dict[str, tuple[str, str]] = {
    "compressor_names": ("compressors", "names"),
    "COLLECTIVES": ("emulation.collectives", "OPS"),
    "FIDELITIES": ("simulator", "FIDELITIES"),
    "JOB_BYTES": ("simulator.limits", "JOB_BYTES"),
    "MESSAGE_BUDGET": ("simulator.limits", "MESSAGE_BUDGET"),
    "COMPRESS_ON": ("simulator.scenario", "COMPRESS_ON"),
    "TOPOLOGIES": ("simulator.scenario", "TOPOLOGIES"),
    "STRATEGIES": ("simulator.lowcomm", "STRATEGIES"),
    "DEFAULT_PRECISION": ("costs.throughput", "DEFAULT_PRECISION"),
    "PRECISIONS": ("costs.throughput", "PRECISIONS"),
    "BUCKET_MODES": ("simulator.workload", "BUCKET_MODES"),
    "layout_names": ("traces.layouts", "names"),
    "model_names": ("traces.llm", "names"),
    "workload_names": ("traces.workloads", "names"),
}
"""Where each name comes from, imported on first use: the doors ask for a few of them per
command, and most of the modules behind the others import torch (``sidco --help`` and a layout
projection need none of it)."""

CHOICES = frozenset({"compressor_names", "layout_names", "model_names", "workload_names"})
"""The catalog's callables: each returns a list of names (those :func:`compressors.create`,
:func:`traces.layouts.layout` (layouts and shipped models) and :func:`traces.workloads.build`
accept) and does nothing else."""

__all__ = [
    "BUCKET_MODES", "COLLECTIVES", "COMPRESS_ON", "DEFAULT_PRECISION", "FIDELITIES", "JOB_BYTES",
    "MESSAGE_BUDGET", "PRECISIONS", "STRATEGIES", "TOPOLOGIES", *sorted(CHOICES),
]


def __getattr__(name: str) -> Any:
    if name in _FROM:
        module, attr = _FROM[name]
        loaded = importlib.import_module(module)
        value = getattr(loaded, attr) if hasattr(loaded, attr) else importlib.import_module(f"{module}.{attr}")
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pipeline.catalog' has no attribute {name!r}")
