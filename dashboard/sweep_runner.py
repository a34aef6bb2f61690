"""Run a sweep launched from the dashboard: simulate a grid, land rows in the store as they finish.

Scenarios are keyed like the rest of the store (sorted-key JSON of the
scenario's parameters), so a cancelled sweep launched again resumes and every
scenario lands exactly once.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.units import parse_bandwidth, parse_duration, parse_list

from sidco.store import Store, config_key

from dashboard import projection

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class SweepSpec:
    """A sweep grid (units: bits/s, seconds)."""

    source: str
    compressors: tuple[str, ...]
    densities: tuple[float, ...]
    nodes: tuple[int, ...]
    bandwidths_bps: tuple[float, ...]
    latency_s: float
    topology: str
    fidelity: str = "analytic"

    def config(self) -> dict[str, Any]:
        """The sweep's configuration as stored in ``sweeps.config_json``."""
        return {
            "origin": "dashboard",
            "source": self.source,
            "compressors": list(self.compressors),
            "densities": list(self.densities),
            "nodes": list(self.nodes),
            "bandwidths_bps": list(self.bandwidths_bps),
            "latency_s": self.latency_s,
            "topology": self.topology,
            "fidelity": self.fidelity,
        }

    def scenarios(self) -> list[dict[str, Any]]:
        """Every scenario of the grid; ``none`` once per (nodes, bandwidth), without a density."""
        grid = []
        for compressor in self.compressors:
            densities: Sequence[float | None] = (None,) if compressor == "none" else self.densities
            for density, nodes, bandwidth in itertools.product(densities, self.nodes, self.bandwidths_bps):
                grid.append({
                    "compressor": compressor, "density": density, "nodes": nodes, "bandwidth_bps": bandwidth,
                    "latency_s": self.latency_s, "topology": self.topology, "fidelity": self.fidelity,
                })
        return grid


def _ints(text: str) -> list[int]:
    def one(item: str) -> int:
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"invalid node count {item!r}: a whole number ≥ 1")
        return int(item)

    return parse_list(text, one)


def _density(item: str) -> float:
    try:
        value = float(item)
    except ValueError:
        raise ValueError(f"invalid density {item!r}: a number in (0, 1]") from None
    if not 0 < value <= 1:
        raise ValueError(f"invalid density {item!r}: a number in (0, 1]")
    return value


def parse_spec(source: str | None, compressors: list[str] | None, densities: str | None, nodes: str | None,
               bandwidths: str | None, latency: str | None, topology: str | None,
               max_scenarios: int = 5000) -> SweepSpec:
    """Validate the launch form; raise ValueError naming the first bad field."""
    projection.Source.parse(source)
    if not compressors:
        raise ValueError("choose at least one compressor")
    if topology not in projection.TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}")
    chosen = tuple(dict.fromkeys(["none", *compressors]))
    spec = SweepSpec(
        source=str(source),
        compressors=chosen,
        densities=tuple(parse_list(densities or "", _density)),
        nodes=tuple(_ints(nodes or "")),
        bandwidths_bps=tuple(parse_list(bandwidths or "", parse_bandwidth)),
        latency_s=parse_duration(latency or ""),
        topology=str(topology),
    )
    count = len(spec.scenarios())
    if count > max_scenarios:
        raise ValueError(f"{count} scenarios is more than the page launches ({max_scenarios}); use `sidco sweep`")
    return spec


def sweep_id(store_path: str | Path, spec: SweepSpec) -> int:
    """The id of ``spec``'s row in ``sweeps`` (created, status running, if new)."""
    store = Store(store_path)
    try:
        return _open_sweep(store, spec)
    finally:
        store.close()


def _open_sweep(store: Store, spec: SweepSpec) -> int:
    source = projection.Source.parse(spec.source)
    trace_id = int(source.ref) if source.kind == "trace" else None
    row_id, _ = store.get_or_create("sweeps", spec.config(), trace_id=trace_id, total=len(spec.scenarios()))
    return row_id


def run(store_path: str | Path, spec: SweepSpec, progress: ProgressFn | None = None, batch: int = 8) -> int:
    """Simulate every scenario of ``spec`` not yet in the store; return the sweep id.

    Rows are written ``batch`` at a time so the page sees them land; ``progress``
    is called with (done, total) after each batch.
    """
    import simulator

    store = Store(store_path)
    try:
        source = projection.Source.parse(spec.source)
        grid = spec.scenarios()
        sweep = _open_sweep(store, spec)
        store.set_status("sweeps", sweep, "running")
        done_keys = {r[0] for r in store.query("SELECT scenario_key FROM scenarios WHERE sweep_id=?", (sweep,))}
        workload = projection.workload(store, source)
        pending: list[dict[str, Any]] = []
        done = len(done_keys)
        if progress:
            progress(done, len(grid))
        for params in grid:
            key = config_key(params)
            if key in done_keys:
                continue
            result = simulator.simulate(
                simulator.Scenario(
                    workload=workload, nodes=params["nodes"], bandwidth_bps=params["bandwidth_bps"],
                    latency_s=params["latency_s"], compressor=params["compressor"], density=params["density"],
                    topology=params["topology"], fidelity=params["fidelity"],
                    profile=projection.profile(store, source, params["compressor"], params["density"])
                    if params["density"] is not None else None,
                )
            )
            pending.append(_row(sweep, key, params, result))
            if len(pending) >= batch:
                done += store.insert_many("scenarios", pending, or_ignore=True)
                pending = []
                if progress:
                    progress(done, len(grid))
        done += store.insert_many("scenarios", pending, or_ignore=True)
        if progress:
            progress(done, len(grid))
        store.set_status("sweeps", sweep, "done")
        return sweep
    finally:
        store.close()


def _row(sweep_id: int, key: str, params: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in result.items() if k != "timeline"}
    return {
        "sweep_id": sweep_id,
        "scenario_key": key,
        **params,
        **{k: result.get(k) for k in projection.RESULT_KEYS},
        "result_json": json.dumps(kept, sort_keys=True, default=str),
    }
