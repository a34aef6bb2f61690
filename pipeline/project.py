"""Projections: one simulated iteration of a trace or layout on a cluster, per compressor.

``sidco simulate`` and the dashboard's What-if and Timeline pages fill one
:class:`pipeline.request.Request`, :func:`resolve` it to a :class:`Projection` and call
:func:`project`, so they show the same numbers: :func:`resolve` looks the request's workload and
modelled device up once (:func:`pipeline.request.resolve_device`), the workload comes from
:func:`workload`, the compression costs from the one policy
(:func:`pipeline.costs.compression_profile`, on the source's device), the calibration from the
store. Compare, sweeps and time to accuracy take the same :class:`Projection`. Units: seconds,
bits/s, bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from costs import anchor, devices, throughput
from costs.throughput import DEFAULT_PRECISION
import simulator
from simulator.band import band
from simulator.limits import check_scenario
from simulator.timeline import check_output_path, chrome_trace, write_chrome_trace  # a projection's timeline, written by the doors
import traces
from pipeline.costs import compression_profile, cost_band
from pipeline.request import Cluster, Request, WorkloadRequest, parse_calibration, resolve_device
from results.store import Store
from units import Pair
from simulator.workload import scaled, workload_by_flops

__all__ = ["Cluster", "Projection", "Request", "Source", "WorkloadRequest", "calibration", "check_options",
           "check_output_path", "chrome_trace", "layout_source", "options", "project", "project_pairs", "register", "registered", "resolve", "scenarios",
           "trace_source", "workload", "workload_facts", "workload_text", "write_chrome_trace"]


@dataclass(frozen=True)
class Source:
    """Where the workload comes from: a trace directory (``kind="trace"``, ``ref`` its resolved
    path, ``trace_id`` its id in the store or ``None``; its compute times × ``compute_scale``, or,
    with ``by_flops``, its per-layer FLOPs at ``device_flops_per_s`` FLOP/s and the optimizer at
    ``memory_bandwidth_Bps`` bytes/s, layers without FLOPs × ``compute_scale``) or a layout
    (``kind="layout"``, ``ref`` its name, computed at ``device_flops_per_s`` FLOP/s with
    ``batch_size`` samples per worker, the optimizer at ``memory_bandwidth_Bps`` bytes/s).
    ``compute`` says where the compute times come from (every result repeats it);
    ``precision`` what it was projected for (``fp32``, ``tf32``, ``amp``); ``compute_low`` /
    ``compute_high``: factors on every compute time spanning the compute rule's measured error
    (:func:`costs.throughput.compute`; 1 for the trace's own timings). ``device``: the
    modelled device (:func:`pipeline.request.resolve_device`, looked up once), the one channel
    on which it reaches the compute rule and the compression costs
    (:func:`costs.devices.unrecorded_gpu` for a trace kept on the GPU it was captured on). It
    takes no part in equality: the workload depends on the device only through the numbers above. ``tokens``: a transformer
    layout's sequence length (``None``: its stated input, :func:`traces.layouts.stated_tokens`);
    ``compute_from``: where compute came from in one word: ``rule`` (fitted to published
    throughput), ``measured`` (``--samples-per-s``), ``profiled`` (``--step-profile``), ``given``
    (``--device-flops``) or ``trace``."""

    kind: str
    ref: str
    trace_id: int | None = None
    device_flops_per_s: float = 100e12
    batch_size: int = 32
    memory_bandwidth_Bps: float = 2e12
    compute_scale: float = 1.0
    compute: str = ""
    by_flops: bool = False
    precision: str = DEFAULT_PRECISION
    compute_low: float = 1.0
    compute_high: float = 1.0
    tokens: int | None = None
    compute_from: str = "rule"
    device: devices.Device = field(compare=False, kw_only=True)


def capture_device(trace_path: str | Path) -> str:
    """The device a trace was captured on (its timings' ``device``: ``cpu``, ``cuda:0``…)."""
    return str(traces.open(trace_path).timings.get("device", "cpu"))


def _flop_text(flops: float) -> str:
    """``flops`` FLOPs with an SI prefix, e.g. ``2.1 GFLOP``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if flops >= scale:
            return f"{flops / scale:.3g} {prefix}FLOP"
    return f"{flops:.3g} FLOP"


def _ratio(captured: str, target: devices.Device, precision: str) -> tuple[float, str]:
    """The measured host/device ratio rule: factor on a trace's times captured on ``captured``
    projected onto ``target`` in ``precision``, and its description."""
    if captured.split(":")[0] != "cpu":
        return 1.0, f"trace timings ({captured}; its GPU model is not recorded, times kept for {target.name})"
    host = devices.get("cpu")
    ratio = devices.compute_ratio(host, target, precision)
    measured = f"measured {host.measured}" if host.measured else "stated default"
    return ratio, (f"trace timings ({captured}) x {ratio:.3g}: this host's fp32 peak {host.fp32_flops / 1e9:.3g} "
                   f"GFLOP/s ({measured}) over {target.name}'s {target.dtype(precision)} peak "
                   f"{target.peak_flops(precision) / 1e12:.3g} TFLOP/s")


def _projected(path: str, target: devices.Device, precision: str) -> dict[str, Any]:
    """The :class:`Source` fields projecting the trace at ``path`` onto ``target`` in
    ``precision``. The rule: the trace's own timings on the device it was captured on;
    elsewhere its per-layer FLOPs at the compute rule's FLOP/s (:func:`costs.throughput.compute`,
    the kind of model from the trace's shapes) when the trace carries them (layers without
    FLOPs by the ratio rule), else every time × the ratio rule (:func:`_ratio`, with the
    unfitted CPU band)."""
    captured = capture_device(path)
    kept = {"compute": f"trace timings ({captured})", "precision": precision, "device": target, "compute_from": "trace"}
    if target.name == captured.split(":")[0]:
        return kept
    ratio, ratio_note = _ratio(captured, target, precision)
    trace = traces.open(path)
    if trace.forward_flops is None:
        low, high = throughput.UNMEASURED_CPU_BAND
        return {"compute_scale": ratio, "compute": f"{ratio_note} (band x{low:g}-{high:g})", "precision": precision,
                "compute_from": "trace",
                "compute_low": low, "compute_high": high, "device": target}
    kind = throughput.kind_of([tuple(shape) for _, shape in trace.layers], trace.forward_flops)
    rule = throughput.compute(target, precision, kind)
    per_sample = sum(trace.forward_flops) / trace.flops_batch_size
    note = (f"per-layer FLOPs of the trace ({_flop_text(per_sample)} per sample, counted on {captured}) at "
            f"{rule.note}, optimizer at {target.memory_bandwidth_Bps / 1e12:.3g} TB/s")
    without = sum(1 for f in trace.forward_flops if f <= 0)
    if without:
        note += f"; {without} of {len(trace.forward_flops)} layers without FLOPs: {ratio_note}"
    return {"compute_scale": ratio, "compute": note, "by_flops": True, "device_flops_per_s": rule.flops_per_s,
            "memory_bandwidth_Bps": target.memory_bandwidth_Bps, "precision": precision,
            "compute_low": rule.low, "compute_high": rule.high, "device": target}


def _trace(ref: str, trace_id: int | None, device: str | None, precision: str) -> Source:
    throughput.check_precision(precision)
    target = resolve_device(device, layout=False, captured=capture_device(ref))
    return Source("trace", ref, trace_id, **_projected(ref, target, precision))


def register(store: Store, source: Source) -> Source:
    """``source`` with its trace's id in the store, the trace registered (or refreshed: the digest of
    its files, so replays of files that changed since are not used) now (so its replays, and the
    commands that make them, have a name); a layout as it is."""
    if source.kind != "trace" or source.trace_id is not None:
        return source
    trace = traces.open(source.ref)
    found = store.trace_id_for_path(str(trace.path.resolve()))
    content = trace.content_sha256()
    if found is None or (store.trace(found) or {}).get("content_sha256") != content:
        found = store.register_trace(trace.path, trace.manifest, content)
    return replace(source, trace_id=found)


def trace_source(store: Store, *, path: str | Path | None = None, trace_id: int | None = None,
                 device: str | None = None, precision: str = DEFAULT_PRECISION) -> Source:
    """The source of a trace given by directory ``path`` (registered in the store if it is not
    yet) or by its id in the store, projected onto the modelled ``device`` (a name; ``None``:
    the default rule of :func:`pipeline.request.resolve_device`) in ``precision`` when it was
    captured on another (rule: :func:`_projected`)."""
    if trace_id is not None:
        row = store.trace(int(trace_id))
        if row is None:
            raise ValueError(f"trace #{trace_id} is not registered in {store.path}")
        return _trace(row["path"], int(trace_id), device, precision)
    if path is None:
        raise ValueError("give a trace path or a trace id")
    return register(store, _trace(str(Path(path).resolve()), None, device, precision))


def layout_source(name: str, *, device: str | None = None, device_flops_per_s: float | None = None,
                  batch_size: int = 32, precision: str = DEFAULT_PRECISION, samples_per_s: float | None = None,
                  tokens: int | None = None, step_profile: str | anchor.StepProfile | None = None) -> Source:
    """The source of a full-size layout (:mod:`traces.layouts`, at ``tokens`` tokens per sample
    for a transformer) on the modelled ``device`` (a name; ``None``: the default rule of
    :func:`pipeline.request.resolve_device`) in ``precision``: its FLOPs at the compute rule's
    FLOP/s (:func:`costs.throughput.compute`, fitted to published training throughput), or
    at the rate a measured single-GPU throughput ``samples_per_s`` at ``batch_size`` implies
    (:func:`costs.anchor.measured`, with the measurement's band), or at the rate of the step
    profile ``step_profile`` (``sidco profile --model``, a file's path or a stored profile read:
    its throughput and the spread of its steps), or at ``device_flops_per_s`` as given (no band);
    its optimizer at the device's memory bandwidth."""
    throughput.check_precision(precision)
    target = resolve_device(device, layout=True)
    if step_profile is not None:
        step, named = anchor.step_named(step_profile)
        scaled = "" if step.scale == 1 else (f"; layers 0-{step.layers_timed - 1} of {step.layers} timed, their time "
                                             f"scaled x{step.scale:.4g}")
        rule = anchor.measured(name, target, int(batch_size), step.samples_per_s, tokens, precision,
                               by=f"sidco profile --model, {named}{scaled}", spread=step.spread)
        flops, note, low, high, where = rule.flops_per_s, f"layout FLOPs at {rule.note}", rule.low, rule.high, "profiled"
    elif samples_per_s is not None:
        rule = anchor.measured(name, target, int(batch_size), float(samples_per_s), tokens, precision)
        flops, note, low, high, where = rule.flops_per_s, f"layout FLOPs at {rule.note}", rule.low, rule.high, "measured"
    elif device_flops_per_s is None:
        rule = throughput.compute(target, precision, throughput.layout_kind(name), name)
        flops, note, low, high, where = rule.flops_per_s, f"layout FLOPs at {rule.note}", rule.low, rule.high, "rule"
    else:
        flops, low, high, where = float(device_flops_per_s), 1.0, 1.0, "given"
        note = f"layout FLOPs at {flops / 1e12:.3g} TFLOP/s (--device-flops, as given: no band)"
    return Source("layout", str(name), None, flops, int(batch_size), target.memory_bandwidth_Bps, 1.0, note,
                  precision=precision, compute_low=low, compute_high=high, device=target, tokens=tokens,
                  compute_from=where)


def _source(request: WorkloadRequest, store: Store | None) -> Source:
    """The workload of ``request`` on its modelled device, the device resolved here, once
    (:func:`pipeline.request.resolve_device`). A trace directory is registered only when a
    ``store`` is given; a trace given by its id needs the ``store``."""
    if request.computed is not None:
        return layout_source(request.computed, device=request.device, device_flops_per_s=request.device_flops_per_s,
                             batch_size=request.batch_size, precision=request.precision,
                             samples_per_s=request.samples_per_s, tokens=request.tokens,
                             step_profile=request.step_profile)
    if request.trace_id is not None:
        if store is None:
            raise ValueError("a trace given by its id needs the results store")
        return trace_source(store, trace_id=request.trace_id, device=request.device, precision=request.precision)
    found = _trace(str(Path(request.trace).resolve()), None, request.device, request.precision)
    return found if store is None else register(store, found)


@functools.lru_cache(maxsize=16)
def _workload(source: Source) -> simulator.Workload:
    if source.kind == "layout":
        return simulator.workload_from_layout(source.ref, device_flops_per_s=source.device_flops_per_s,
                                              batch_size=source.batch_size,
                                              memory_bandwidth_Bps=source.memory_bandwidth_Bps, tokens=source.tokens)
    if source.by_flops:
        return workload_by_flops(traces.open(source.ref), source.device_flops_per_s, source.memory_bandwidth_Bps,
                                 source.compute_scale)
    return scaled(simulator.workload_from_trace(traces.open(source.ref)), source.compute_scale)


def workload(source: Source) -> simulator.Workload:
    """The :class:`simulator.Workload` of ``source`` (cached per source)."""
    return _workload(replace(source, trace_id=None))


def options(given: Mapping[str, Any], workload: simulator.Workload) -> dict[str, Any]:
    """The :class:`simulator.Scenario` keyword options ``given`` (a cluster's) on ``workload``:
    ``jitter`` ``"trace"`` is the coefficient of variation measured in the workload's trace."""
    chosen = dict(given)
    if chosen.get("jitter") == "trace":
        chosen["jitter"] = workload.compute_cv
    return chosen


@dataclass(frozen=True)
class Projection:
    """What was asked, with nothing left to look up: the checked ``request`` (a
    :class:`pipeline.request.Request`, or a :class:`pipeline.request.WorkloadRequest` where a
    sweep's grid or a convergence run gives the cluster and the pairs), its ``source`` (the
    workload on one resolved :class:`costs.devices.Device`), the ``workload`` built from it
    and the (compressor, density) ``pairs`` to project (density ``None`` for a compressor that
    takes none). Made by :func:`resolve` only."""

    request: WorkloadRequest
    source: Source
    workload: simulator.Workload = field(compare=False)
    pairs: tuple[Pair, ...] = ()

    @property
    def cluster(self) -> Cluster:
        """The request's cluster; ValueError when the request is of the workload alone."""
        if not isinstance(self.request, Request):
            raise ValueError("a projection needs a cluster")
        return self.request.cluster

    @property
    def budget(self) -> int:
        """The most link-level messages one scenario may take (:func:`simulator.limits.check_scenario`)."""
        return self.request.message_budget


def resolve(request: WorkloadRequest, store: Store | None = None) -> Projection:
    """The one resolver: ``request``'s source (its modelled device looked up once,
    :func:`pipeline.request.resolve_device`), workload and pairs, its cluster checked against
    the simulator's limits (:func:`check_options`). Without a ``store`` nothing is opened or
    written, so bad input is found first (a trace directory is registered by :func:`registered`
    once a store is open); a trace given by its id needs the ``store``."""
    found = _source(request, store)
    if isinstance(request, Request):
        check_options(found, request.cluster)
    return Projection(request, found, workload(found), tuple(request.pairs()) if isinstance(request, Request) else ())


def registered(store: Store, projection: Projection) -> Projection:
    """``projection`` with its trace registered in ``store`` (:func:`register`)."""
    return replace(projection, source=register(store, projection.source))


def check_options(source: Source, cluster: Cluster) -> None:
    """Raise ``ValueError`` (one line) if ``cluster`` on ``source``'s workload is outside the
    simulator's limits: checked before any store is opened or created, so bad input writes nothing."""
    wl = workload(source)
    simulator.Scenario(wl, cluster.nodes, cluster.bandwidth_bps, cluster.latency_s, topology=cluster.topology,
                       fidelity=cluster.fidelity, **options(cluster.options, wl))


def calibration(store: Store, choice: str | int = "latest", *,
                required: bool = False) -> simulator.Calibration | None:
    """The calibration ``choice`` names, with its per-operation fits: ``latest`` (the newest;
    ``None`` when the store has none, unless ``required``), a calibration id (ValueError if
    there is no such pooled row) or ``none`` (``None``)."""
    choice = parse_calibration(choice)
    if choice == "none":
        return None
    rows = store.calibration_rows(None if choice == "latest" else choice)
    if not rows and choice != "latest":
        raise ValueError(f"no calibration with id {choice} in {store.path}")
    if not rows:
        if required:
            raise ValueError(f"the results store {store.path} has no calibration (run sidco calibrate)")
        return None
    return simulator.Calibration.from_rows(rows)


def _costs(store: Store, source: Source, request: WorkloadRequest, compressors: Sequence[str],
           density: float | None) -> simulator.CompressionProfile | None:
    """Compression costs of ``compressors`` at ``density`` for ``source`` on its device (the
    policy, with the request's profile file or stored profile first); ``None`` when only
    ``none`` is asked."""
    pairs = [(c, density) for c in compressors if c != "none"]
    if not pairs:
        return None
    return compression_profile(store, trace_id=source.trace_id, device=source.device, pairs=pairs,
                               profile_file=request.profile_file, profile_id=request.profile_id)


def scenarios(store: Store, projection: Projection, compressors: Sequence[str],
              density: float | None) -> list[simulator.Scenario]:
    """One :class:`simulator.Scenario` per compressor of ``projection`` on its cluster at
    ``density`` (ignored for ``none``); the calibration the request names (``latest``, an id,
    ``none``) must exist."""
    source, request = projection.source, projection.request
    costs = _costs(store, source, request, compressors, density)
    constants = calibration(store, request.calibration, required=True)
    cluster, wl = projection.cluster, projection.workload
    timeline = bool(getattr(request, "timeline", False))
    return [
        simulator.Scenario(
            wl, cluster.nodes, cluster.bandwidth_bps, cluster.latency_s, name,
            None if name == "none" else density, topology=cluster.topology, fidelity=cluster.fidelity,
            profile=None if name == "none" else costs, calibration=constants, timeline=timeline,
            **options(cluster.options, wl),
        )
        for name in compressors
    ]


def _groups(pairs: Sequence[Pair]) -> list[tuple[list[str], float | None]]:
    """``pairs`` grouped as they are projected: the density-free compressors together, at 1
    (the casts, the quantizers and PowerSGD send what their dtype, block format or rank sets), then each
    density's."""
    free = [c for c, d in pairs if d is None]
    groups: list[tuple[list[str], float | None]] = [(free, None if free == ["none"] else 1.0)] if free else []
    return groups + [([c for c, d in pairs if d == density], density)
                     for density in dict.fromkeys(d for _, d in pairs if d is not None)]


def project_pairs(store: Store, projection: Projection) -> list[tuple[Pair, dict[str, Any]]]:
    """Simulate one iteration per pair of ``projection``, density-free pairs first, then by
    density: each pair (density ``None`` for a compressor that takes none) with its result, the
    :func:`simulator.simulate` result (seconds, bytes, samples/s, speed-up over ``none``) plus
    ``compressor``, ``cost_source`` (where its compression costs came from; ``None`` for
    ``none``), ``device`` (the source's modelled device) and ``compute_source`` (where the
    compute times come from). Every scenario is checked against the request's message budget
    (:func:`simulator.limits.check_scenario`; a dashboard request passes a smaller one than the
    command line)."""
    projection = registered(store, projection)
    source = projection.source
    device = source.device.name
    results = []
    for names, density in _groups(projection.pairs):
        for scenario in scenarios(store, projection, names, density):
            check_scenario(scenario, message_budget=projection.budget)
            result = simulator.simulate(scenario)
            cost = None if scenario.profile is None else scenario.profile.cost(scenario.compressor, scenario.density)
            costs = (1.0, 1.0) if cost is None else cost_band(cost, device, scenario.compressor, scenario.density,
                                                              source.device)
            pair = Pair(scenario.compressor, None if (scenario.compressor, None) in projection.pairs else density)
            results.append((pair, {
                **result, "compressor": scenario.compressor, "device": device, "precision": source.precision,
                "compute_source": source.compute, "cost_source": None if cost is None else cost.source,
                **workload_facts(source), "compute_band": [source.compute_low, source.compute_high],
                "cost_band": list(costs),
                **band(scenario, result, (source.compute_low, source.compute_high), costs)}))
    return results


def project(store: Store, projection: Projection) -> list[dict[str, Any]]:
    """The results of :func:`project_pairs`, what ``sidco simulate --json`` prints per compressor."""
    return [result for _, result in project_pairs(store, projection)]


def workload_facts(source: Source) -> dict[str, Any]:
    """What a projection assumed of the workload, as every result and header states it:
    ``batch_size`` (samples per worker), ``tokens`` (a transformer layout's sequence length,
    ``None`` otherwise), ``tokens_stated`` (``True`` when that is the layout's stated input,
    :data:`traces.layouts.TOKENS`, not ``--tokens``) and ``compute_from`` (:class:`Source`)."""
    stated = traces.layouts.stated_tokens(source.ref) if source.kind == "layout" else None
    return {"batch_size": workload(source).batch_size, "tokens": source.tokens or stated,
            "tokens_stated": source.tokens is None and stated is not None, "compute_from": source.compute_from}


COMPUTE_FROM = {"rule": "the rule fitted to published training throughput (docs/devices.md)",
                "measured": "your measured throughput (--samples-per-s)",
                "profiled": "your measured training step (sidco profile --model, --step-profile)",
                "given": "--device-flops as given", "trace": "the trace's own timings"}
"""Where compute came from, in words, by :attr:`Source.compute_from`."""


def workload_text(result: Mapping[str, Any]) -> str:
    """The header line of a projection's workload from one of its results (:func:`project`):
    batch, tokens, precision and where compute came from (the same for both doors)."""
    tokens = ""
    if result.get("tokens") is not None:
        tokens = f", {result['tokens']} tokens per sample" + (
            " (the layout's stated input; --tokens changes it)" if result["tokens_stated"] else " (--tokens)")
    return (f"batch {result['batch_size']} per worker{tokens}, precision {result['precision']}; compute from "
            f"{COMPUTE_FROM[result['compute_from']]}")
