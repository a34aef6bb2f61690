"""Projections: one simulated iteration of a trace or layout on a cluster, per compressor.

``sidco simulate`` and the dashboard's What-if and Timeline pages call :func:`project`
(and :func:`timeline`) with the same arguments for the same scenario, so they show the
same numbers: the workload comes from :func:`workload`, the compression costs from the
one policy (:func:`pipeline.costs.compression_profile`), the calibration from the store.
Units: seconds, bits/s, bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import simulator
from simulator.limits import MESSAGE_BUDGET, check_scenario
import traces
from pipeline.costs import compression_profile
from results.store import Store


@dataclass(frozen=True)
class Source:
    """Where the workload comes from: a trace directory (``kind="trace"``, ``ref`` its resolved
    path, ``trace_id`` its id in the store or ``None``) or a layout (``kind="layout"``, ``ref``
    its name, computed at ``device_flops_per_s`` FLOP/s with ``batch_size`` samples per worker)."""

    kind: str
    ref: str
    trace_id: int | None = None
    device_flops_per_s: float = 100e12
    batch_size: int = 32


def check_compressors(names: Sequence[str]) -> list[str]:
    """``names`` if every one is a compressor of :func:`compressors.names`; ValueError naming
    the first unknown one (and the choices) otherwise."""
    import compressors

    known = compressors.names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown compressor {unknown[0]!r}; choose from {', '.join(known)}")
    return list(names)


def trace_source(store: Store, *, path: str | Path | None = None, trace_id: int | None = None) -> Source:
    """The source of a trace given by directory ``path`` (registered in the store if it is not
    yet) or by its id in the store."""
    if trace_id is not None:
        row = store.trace(int(trace_id))
        if row is None:
            raise ValueError(f"trace #{trace_id} is not registered in {store.path}")
        return Source("trace", row["path"], int(trace_id))
    if path is None:
        raise ValueError("give a trace path or a trace id")
    resolved = str(Path(path).resolve())
    trace_id = store.trace_id_for_path(resolved)
    if trace_id is None:  # registered now, so its replays (and the commands that make them) have a name
        trace = traces.open(resolved)
        trace_id = store.register_trace(trace.path, trace.manifest)
    return Source("trace", resolved, trace_id)


def layout_source(name: str, *, device_flops_per_s: float = 100e12, batch_size: int = 32) -> Source:
    """The source of a full-size layout (:mod:`traces.layouts`)."""
    return Source("layout", str(name), None, float(device_flops_per_s), int(batch_size))


@functools.lru_cache(maxsize=16)
def _workload(source: Source) -> simulator.Workload:
    if source.kind == "layout":
        return simulator.workload_from_layout(source.ref, device_flops_per_s=source.device_flops_per_s,
                                              batch_size=source.batch_size)
    return simulator.workload_from_trace(traces.open(source.ref))


def workload(source: Source) -> simulator.Workload:
    """The :class:`simulator.Workload` of ``source`` (cached per source)."""
    return _workload(replace(source, trace_id=None))


def calibration(store: Store, *, required: bool = False) -> simulator.Calibration | None:
    """The newest calibration of the store with its per-operation fits; ``None`` when there is
    none, unless ``required``."""
    rows = store.calibration_rows()
    if not rows:
        if required:
            raise ValueError(f"the results store {store.path} has no calibration (run sidco calibrate)")
        return None
    return simulator.Calibration.from_rows(rows)


@dataclass(frozen=True)
class Cluster:
    """The scenario without the compressor: ``nodes`` machines, NIC ``bandwidth_bps`` (bits/s)
    and per-message ``latency_s`` (s), a topology, a fidelity and further
    :class:`simulator.Scenario` keyword ``options``."""

    nodes: int
    bandwidth_bps: float
    latency_s: float
    topology: str = "ring"
    fidelity: str = "analytic"
    options: Mapping[str, Any] = field(default_factory=dict)


def profile(store: Store, source: Source, compressors: Sequence[str], density: float | None, *,
            device: str = "cpu", profile_file: str | Path | None = None) -> simulator.CompressionProfile | None:
    """Compression costs of ``compressors`` at ``density`` for ``source`` (the policy);
    ``None`` when only ``none`` is asked."""
    pairs = [(c, density) for c in compressors if c != "none"]
    if not pairs:
        return None
    return compression_profile(store, trace_id=source.trace_id, device=device, pairs=pairs,
                               profile_file=profile_file)


def scenarios(store: Store, source: Source, cluster: Cluster, compressors: Sequence[str], density: float | None,
              *, device: str = "cpu", profile_file: str | Path | None = None, calibrated: bool = False,
              calibration_required: bool = False, timeline: bool = False) -> list[simulator.Scenario]:
    """One :class:`simulator.Scenario` per compressor (``density`` ignored for ``none``)."""
    costs = profile(store, source, compressors, density, device=device, profile_file=profile_file)
    constants = calibration(store, required=calibration_required) if calibrated else None
    wl = workload(source)
    return [
        simulator.Scenario(
            wl, cluster.nodes, cluster.bandwidth_bps, cluster.latency_s, name,
            None if name == "none" else density, topology=cluster.topology, fidelity=cluster.fidelity,
            profile=None if name == "none" else costs, calibration=constants, timeline=timeline,
            **dict(cluster.options),
        )
        for name in compressors
    ]


def project(store: Store, source: Source, cluster: Cluster, compressors: Sequence[str], density: float | None,
            *, device: str = "cpu", profile_file: str | Path | None = None, calibrated: bool = False,
            calibration_required: bool = False, timeline: bool = False,
            message_budget: int = MESSAGE_BUDGET) -> list[dict[str, Any]]:
    """Simulate one iteration per compressor: the :func:`simulator.simulate` result (seconds,
    bytes, samples/s, speed-up over ``none``) plus ``compressor`` and ``cost_source`` (where
    its compression costs came from; ``None`` for ``none``). ``message_budget``: the most
    link-level messages one scenario may take (:func:`simulator.limits.check_scenario`; a
    dashboard request passes a smaller one than the command line)."""
    results = []
    for scenario in scenarios(store, source, cluster, compressors, density, device=device,
                              profile_file=profile_file, calibrated=calibrated,
                              calibration_required=calibration_required, timeline=timeline):
        check_scenario(scenario, message_budget=message_budget)
        result = simulator.simulate(scenario)
        cost = None if scenario.profile is None else scenario.profile.cost(scenario.compressor, scenario.density)
        results.append({**result, "compressor": scenario.compressor,
                        "cost_source": None if cost is None else cost.source})
    return results
