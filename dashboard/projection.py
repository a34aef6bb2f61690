"""Projections for the dashboard: map the controls to a :class:`pipeline.request.Request`,
call :func:`pipeline.project.project` of the resolved request.

A *source* control is either a trace registered in the store (``"trace:<id>"``) or a
large-model layout from :mod:`traces.layouts` (``"layout:<name>"``) or a shipped model from its
config (:mod:`traces.llm`, ``"model:<name>"``). The checks (densities,
compressors, cluster, device) are the request's, the same as ``sidco simulate``'s. The workload, the
compression costs (the one policy: stored replay rows or device profiles; nothing is timed
inside a request) and the calibration come from the orchestration layer, so the What-if
page shows what ``sidco simulate`` prints for the same scenario.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from pipeline import profile as pipeline_profile
from pipeline import project as pipeline_project
from pipeline import verdict
from pipeline.memory import MEMORY_KEYS, memory_of
from pipeline import quality as pipeline_quality
from pipeline.catalog import TOPOLOGIES, compressor_names as _compressor_names, layout_names as _layout_names
from pipeline.catalog import model_names as _model_names
from pipeline.project import chrome_trace
from pipeline.request import (DEFAULT_LAYOUT_DEVICE, DTYPE_CHOICES, PARALLEL_CHOICES, PARAM_DTYPE, REDUCE_DTYPE, Cluster,
                              Request, device_choices, one_way_latencies, pair, parallel_options, sites_options)
from results.store import Store, row_id
from units import parse_bandwidth, parse_duration


PAGE_MESSAGE_BUDGET = 50_000_000
"""Link-level messages one page request may simulate (a few seconds on one core); the
command line allows :data:`pipeline.catalog.MESSAGE_BUDGET`."""

RESULT_KEYS = ("iteration_s", "samples_per_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s",
               "speedup", "iteration_s_low", "iteration_s_high", "speedup_low", "speedup_high")


SHARDED_KEYS = ("collective", "parallel", "shard_size", "micro_batches")
"""What a row adds under ``--parallel`` (``collective``: what its compressor replaces; under DDP
``collective`` is absent, as from ``sidco simulate --json``)."""

PARALLEL = PARALLEL_CHOICES
"""The ``--parallel`` choices (``ddp`` the default)."""

DTYPES = DTYPE_CHOICES
DEFAULT_DTYPES = {"reduce": REDUCE_DTYPE, "param": PARAM_DTYPE}
"""The page's reduce and parameter dtypes before the user picks: the command line's defaults."""
"""The reduce and parameter dtypes a sharded plan takes."""


class ProjectionError(ValueError):
    """A projection could not be made (bad control value, unreadable trace, missing compression costs); one line."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def compressor_names() -> list[str]:
    """The compressors the library offers (:func:`compressors.names`)."""
    return list(_compressor_names())


def layout_names() -> list[str]:
    """The large-model layouts of :mod:`traces.layouts`."""
    return list(_layout_names())


def sources(store: Store) -> list[dict[str, str]]:
    """Dropdown options: registered traces first, then the large-model layouts and the shipped models."""
    options = [
        {"label": f"trace #{t['id']}: {t['workload'] or 'trace'} ({t['workers']} workers)", "value": f"trace:{t['id']}"}
        for t in store.trace_list()
    ]
    options += [{"label": f"layout: {name}", "value": f"layout:{name}"} for name in layout_names()]
    options += [{"label": f"model: {name}", "value": f"model:{name}"} for name in _model_names()]
    return options


def device_options() -> list[dict[str, str]]:
    """Device dropdown: the default (a GPU for layouts, a trace's own device) and every known device."""
    return [{"label": f"default ({DEFAULT_LAYOUT_DEVICE} for layouts, a trace's own device)",
             "value": ""}] + [{"label": label, "value": name} for name, label in device_choices()]


