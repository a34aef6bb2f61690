"""Capture a gradient trace from a built-in workload and register it in the results store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import traces
from traces.capture import check_request  # the door checks a request before it opens the store
from traces.workloads import data_source
from results.errors import StoreError
from results.store import Store


def check_data(workload: str, data: str | None, seed: int = 0) -> None:
    """The one check of a workload's training data (``--data``: ``None`` for its default, else
    what :func:`traces.workloads.data_source` takes), which the doors of ``capture`` and
    ``converge`` run before they open the store: ValueError, one line, for data the workload
    cannot train on."""
    data_source(workload, data, seed)


def run(store: Store, workload: str, out: str | Path, *, progress: Callable[[int, float], None] | None = None,
        **options: Any) -> tuple[int, traces.Trace]:
    """Capture ``workload`` into ``out`` (:func:`traces.capture` ``options``: workers,
    iterations, every, device, seed, width, batch_size, lr, overwrite) and register it;
    returns ``(trace_id, trace)``. ``progress(iteration, loss)`` after every step. A store that
    fails after training raises :class:`results.StoreError` saying the trace is complete and
    which command registers it."""
    trace = traces.capture(workload, out, progress=progress, **options)
    try:
        return store.register_trace(trace.path, trace.manifest), trace
    except StoreError as exc:
        raise StoreError(f"trace {trace.path} is complete but not registered: {exc}; then "
                         f"`sidco replay {trace.path} --store {store.path}` registers it") from None
