"""Replay a trace through compressors into the results store, resumably.

Each (compressor, density) combination is written in one transaction; a rerun of the same
replay (same trace and configuration) finds the stored combinations and skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import traces
import traces.replay as trace_replay
from results.store import Store


def done_combinations(store: Store, replay_id: int, error_feedback: bool, expected: int) -> set[tuple[str, float]]:
    """(compressor, density) pairs of ``replay_id`` that already have all ``expected`` rows."""
    rows = store.query(
        "SELECT compressor, density, COUNT(*) AS n FROM replay_rows WHERE replay_id=? AND error_feedback=? "
        "GROUP BY compressor, density",
        (replay_id, int(error_feedback)),
    )
    return {(r["compressor"], float(r["density"])) for r in rows if r["n"] == expected}


def write_combination(store: Store, replay_id: int, rows: list[dict[str, Any]]) -> None:
    """Write one combination's rows in one transaction, replacing any partial leftovers."""
    first = rows[0]
    columns = ["replay_id", *trace_replay.COLUMNS]
    sql = f"INSERT INTO replay_rows ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    with store.transaction() as cur:
        cur.execute(
            "DELETE FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?",
            (replay_id, first["compressor"], first["density"], first["error_feedback"]),
        )
        cur.executemany(sql, [(replay_id, *(row[c] for c in trace_replay.COLUMNS)) for row in rows])


def store_replay(
    store: Store,
    trace: traces.Trace,
    names: Sequence[str],
    densities: Sequence[float],
    *,
    device: str = "cpu",
    error_feedback: bool = True,
    bucket_bytes: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Replay ``trace`` for every (name, density) not yet stored; return ``(replay_id, skipped)``.

    ``progress(done_calls, total_calls)`` is called after every compressor call
    (``total_calls`` counts only the combinations run now). Arguments are checked before
    anything is written (``ValueError``, :class:`traces.TraceError`).
    """
    names, densities = list(names), [float(d) for d in densities]
    expected = trace_replay.calls_per_combination(trace, bucket_bytes)
    trace_replay.replay(trace, names, densities, device=device, bucket_bytes=bucket_bytes)  # checks arguments
    config = {
        "trace_id": trace.manifest.get("trace_id"),
        "trace_path": str(trace.path.resolve()),
        "error_feedback": error_feedback,
        "bucket_bytes": bucket_bytes,
        "device": device,
    }
    trace_row = store.register_trace(trace.path, trace.manifest)
    replay_id, _ = store.get_or_create("replays", config, trace_id=trace_row, device=device)
    done = done_combinations(store, replay_id, error_feedback, expected)
    todo = [(n, d) for n in names for d in densities if (n, d) not in done]
    store.set_status("replays", replay_id, "running")
    rows_iter = trace_replay.replay(trace, names, densities, device=device, error_feedback=error_feedback,
                                    bucket_bytes=bucket_bytes, skip=frozenset(done))
    total, count = len(todo) * expected, 0
    batch: list[dict[str, Any]] = []
    for row in rows_iter:
        batch.append(row)
        count += 1
        if progress is not None:
            progress(count, total)
        if len(batch) == expected:
            write_combination(store, replay_id, batch)
            batch = []
    store.set_status("replays", replay_id, "done")
    return replay_id, len(names) * len(densities) - len(todo)