def cost_options(store: Store) -> list[dict[str, str]]:
    """Compression-cost dropdown: the policy (replays, stored and shipped profiles, the cost
    model) or one stored device profile by hand."""
    options = [{"label": "by the policy: replays, measured profiles, else the cost model", "value": ""}]
    for row in store.device_profile_list():
        day = time.strftime("%Y-%m-%d", time.gmtime(row["created"]))
        options.append({"label": f"profile #{row['id']}: measured {row['device']} {day} ({row['rows']} rows)",
                        "value": str(row["id"])})
    return options


def step_options(store: Store) -> list[dict[str, str]]:
    """Measured-step dropdown: none (compute from the rule or the measured samples/s), or one step
    profile ``sidco profile --model`` stored (``--step-profile``; the page opens no typed path)."""
    options = [{"label": "none: the rule fitted to published throughput, or the samples/s above", "value": ""}]
    for row in store.step_profiles():
        day = time.strftime("%Y-%m-%d", time.gmtime(row["created"]))
        options.append({"label": f"step #{row['id']}: {row['model']} on {row['device']}, batch {row['batch_size']} × "
                                 f"{row['tokens']} tokens, {row['precision']}, {row['step_s'] * 1e3:.4g} ms ({day})",
                        "value": str(row["id"])})
    return options


def stored_step(store: Store, value: str | int | None) -> Any:
    """The stored step profile a measured-step control names (:func:`pipeline.profile.stored_step`),
    ``None`` when blank; ProjectionError (one line) when the store has none with that id."""
    if value in (None, ""):
        return None
    try:
        return pipeline_profile.stored_step(store, value)
    except ValueError as exc:
        raise ProjectionError(_first_line(exc)) from None


def workload_fields(value: str | None) -> dict[str, Any]:
    """The request's workload of a source control value: ``"trace:<id>"`` (``trace_id``),
    ``"layout:<name>"`` (``layout``) or ``"model:<name>"`` (``model``); ProjectionError otherwise."""
    if not value or ":" not in str(value):
        raise ProjectionError("choose a trace or a model layout")
    kind, ref = str(value).split(":", 1)
    if kind not in ("trace", "layout", "model") or not ref:
        raise ProjectionError(f"unknown source {value!r}")
    if kind in ("layout", "model"):
        return {kind: ref}
    try:
        return {"trace_id": row_id(ref, "trace")}
    except ValueError as exc:
        raise ProjectionError(str(exc)) from None


LATENCY_HINT = "one-way, with unit: 50us, 1ms; or a round trip: rtt 100us (one-way = half)"
"""The hint under a page's latency field: what :func:`parse_latency` accepts."""


def parse_latency(text: str | None) -> float:
    """A page's latency field as one one-way per-message latency (s): ``50us`` is one-way (``--latency``),
    ``rtt 100us`` or ``100us rtt`` a round trip (``--rtt``), through :func:`pipeline.request.one_way_latencies`.
    ValueError for anything else, a list included."""
    words = str(text or "").split()
    rtt = [w for w in words if w.lower() == "rtt"]
    value = " ".join(w for w in words if w.lower() != "rtt")
    if not value:
        raise ValueError("give a latency, e.g. 50us (one-way) or rtt 100us")
    if len(rtt) > 1 or "," in value:
        raise ValueError(f"invalid latency {str(text)[:40]!r}: one duration, e.g. 50us (one-way) or rtt 100us")
    latencies = one_way_latencies(None, value) if rtt else one_way_latencies(value, None)
    return latencies[0]


