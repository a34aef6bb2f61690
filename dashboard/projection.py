"""Projections for the dashboard: build simulator workloads and run scenarios.

A *source* is either a trace registered in the store (``"trace:<id>"``) or a
large-model layout from :mod:`traces.layouts` (``"layout:<name>"``). Workloads
and replay-derived compression profiles are cached per source, so a live
analytic update only pays for :func:`simulator.simulate`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import compressors
import simulator
import traces
from simulator.scenario import TOPOLOGIES
from simulator.units import parse_bandwidth, parse_duration

from results.store import Store

from dashboard import data

RESULT_KEYS = ("iteration_s", "samples_per_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s",
               "speedup")


class ProjectionError(ValueError):
    """A projection could not be made (bad control value, unreadable trace, failed measurement); one line."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def compressor_names() -> list[str]:
    """The compressors the library offers (:func:`compressors.names`)."""
    return list(compressors.names())


def layout_names() -> list[str]:
    """The large-model layouts of :mod:`traces.layouts`."""
    return list(traces.layouts.names())


def sources(store: Store) -> list[dict[str, str]]:
    """Dropdown options: registered traces first, then the large-model layouts."""
    options = [
        {"label": f"trace #{t['id']}: {t['workload'] or 'trace'} ({t['workers']} workers)", "value": f"trace:{t['id']}"}
        for t in data.traces(store)
    ]
    options += [{"label": f"layout: {name}", "value": f"layout:{name}"} for name in layout_names()]
    return options


@dataclass(frozen=True)
class Source:
    """A parsed source value."""

    kind: str  # "trace" or "layout"
    ref: str  # trace id (as text) or layout name

    @classmethod
    def parse(cls, value: str | None) -> Source:
        """Parse ``"trace:<id>"`` / ``"layout:<name>"``; raise ProjectionError otherwise."""
        if not value or ":" not in str(value):
            raise ProjectionError("choose a trace or a model layout")
        kind, ref = str(value).split(":", 1)
        if kind not in ("trace", "layout") or not ref:
            raise ProjectionError(f"unknown source {value!r}")
        if kind == "trace" and not ref.isdigit():
            raise ProjectionError(f"unknown trace {ref!r}")
        return cls(kind, ref)


@functools.lru_cache(maxsize=16)
def _trace_workload(path: str):
    try:
        return simulator.workload_from_trace(traces.open(path))
    except (ValueError, OSError) as exc:
        raise ProjectionError(_first_line(exc)) from exc


@functools.lru_cache(maxsize=16)
def _layout_workload(name: str):
    try:
        return simulator.workload_from_layout(name)
    except (ValueError, KeyError) as exc:
        raise ProjectionError(f"layout {name!r}: {_first_line(exc)}") from exc


def workload(store: Store, source: Source):
    """The :class:`simulator.Workload` of ``source`` (cached per trace path / layout)."""
    if source.kind == "layout":
        return _layout_workload(source.ref)
    row = data.trace_row(store, int(source.ref))
    if row is None:
        raise ProjectionError(f"trace #{source.ref} is not registered in the store")
    return _trace_workload(row["path"])


_PROFILE_COLUMNS = (
    "compressor, density, error_feedback, iteration, worker, bucket, numel, selected, achieved_density,"
    " achieved_over_target, threshold, stages, compress_s, decompress_s, wire_bytes, rel_error"
)


def _latest_replay_id(store: Store, trace_id: int) -> int | None:
    rows = store.query(
        "SELECT id FROM replays WHERE trace_id=? ORDER BY created DESC, id DESC LIMIT 1", (trace_id,)
    )
    return int(rows[0][0]) if rows else None


@functools.lru_cache(maxsize=32)
def _profile(store_path: str, replay_id: int, compressor: str, density: float, landed: int):
    store = Store(store_path)
    try:
        rows = [
            dict(r)
            for r in store.query(
                f"SELECT {_PROFILE_COLUMNS} FROM replay_rows WHERE replay_id=? AND compressor=? AND density=?",
                (replay_id, compressor, density),
            )
        ]
    finally:
        store.close()
    if not rows:
        return None
    return simulator.CompressionProfile.from_replay_rows(rows)


@functools.lru_cache(maxsize=64)
def _measured_profile(path: str | None, compressor: str, density: float):
    try:
        if path is None:
            return simulator.CompressionProfile.synthetic([compressor], [density])
        return simulator.CompressionProfile.from_trace(traces.open(path), [compressor], [density])
    except (ValueError, OSError) as exc:
        raise ProjectionError(f"cannot measure {compressor} costs: {_first_line(exc)}") from exc


