"""Replay a trace through compressors into the results store (the one code that measures
compression costs; :mod:`traces.replay` runs the compressors).

Each (compressor, density) is written in one transaction once all its calls are done, so a
run stopped halfway keeps every finished combination, and a rerun of the same replay skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import traces
from machine import device_identity
import traces.replay as trace_replay
from results.store import Store


FIRST_CALLS = 2
"""Calls with ``call_index`` below this are the "first calls" of a compressor instance (no history
yet); the rest are its steady state. The summary reports the two apart."""


@dataclass(frozen=True)
class ReplayRun:
    """What :func:`run` did: the replay id, the trace, calls per combination, combinations
    skipped because a previous run stored them, and the per-combination summary."""

    replay_id: int
    trace: traces.Trace
    calls: int
    skipped: int
    summary: list[dict[str, Any]]


def summarize(store: Store, replay_id: int, names: Sequence[str], densities: Sequence[float],
              error_feedback: bool) -> list[dict[str, Any]]:
    """Per (compressor, density) means over the stored rows (seconds, bytes, elements), with
    ``wire_over_dense`` (fraction of fp32 bytes) and ``throughput_gb_per_s`` (10⁹ fp32 bytes
    compressed per second)."""
    summary = []
    for name in names:
        for density in densities:
            row = store.replay_summary(replay_id, name, density, error_feedback)
            if row is None:
                continue
            item = {"compressor": name, "density": density, **row}
            phases = store.replay_phases(replay_id, name, density, error_feedback, FIRST_CALLS)
            for phase in ("first", "steady"):
                found = phases.get(phase) or {}
                item[f"{phase}_calls"] = found.get("calls")
                for key in ("mean", "low", "high"):
                    item[f"{phase}_{key}_over_target"] = found.get(key)
            item["wire_over_dense"] = row["wire_bytes"] / (4 * row["numel"])
            item["throughput_gb_per_s"] = (4 * row["elements"] / row["total_compress_s"] / 1e9
                                           if row["total_compress_s"] else None)
            summary.append(item)
    return summary


def check(trace_path: str | Path, names: Sequence[str], densities: Sequence[float], *, device: str = "cpu",
          bucket_bytes: int | None = None, first_bucket_bytes: int | None = None,
          options: Mapping[str, Mapping[str, Any]] | None = None) -> traces.Trace:
    """Open the trace and check the request (compressors, densities, device, bucket caps in bytes,
    per-compressor ``options`` such as ``{"powersgd": {"rank": 2}}``) without running anything;
    ValueError / :class:`traces.TraceError` naming the problem."""
    trace = traces.open(trace_path)
    trace_replay.replay(trace, names, densities, device=device, bucket_bytes=bucket_bytes,  # checks arguments
                        first_bucket_bytes=first_bucket_bytes, options=options)
    return trace


def run(store: Store, trace: traces.Trace | str | Path, names: Sequence[str], densities: Sequence[float], *,
        device: str = "cpu", error_feedback: bool = True, bucket_bytes: int | None = None,
        first_bucket_bytes: int | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
        threads: int | None = None, progress: Callable[[int, int], None] | None = None) -> ReplayRun:
    """Replay ``trace`` (opened, or its directory) through ``names`` × ``densities`` on ``device``
    and store the rows.

    ``bucket_bytes``/``first_bucket_bytes``: DDP bucket caps in fp32 gradient bytes
    (:func:`traces.replay.buckets`; ``None``: the whole model as one vector); ``threads``: torch intra-op threads for the run (restored after);
    ``progress(calls_done, calls_total)`` after every call.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"invalid threads {threads}: must be >= 1")
    if not isinstance(trace, traces.Trace):
        trace = check(trace, names, densities, device=device, bucket_bytes=bucket_bytes,
                      first_bucket_bytes=first_bucket_bytes, options=options)
    calls = trace_replay.calls_per_combination(trace, bucket_bytes, first_bucket_bytes)
    content = trace.content_sha256()  # a trace whose files changed is replayed again
    config = {
        "trace_id": trace.manifest.get("trace_id"),
        "content_sha256": content,
        "trace_path": str(trace.path.resolve()),
        "error_feedback": error_feedback,
        "bucket_bytes": bucket_bytes,
        "device": device,
    }
    if bucket_bytes is not None:
        config["first_bucket_bytes"] = first_bucket_bytes
    if options:
        config["options"] = {name: dict(opts) for name, opts in options.items()}
    trace_id = store.register_trace(trace.path, trace.manifest, content)
    replay_id, _ = store.get_or_create("replays", config, trace_id=trace_id, device=device_identity(device))
    done = store.complete_combinations(replay_id, error_feedback, calls)
    todo = [(n, d) for n in names for d in densities if (n, d) not in done]
    store.set_status("replays", replay_id, "running")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        rows = trace_replay.replay(trace, names, densities, device=device, error_feedback=error_feedback,
                                   bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                                   skip=frozenset(done), options=options)
        batch: list[dict[str, Any]] = []
        finished = 0
        for row in rows:
            batch.append(row)
            finished += 1
            if progress:
                progress(finished, len(todo) * calls)
            if len(batch) == calls:
                store.replace_replay_combination(replay_id, batch)
                batch = []
    finally:
        torch.set_num_threads(previous_threads)
    store.set_status("replays", replay_id, "done")
    summary = summarize(store, replay_id, names, densities, error_feedback)
    return ReplayRun(replay_id, trace, calls, len(names) * len(densities) - len(todo), summary)


def stored_rows(store: Store, replay_id: int, error_feedback: bool, names: Sequence[str],
                densities: Sequence[float]) -> list[dict[str, Any]]:
    """The stored rows of a replay for ``names`` × ``densities``, in replay order."""
    wanted = {(n, float(d)) for n in names for d in densities}
    return [r for r in store.replay_rows(replay_id, error_feedback) if (r["compressor"], float(r["density"])) in wanted]
