"""Run a sweep launched from the dashboard with the simulator's sweep machinery.

The grid, the scenario keys and the rows are those of :mod:`simulator.sweep`
(the same as ``sidco sweep``), so a cancelled sweep launched again resumes and
every scenario lands exactly once. Chunks run in this process, a few scenarios
at a time, so rows appear in the store (and on the page) as they finish.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import simulator
from simulator.limits import check_scenario
from simulator.sweep import Grid, SweepContext, describe, run_sweep
from simulator.units import parse_bandwidth, parse_density, parse_duration, parse_list

from results.store import Store

from dashboard import data, projection

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
    projection.Source.parse(source)
    if not compressors:
        raise ValueError("choose at least one compressor")
    unknown = [c for c in compressors if c not in projection.compressor_names()]
    if unknown:
        raise ValueError(f"unknown compressor {unknown[0]!r}")
    if topology not in projection.TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}")
    grid = Grid(
        nodes=tuple(parse_list(nodes or "", _node_count)),
        bandwidths_bps=tuple(parse_list(bandwidths or "", parse_bandwidth)),
        latencies_s=(parse_duration(latency or ""),),
        compressors=tuple(dict.fromkeys(["none", *compressors])),
        densities=tuple(parse_list(densities or "", parse_density)),
        topologies=(str(topology),),
    )
    if len(grid) > max_scenarios:
        raise ValueError(f"{len(grid)} scenarios is more than the page launches ({max_scenarios}); use `sidco sweep`")
    return SweepSpec(str(source), grid)


def _source_description(store: Store, source: projection.Source) -> tuple[dict[str, Any], int | None]:
    if source.kind == "layout":
        return {"layout": source.ref, "origin": "dashboard"}, None
    row = data.trace_row(store, int(source.ref))
    if row is None:
        raise ValueError(f"trace #{source.ref} is not registered in the store")
    return {"trace": row["path"], "origin": "dashboard"}, int(row["id"])


def _profile(store: Store, source: projection.Source, grid: Grid) -> simulator.CompressionProfile | None:
    costs: dict = {}
    sources = []
    for compressor in grid.compressors:
        for density in grid.densities if compressor != "none" else ():
            profile = projection.profile(store, source, compressor, density)
            costs.update(profile.costs)
            sources.append(profile.source)
    return simulator.CompressionProfile(costs, "; ".join(sorted(set(sources)))) if costs else None


def open_sweep(store: Store, spec: SweepSpec) -> tuple[int, SweepContext]:
    """Find or create the sweep row of ``spec``; return its id and the context to simulate it."""
    source = projection.Source.parse(spec.source)
    description, trace_id = _source_description(store, source)
    workload = projection.workload(store, source)
    context = SweepContext(workload, None, spec.fidelity)
    for point in spec.grid.points():  # the simulator's limits, checked before the sweep row is written
        check_scenario(context.scenario({**point, "compressor": "none", "density": None}),
                       message_budget=projection.PAGE_MESSAGE_BUDGET)
    sweep_id, _ = store.get_or_create("sweeps", describe(context, spec.grid, description), trace_id=trace_id,
                                      total=len(spec.grid))
    return sweep_id, SweepContext(workload, _profile(store, source, spec.grid), spec.fidelity)


def run(store_path: str | Path, spec: SweepSpec, progress: ProgressFn | None = None,
        started: Callable[[int], None] | None = None, chunk_size: int = 6) -> int:
    """Simulate every scenario of ``spec`` not yet in the store; return the sweep id.

    ``started(sweep_id)`` is called once the sweep row exists; ``progress(done, total)``
    after each chunk of ``chunk_size`` scenarios lands.
    """
    store = Store(store_path)
    try:
        sweep_id, context = open_sweep(store, spec)
        store.set_status("sweeps", sweep_id, "running")
        total = len(spec.grid)
        if started:
            started(sweep_id)

        def landed() -> int:
            return int(store.query("SELECT COUNT(*) FROM scenarios WHERE sweep_id=?", (sweep_id,))[0][0])

        def skip_done(keys: list[str]) -> set[str]:
            marks = ",".join("?" for _ in keys)
            rows = store.query(f"SELECT scenario_key FROM scenarios WHERE sweep_id=? AND scenario_key IN ({marks})",
                               (sweep_id, *keys))
            return {r[0] for r in rows}

        def on_rows(rows: list[dict[str, Any]]) -> None:
            store.insert_many("scenarios", ({"sweep_id": sweep_id, **r} for r in rows), or_ignore=True)
            if progress:
                progress(landed(), total)

        if progress:
            progress(landed(), total)
        with ThreadPoolExecutor(max_workers=1) as executor:
            run_sweep(context, spec.grid.points(), executor, chunk_size=chunk_size, in_flight=1,
                      skip_done=skip_done, on_rows=on_rows)
        store.set_status("sweeps", sweep_id, "done")
        return sweep_id
    finally:
        store.close()