def parse_controls(
    source: str | None,
    compressors: list[str] | None,
    density: Any,
    nodes: Any,
    bandwidth: str | None,
    latency: str | None,
    topology: str | None,
    calibrated: bool = False,
    device: str | None = None,
    profile_id: str | int | None = None,
    samples_per_s: str | float | None = None,
    tokens: str | int | None = None,
    sites: str | int | None = None,
    wan_bandwidth: str | None = None,
    wan_rtt: str | None = None,
    *,
    gpus_per_node: str | int | None = None,
    batch_size: str | int | None = None,
    parallel: str | None = None,
    shard_size: str | int | None = None,
    micro_batch: str | int | None = None,
    reduce_dtype: str | None = None,
    param_dtype: str | None = None,
    checkpointing: bool = False,
    step_profile: Any = None,
) -> Request:
    """The request of raw control values (text parsed here, checked by the request:
    :class:`pipeline.request.Request`; ``sites`` blank is one site, the WAN's rule
    :func:`pipeline.request.sites_options`); ProjectionError naming the first bad one. ``gpus_per_node``
    and ``batch_size`` (sequences or samples per GPU) blank for the defaults (1, 32); ``parallel`` and
    the rest of its family as ``sidco simulate``'s ``--parallel`` options
    (:func:`pipeline.request.parallel_options`, blank or ``None`` for their defaults); ``step_profile`` a
    stored step profile (:func:`stored_step`) anchoring a model's compute as ``--step-profile`` does."""
    fields = workload_fields(source)
    if not compressors:
        raise ProjectionError("choose at least one compressor")
    if not isinstance(compressors, (list, tuple)) or not all(isinstance(c, str) for c in compressors):
        raise ProjectionError(f"compressors must be a list of names, got {compressors!r:.60}")
    if len(set(compressors)) != len(compressors):  # also caps the list at the compressors that exist
        repeated = next(c for i, c in enumerate(compressors) if c in compressors[:i])
        raise ProjectionError(f"compressor {repeated[:40]!r} is chosen twice; choose each at most once")
    try:
        density_value = float(density)
    except (TypeError, ValueError):
        raise ProjectionError(f"density must be a number in (0, 1], got {density!r}") from None
    try:
        nodes_value = int(nodes)
    except (TypeError, ValueError, OverflowError):
        raise ProjectionError(f"nodes must be a whole number ≥ 1, got {nodes!r}") from None
    if nodes_value != float(nodes) or nodes_value < 1:
        raise ProjectionError(f"nodes must be a whole number ≥ 1, got {nodes!r}")
    anchors = {"samples_per_s": _optional(samples_per_s, float, "measured samples/s", "a number, e.g. 400"),
               "tokens": _optional(tokens, int, "tokens per sample", "a whole number, e.g. 384")}
    site_count = _optional(sites, int, "sites", "a whole number ≥ 1, e.g. 2")
    wan = {"sites": 1 if site_count is None else site_count,
           "wan_bandwidth_bps": _optional(wan_bandwidth, parse_bandwidth, "WAN bandwidth", "a rate, e.g. 1Gbit"),
           "wan_rtt_s": _optional(wan_rtt, parse_duration, "WAN round trip", "a duration, e.g. 30ms")}
    try:
        gpus = _optional(gpus_per_node, int, "GPUs per node", "a whole number, e.g. 8")
        batch = _optional(batch_size, int, "batch size", "a whole number, e.g. 32")
        options = {**sites_options(**wan), **({} if gpus is None else {"gpus_per_node": gpus})}
        options.update(parallel_options(parallel or "ddp", shard_size=shard_size, micro_batch=micro_batch,
                                         reduce_dtype=reduce_dtype or REDUCE_DTYPE,
                                         param_dtype=param_dtype or PARAM_DTYPE,
                                         checkpointing=bool(checkpointing), batch_size=batch))
        cluster = Cluster(nodes_value, parse_bandwidth(bandwidth or ""), parse_latency(latency), topology,
                          options=options)
        if batch is not None:
            anchors["batch_size"] = batch
        return Request(cluster, tuple(compressors), (density_value,), device=device or None,
                       calibration="latest" if calibrated else "none",
                       profile_id=None if profile_id in (None, "") else row_id(str(profile_id), "device profile"),
                       message_budget=PAGE_MESSAGE_BUDGET, step_profile=step_profile, **anchors, **fields)
    except ValueError as exc:
        raise ProjectionError(_first_line(exc)) from None


def _optional(value: Any, kind: type, what: str, example: str) -> Any:
    """An optional control's text as ``kind`` (``None`` when blank); ProjectionError naming
    ``example`` when it is not one (its range is the request's rule)."""
    if value in (None, ""):
        return None
    try:
        return kind(str(value).strip())
    except ValueError:
        raise ProjectionError(f"{what} must be {example}, got {value!r}") from None


