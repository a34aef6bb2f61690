"""Run a sweep launched from the dashboard: read the launch form, call :func:`pipeline.sweep.run`.

The sweep is the one ``sidco sweep`` runs (same grid, scenario keys, rows and compression
profile policy), so a cancelled sweep launched again resumes and every scenario lands
exactly once. Chunks run in this process, a few scenarios at a time, so rows appear in the
store (and on the page) as they finish.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pipeline.project
import pipeline.sweep
from results.store import Store
from pipeline.sweep import Grid
from pipeline.request import WorkloadRequest
from units import parse_bandwidth, parse_density, parse_list

from dashboard import projection

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class SweepSpec:
    """A sweep launched from the page: a source (``trace:<id>``/``layout:<name>``) and a grid."""

    source: str
    grid: Grid
    fidelity: str = "analytic"


def _node_count(item: str) -> int:
    if not item.isdigit() or int(item) < 1:
        raise ValueError(f"invalid node count {item!r}: a whole number ≥ 1")
    return int(item)


def parse_spec(source: str | None, compressors: list[str] | None, densities: str | None, nodes: str | None,
               bandwidths: str | None, latency: str | None, topology: str | None,
               max_scenarios: int = 5000) -> SweepSpec:
    """Validate the launch form; raise ValueError naming the first bad field. ``none`` is always added."""
    projection.workload_fields(source)
    if not compressors:
        raise ValueError("choose at least one compressor")
    grid = pipeline.sweep.grid(
        nodes=parse_list(nodes or "", _node_count),
        bandwidths_bps=parse_list(bandwidths or "", parse_bandwidth),
        latencies_s=(projection.parse_latency(latency),),
        compressors=["none", *compressors],
        densities=parse_list(densities or "", parse_density),
        topologies=(str(topology),),
    )
    if len(grid) > max_scenarios:
        raise ValueError(f"{len(grid)} scenarios is more than the page launches ({max_scenarios}); use `sidco sweep`")
    return SweepSpec(str(source), grid)


def run(store_path: str | Path, spec: SweepSpec, progress: ProgressFn | None = None,
        started: Callable[[int], None] | None = None, chunk_size: int = 6,
        waiting: Callable[[str], None] | None = None) -> int:
    """Simulate every scenario of ``spec`` not yet in the store; return the sweep id.

    ``started(sweep_id)`` is called once the sweep row exists; ``progress(done, total)``
    after each chunk of ``chunk_size`` scenarios lands; ``waiting(text)`` (one line: on whom, until
    when) while this run waits for scenarios another run of the same sweep computes.
    """
    store = Store(store_path)
    try:
        asked = pipeline.project.resolve(WorkloadRequest(**projection.workload_fields(spec.source),
                                                         message_budget=projection.PAGE_MESSAGE_BUDGET), store)

        def on_start(sweep_id: int, stored: int) -> None:
            if started:
                started(sweep_id)
            if progress:
                progress(stored, len(spec.grid))

        with ThreadPoolExecutor(max_workers=1) as executor:
            done = pipeline.sweep.run(store, asked, spec.grid, executor, fidelity=spec.fidelity, origin="dashboard",
                                      chunk_size=chunk_size, in_flight=1, started=on_start, progress=progress,
                                      waiting=waiting)
        return done.sweep_id
    finally:
        store.close()
