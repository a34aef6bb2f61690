"""One iteration as events: data for a Gantt chart, and Chrome / Perfetto trace JSON.

An event is a dict ``{"worker": int, "stream": "compute" | "comm", "name": str,
"start_s": float, "end_s": float}`` (seconds from the start of the iteration). Names:
``forward``, ``backward b<i>``, ``compress b<i>``, ``<collective> b<i>`` (the bucket's
transfer, from the moment every rank has joined the collective), ``decompress b<i>``,
``optimizer``. Buckets are numbered in backward order (b0 is produced first).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simulator.iteration import Prepared, Record

MAX_WORKERS = 64
SLOWEST = 8


def events(prep: Prepared, rec: Record, max_workers: int = MAX_WORKERS) -> list[dict[str, Any]]:
    """The events of the first ``max_workers`` workers and of the ``SLOWEST`` slowest ones."""
    sc = prep.scenario
    on_compute = sc.compress_on == "compute"
    n_b, p = rec.ready.shape
    slowest = np.argsort(-prep.scale, kind="stable")[:SLOWEST]
    chosen = sorted(set(range(min(p, max_workers))) | {int(w) for w in slowest})
    compute_end = rec.ready[-1] if on_compute else rec.backward_end[-1]
    comm_end = rec.decompress_end.max(axis=0)
    out: list[dict[str, Any]] = []

    def add(w: int, stream: str, name: str, start: float, end: float) -> None:
        if end > start:
            out.append({"worker": w, "stream": stream, "name": name, "start_s": float(start), "end_s": float(end)})

    for w in chosen:
        add(w, "compute", "forward", 0.0, rec.forward_end[w])
        prev = rec.forward_end[w]
        for b in range(n_b):
            add(w, "compute", f"backward b{b}", prev, rec.backward_end[b, w])
            if on_compute:
                add(w, "compute", f"compress b{b}", rec.backward_end[b, w], rec.ready[b, w])
            else:
                add(w, "comm", f"compress b{b}", rec.comm_start[b, w], rec.compress_end[b, w])
            prev = rec.ready[b, w]
            add(w, "comm", f"{prep.op_name} b{b}", rec.transfer_start[b, w], rec.transfer_end[b, w])
            add(w, "comm", f"decompress b{b}", rec.transfer_end[b, w], rec.decompress_end[b, w])
        opt_start = max(compute_end[w], comm_end[w])
        add(w, "compute", "optimizer", opt_start, opt_start + sc.workload.optimizer_s * prep.scale[w])
    return out


def chrome_trace(items: Iterable[Mapping[str, Any]], metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Chrome / Perfetto trace-event JSON (complete events, microseconds): one process per
    worker, one thread per stream. Open in https://ui.perfetto.dev or chrome://tracing."""
    trace_events: list[dict[str, Any]] = []
    workers = set()
    for e in items:
        workers.add(e["worker"])
        trace_events.append({
            "name": e["name"], "ph": "X", "pid": e["worker"], "tid": 0 if e["stream"] == "compute" else 1,
            "ts": e["start_s"] * 1e6, "dur": (e["end_s"] - e["start_s"]) * 1e6, "cat": e["stream"],
        })
    for w in sorted(workers):
        trace_events.append({"name": "process_name", "ph": "M", "pid": w, "args": {"name": f"worker {w}"}})
        for tid, stream in ((0, "compute"), (1, "comm")):
            trace_events.append({"name": "thread_name", "ph": "M", "pid": w, "tid": tid, "args": {"name": stream}})
    return {"traceEvents": trace_events, "displayTimeUnit": "ms", "metadata": dict(metadata or {})}


def check_output_path(path: str | Path) -> Path:
    """``path`` as a :class:`Path` if a file can be written there: its directory exists and it is
    not a directory itself; ``ValueError`` (one line) otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give a file name, e.g. {path / 'timeline.json'}")
    if not path.parent.is_dir():
        raise ValueError(f"{path}: directory {path.parent} does not exist (create it first)")
    return path


def write_chrome_trace(path: str | Path, items: Iterable[Mapping[str, Any]], metadata: Mapping[str, Any] | None = None) -> Path:
    """Write :func:`chrome_trace` to ``path`` (JSON); returns the path. The directory must exist
    (nothing is created but the file; :func:`check_output_path`)."""
    path = check_output_path(path)
    path.write_text(json.dumps(chrome_trace(items, metadata)))
    return path