def _run(store: Store, request: Request, compressors: list[str], fidelity: str,
         timeline: bool = False) -> list[dict[str, Any]]:
    asked = replace(request, compressors=tuple(compressors), timeline=timeline,
                    cluster=replace(request.cluster, fidelity=fidelity))
    try:
        resolved = pipeline_project.resolve(asked, store)
        return [{**result, **memory_of(resolved, result["compressor"])}
                for result in pipeline_project.project(store, resolved)]
    except (ValueError, KeyError, OSError) as exc:
        raise ProjectionError(_first_line(exc)) from exc


def _row(result: dict[str, Any], fidelity: str, density: float) -> dict[str, Any]:
    """One page row of a projection result (``density`` ``None`` where the message ignores it)."""
    found = pair(result["compressor"], density)
    return {**{key: result.get(key) for key in RESULT_KEYS},
            "compressor": found.compressor, "density": found.density, "label": found.label,
            "fidelity": fidelity, "device": result["device"], "compute_source": result["compute_source"],
            "cost_source": result["cost_source"],
            **{key: result[key] for key in ("precision", "cost_band", "batch_size", "tokens", "tokens_stated",
                                            "compute_from")},
            **{key: result[key] for key in MEMORY_KEYS},
            **{key: result[key] for key in SHARDED_KEYS if key in result}}


def project(store: Store, request: Request, fidelity: str = "analytic") -> list[dict[str, Any]]:
    """Simulate every chosen compressor; one dict of :data:`RESULT_KEYS` (+ compressor, density
    (``None`` where the message ignores it), label, fidelity, device, compute_source, cost_source, the
    memory per GPU of :data:`MEMORY_KEYS`) each. ProjectionError when any of them cannot be projected."""
    return [_row(result, fidelity, request.densities[0]) for result in _run(store, request, list(request.compressors), fidelity)]


def project_each(store: Store, request: Request,
                 fidelity: str = "analytic") -> tuple[list[dict[str, Any]], list[str]]:
    """Like :func:`project`, compressor by compressor: the rows of those that could be projected
    and one message per compressor that could not (e.g. its compression costs were never
    measured: the message names the command that measures them). Each row equals the row
    :func:`project` gives for it alone. ProjectionError when none could be projected."""
    rows, problems = [], []
    for name in request.compressors:
        try:
            (result,) = _run(store, request, [name], fidelity)
        except ProjectionError as exc:
            problems.append(str(exc))
            continue
        rows.append(_row(result, fidelity, request.densities[0]))
    if not rows:
        raise ProjectionError(problems[0])
    return rows, problems


def judged(store: Store, request: Request, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``rows`` (of :func:`project_each`) with their quality columns and the verdict that weighs
    them, as ``sidco compare`` gives them (:mod:`pipeline.quality`): a trace's stored replays (none
    is run inside a request: a pair no replay measured is unmeasured), a layout's shipped table."""
    try:
        asked = pipeline_project.resolve(request, store)
        rank = int(request.cluster.options.get("rank", 1))
        measured = pipeline_quality.for_source(store, asked.source, [(r["compressor"], r["density"]) for r in rows],
                                               rank=rank, run_missing=False)
        rows = pipeline_quality.attach(rows, measured)
        return rows, verdict.judge(rows, store, asked)
    except (ValueError, KeyError, OSError) as exc:
        raise ProjectionError(_first_line(exc)) from exc


def workload_text(row: dict[str, Any]) -> str:
    """The workload line of a projection (:func:`pipeline.project.workload_text`)."""
    return pipeline_project.workload_text(row)


def timeline(store: Store, request: Request, fidelity: str = "des") -> dict[str, Any]:
    """One simulated iteration of ``request.compressors[0]`` as Chrome/Perfetto trace JSON."""
    compressor = request.compressors[0]
    (result,) = _run(store, request, [compressor], fidelity, timeline=True)
    return chrome_trace(result["timeline"], {"compressor": compressor, "nodes": request.cluster.nodes,
                                                       "fidelity": fidelity, "iteration_s": result["iteration_s"]})
