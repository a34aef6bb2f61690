"""Capture a gradient trace from a built-in workload and register it in the results store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import traces
from results.store import Store


def run(store: Store, workload: str, out: str | Path, *, progress: Callable[[int, float], None] | None = None,
        **options: Any) -> tuple[int, traces.Trace]:
    """Capture ``workload`` into ``out`` (:func:`traces.capture` ``options``: workers,
    iterations, every, device, seed, width, batch_size, lr, overwrite) and register it;
    returns ``(trace_id, trace)``. ``progress(iteration, loss)`` after every step."""
    trace = traces.capture(workload, out, progress=progress, **options)
    return store.register_trace(trace.path, trace.manifest), trace
