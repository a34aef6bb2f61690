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

import importlib
import sys
import types
from typing import Any

_LAZY: dict[str, tuple[str, str]] = {
    "capture": ("traces.capture", "capture"),
    "TraceError": ("traces.errors", "TraceError"),
    "SCHEMA_VERSION": ("traces.format", "SCHEMA_VERSION"),
    "Trace": ("traces.reader", "Trace"),
    "open": ("traces.reader", "open_trace"),
    "Recorder": ("traces.recorder", "Recorder"),
    "SYNTHETIC_KINDS": ("traces.synthetic", "KINDS"),
    "synthetic": ("traces.synthetic", "synthetic"),
}
"""Names exported here, imported on first use (most of them need torch; :mod:`traces.layouts`
does not, so a layout is projected without loading it)."""


class _Package(types.ModuleType):
    """This package, whose ``capture`` and ``synthetic`` stay the functions of those names even
    after their submodules are imported (importing a submodule would otherwise rebind them)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("capture", "synthetic") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(attr: str) -> Any:
    if attr in _LAZY:
        module, name = _LAZY[attr]
        return getattr(importlib.import_module(module), name)
    if attr in ("layouts", "workloads", "replay", "layout_models"):
        return importlib.import_module(f"traces.{attr}")
    raise AttributeError(f"module 'traces' has no attribute {attr!r}")


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