def profile(store: Store, source: Source, compressor: str, density: float):
    """The compression profile for (compressor, density) on ``source``; ``None`` for ``none``.

    A trace uses its latest replay's rows when they cover the pair, else the
    costs are measured on the trace's own gradients (two iterations); a layout
    has no gradients, so costs are measured on a synthetic Laplace vector of
    2^20 elements on this machine. Measurements are cached per pair.
    """
    if compressor == "none":
        return None
    if source.kind == "layout":
        return _measured_profile(None, compressor, float(density))
    replay_id = _latest_replay_id(store, int(source.ref))
    if replay_id is not None:
        landed = int(store.query(
            "SELECT COUNT(*) FROM replay_rows WHERE replay_id=? AND compressor=? AND density=?",
            (replay_id, compressor, density),
        )[0][0])
        if landed:
            return _profile(str(store.path), replay_id, compressor, float(density), landed)
    row = data.trace_row(store, int(source.ref))
    if row is None:
        raise ProjectionError(f"trace #{source.ref} is not registered in the store")
    return _measured_profile(row["path"], compressor, float(density))


def calibration(store: Store):
    """The newest :class:`simulator.Calibration` from the store, or ``None``."""
    return simulator.Calibration.latest(store.path)


@dataclass(frozen=True)
class Controls:
    """Validated what-if controls (units: bits/s, seconds)."""

    source: Source
    compressors: tuple[str, ...]
    density: float
    nodes: int
    bandwidth_bps: float
    latency_s: float
    topology: str
    calibrated: bool = False


def parse_controls(
    source: str | None,
    compressors: list[str] | None,
    density: Any,
    nodes: Any,
    bandwidth: str | None,
    latency: str | None,
    topology: str | None,
    calibrated: bool = False,
) -> Controls:
    """Validate raw control values; raise ProjectionError naming the first bad one."""
    parsed_source = Source.parse(source)
    if not compressors:
        raise ProjectionError("choose at least one compressor")
    known = set(compressor_names())
    unknown = [c for c in compressors if c not in known]
    if unknown:
        raise ProjectionError(f"unknown compressor {unknown[0]!r}")
    try:
        density_value = float(density)
    except (TypeError, ValueError):
        raise ProjectionError(f"density must be a number in (0, 1], got {density!r}") from None
    if not 0.0 < density_value <= 1.0:
        raise ProjectionError(f"density must be in (0, 1], got {density_value:g}")
    try:
        nodes_value = int(nodes)
    except (TypeError, ValueError):
        raise ProjectionError(f"nodes must be a whole number ≥ 1, got {nodes!r}") from None
    if nodes_value < 1 or nodes_value != float(nodes):
        raise ProjectionError(f"nodes must be a whole number ≥ 1, got {nodes!r}")
    if topology not in TOPOLOGIES:
        raise ProjectionError(f"unknown topology {topology!r}")
    try:
        bandwidth_bps = parse_bandwidth(bandwidth or "")
        latency_s = parse_duration(latency or "")
    except ValueError as exc:
        raise ProjectionError(str(exc)) from None
    return Controls(
        parsed_source, tuple(compressors), density_value, nodes_value, bandwidth_bps, latency_s, topology, calibrated
    )


def scenario(store: Store, controls: Controls, compressor: str, fidelity: str, **extra: Any):
    """The :class:`simulator.Scenario` for one compressor under ``controls``."""
    return simulator.Scenario(
        workload=workload(store, controls.source),
        nodes=controls.nodes,
        bandwidth_bps=controls.bandwidth_bps,
        latency_s=controls.latency_s,
        compressor=compressor,
        density=None if compressor == "none" else controls.density,
        topology=controls.topology,
        fidelity=fidelity,
        profile=profile(store, controls.source, compressor, controls.density),
        calibration=calibration(store) if controls.calibrated else None,
        **extra,
    )


def project(store: Store, controls: Controls, fidelity: str = "analytic") -> list[dict[str, Any]]:
    """Simulate every chosen compressor; one dict of :data:`RESULT_KEYS` (+ compressor) each."""
    results = []
    for compressor in controls.compressors:
        try:
            result = simulator.simulate(scenario(store, controls, compressor, fidelity))
        except (ValueError, KeyError) as exc:
            raise ProjectionError(f"{compressor}: {_first_line(exc)}") from exc
        row = {key: result.get(key) for key in RESULT_KEYS}
        row["compressor"] = compressor
        row["fidelity"] = fidelity
        results.append(row)
    return results


def timeline(store: Store, controls: Controls, fidelity: str = "des") -> dict[str, Any]:
    """One simulated iteration of ``controls.compressors[0]`` as Chrome/Perfetto trace JSON."""
    compressor = controls.compressors[0]
    try:
        result = simulator.simulate(scenario(store, controls, compressor, fidelity, timeline=True))
    except (ValueError, KeyError) as exc:
        raise ProjectionError(f"{compressor}: {_first_line(exc)}") from exc
    return simulator.chrome_trace(result["timeline"], {"compressor": compressor, "nodes": controls.nodes,
                                                       "fidelity": fidelity, "iteration_s": result["iteration_s"]})
