"""What-if page: projected iteration time and speed-up for a chosen cluster, live."""

from __future__ import annotations

import time

from dash import Dash, Input, Output, ctx, dcc, html

from dashboard import components as ui
from dashboard import data, figures, projection
from dashboard.data import StoreReader
from pipeline.costs import KERNEL_BAND_NOTE
from pipeline.quality import CALL_RULE, QUALITY_RULE
from pipeline.request import sites_text
from units import format_seconds

PATH = "/"
TITLE = "What-if"

DEFAULTS = {"source": "layout:bert-base", "density": "0.01", "nodes": "8", "bandwidth": "10Gbit", "latency": "50us",
            "topology": "ring"}
"""BERT-base on 8 A100s (the default device of layouts) at 10 Gbit/s: a cluster where the choice
matters (PowerSGD, the sparsifiers and no compression differ by more than 2x)."""


def default_source(options: list[dict[str, str]], wanted: str = DEFAULTS["source"]) -> str | None:
    """The source the page opens on: ``wanted`` when offered, else :data:`DEFAULTS`' layout, else the first option."""
    values = [o["value"] for o in options]
    for value in (wanted, DEFAULTS["source"]):
        if value in values:
            return value
    return values[0] if values else None


def controls(prefix: str, options: list[dict[str, str]], multi: bool, query: dict[str, str] | None = None) -> list:
    """The shared scenario controls (also used by the timeline page); ids start with ``prefix``.
    ``query``: starting values from the page's address (``source``, ``density``, ``nodes``,
    ``bandwidth``, ``latency``); a bad one shows as the usual inline error."""
    start = {**DEFAULTS, **{k: v for k, v in (query or {}).items() if k in DEFAULTS}}
    names = projection.compressor_names()
    chosen = [n for n in ("none", "fp16", "powersgd", "topk", "dgc", "sidco-e", "sidco-p", "sidco-gp") if n in names]
    return [
        ui.labelled("Trace or model layout", dcc.Dropdown(
            id=f"{prefix}-source", options=options, value=default_source(options, start["source"]), clearable=False)),
        ui.labelled("Compressors" if multi else "Compressor", dcc.Dropdown(
            id=f"{prefix}-compressors", options=names, value=chosen if multi else "sidco-e", multi=multi,
            clearable=False)),
        ui.labelled("Density δ", dcc.Input(id=f"{prefix}-density", value=start["density"], debounce=True),
                    "fraction of elements sent, in (0, 1]"),
        ui.labelled("Nodes", dcc.Input(id=f"{prefix}-nodes", value=start["nodes"], debounce=True),
                    "workers, one GPU each"),
        ui.labelled("Bandwidth per worker", dcc.Input(id=f"{prefix}-bandwidth", value=start["bandwidth"],
                                                      debounce=True), "with unit: 10Gbit, 100Mbit/s, 1.25GB/s"),
        ui.labelled("Latency per message, one-way", dcc.Input(id=f"{prefix}-latency", value=start["latency"],
                                                              debounce=True), projection.LATENCY_HINT),
        ui.labelled("Topology", dcc.Dropdown(id=f"{prefix}-topology", options=list(projection.TOPOLOGIES),
                                             value=start["topology"], clearable=False)),
    ]


def _device(name: str | None) -> str:
    """The device control's starting value: ``name`` when it is one of the dropdown's, else the default."""
    values = [o["value"] for o in projection.device_options()]
    return name if name in values else ""


PARALLEL_IDS = ("whatif-gpus-per-node", "whatif-batch-size", "whatif-parallel", "whatif-shard-size",
                "whatif-micro-batch", "whatif-reduce-dtype", "whatif-param-dtype", "whatif-checkpointing")
"""The controls of the GPUs per node, the batch and the ``--parallel`` family, in the order
:func:`parallel_values` reads them."""


def parallel_controls(query: dict[str, str] | None = None) -> list:
    """GPUs per node, batch per GPU and the ``--parallel`` family (``sidco simulate``'s options of
    the same names); ``query``'s ``gpus_per_node`` and ``parallel`` set their starting values."""
    query = query or {}
    start = query.get("parallel") if query.get("parallel") in projection.PARALLEL else "ddp"
    return [
        ui.labelled("GPUs per node", dcc.Input(id="whatif-gpus-per-node", value=query.get("gpus_per_node", ""),
                                               debounce=True),
                    "blank: 1 (above 1, choose the hierarchical topology for the intra-node level)"),
        ui.labelled("Batch per GPU (optional)", dcc.Input(id="whatif-batch-size", value="", debounce=True),
                    "samples (sequences) per GPU per optimizer step; blank: 32"),
        ui.labelled("Data parallelism", dcc.Dropdown(id="whatif-parallel", options=list(projection.PARALLEL),
                                                     value=start, clearable=False),
                    "ddp (full replicas), fsdp (FSDP2 = ZeRO-3), hsdp (FSDP inside a shard group), zero1, zero2; "
                    "sharded plans need the ring or hierarchical topology"),
        ui.labelled("Shard group (hsdp, optional)", dcc.Input(id="whatif-shard-size", value="", debounce=True),
                    "GPUs per shard group; blank: one node"),
        ui.labelled("Micro-batch (optional)", dcc.Input(id="whatif-micro-batch", value="", debounce=True),
                    "sequences per accumulation step, a divisor of the batch; blank: one step"),
        ui.labelled("Reduce dtype", dcc.Dropdown(id="whatif-reduce-dtype", options=list(projection.DTYPES),
                                                 value=projection.DEFAULT_DTYPES["reduce"], clearable=False),
                    "sharded: what gradients are reduce-scattered and all-reduced in"),
        ui.labelled("Parameter dtype", dcc.Dropdown(id="whatif-param-dtype", options=list(projection.DTYPES),
                                                    value=projection.DEFAULT_DTYPES["param"], clearable=False),
                    "sharded: what parameters are all-gathered in"),
        dcc.Checklist(id="whatif-checkpointing", options=[{"label": " activation checkpointing", "value": "on"}],
                      value=[]),
    ]


def parallel_values(gpus_per_node, batch_size, parallel, shard_size, micro_batch, reduce_dtype, param_dtype,
                    checkpointing) -> dict:
    """The keyword arguments of :func:`dashboard.projection.parse_controls` from :func:`parallel_controls`' values."""
    return {"gpus_per_node": gpus_per_node, "batch_size": batch_size, "parallel": parallel,
            "shard_size": shard_size, "micro_batch": micro_batch, "reduce_dtype": reduce_dtype,
            "param_dtype": param_dtype, "checkpointing": bool(checkpointing)}


def layout(reader: StoreReader, query: dict[str, str] | None = None) -> html.Div:
    """The page: controls on the left, stacked bars and speed-ups on the right; ``query`` (the
    address's ``?source=trace:3&nodes=8&bandwidth=10Gbit&density=0.001&device=a100``) sets the
    starting scenario."""
    query = query or {}
    store = reader.store()
    options = projection.sources(store)
    calibration = store.latest_calibration()
    calibration_control = dcc.Checklist(
        id="whatif-calibrated",
        options=[{"label": " use the latest calibration (α, β, efficiency)", "value": "on",
                  "disabled": calibration is None}],
        value=[],
    )
    side = html.Div(className="panel", children=[
        html.H4("Scenario"),
        *controls("whatif", options, multi=True, query=query),
        ui.labelled("Device per worker", dcc.Dropdown(id="whatif-device", options=projection.device_options(),
                                                      value=_device(query.get("device")), clearable=False),
                    "compute of layouts and compression costs are this device's"),
        ui.labelled("Compression costs", dcc.Dropdown(id="whatif-costs", options=projection.cost_options(store),
                                                      value="", clearable=False),
                    "a stored profile must be of the chosen device"),
        ui.labelled("Measured samples/s (optional)", dcc.Input(id="whatif-samples-per-s", value="", debounce=True),
                    "layouts: one GPU's training throughput you measured at batch 32; compute then comes from it "
                    "(band ±5 %) instead of the rule fitted to published throughput"),
        ui.labelled("Measured step (optional)", dcc.Dropdown(id="whatif-step-profile",
                                                             options=projection.step_options(store), value="",
                                                             clearable=False),
                    "models: a training step sidco profile --model stored (--step-profile); compute then comes from "
                    "it (band: the spread of its steps); its batch, tokens, precision and device must be the ones "
                    "projected"),
        ui.labelled("Tokens per sample (optional)", dcc.Input(id="whatif-tokens", value="", debounce=True),
                    "transformer layouts and models: sequence length (default 128 for BERT, 1024 for GPT-2, "
                    "4096 for a model)"),
        *ui.sites_controls("whatif", query, "the nodes split evenly across sites joined by a WAN (1: one site; "
                           "ring topology inside)", "with more than one site: e.g. 30ms; every round across sites "
                           "pays half of it"),
        *parallel_controls(query),
        calibration_control,
        html.Div(style={"height": "10px"}),
        html.Button("Run detailed simulation (des)", id="whatif-des", className="btn"),
        ui.note("Controls update the analytic projection live; the button runs the link-level "
                "discrete-event model (slower, shows contention). Compression costs come from this trace's "
                "replays on the device, its measured profile, or the cost model; nothing is timed here."),
    ])
    notes = []
    if not store.trace_list():
        notes.append(ui.note("No traces registered yet: the large-model layouts work without one. "
                             f"To project your own model: {data.FILL_COMMANDS['traces']}"))
    return html.Div(className="page", children=[
        html.H2("What-if: would compression make this training faster?"),
        html.P("Projected time of one data-parallel training iteration per compressor, split into compute, "
               "compression and communication not hidden behind backward; speed-ups are against no "
               "compression (fp32) and, when fp16 is chosen, against the fp16 dense all-reduce in the same "
               "scenario: the strongest plain baselines (fp16 and PowerSGD are chosen by default).",
               className="lead"),
        *notes,
        html.Div(className="layout", children=[
            side,
            ui.loading(html.Div(className="stack", children=[
                html.Div(id="whatif-verdict", className="verdict"),
                html.Div(id="whatif-message"),
                html.Div(id="whatif-quality"),
                ui.figure_card("whatif-breakdown", "Projected iteration time per compressor", height=420),
                ui.figure_card("whatif-speedup", "Speed-up over no compression (fp32) and over fp16", height=420),
            ])),
        ]),
    ])


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def memory_note(rows: list[dict]) -> str:
    """What the memory column counts, against which capacity, and what its mark means."""
    room = next((r["memory_capacity_gib"] for r in rows if r.get("memory_capacity_gib") is not None), None)
    against = (f"against the {rows[0]['device']}'s {room:.1f} GiB (✗: does not fit; the verdict never calls it)"
               if room is not None else f"the {rows[0]['device']}'s memory is not modelled, so no fit is judged")
    counted = "" if all(r.get("activations_counted") for r in rows) else (
        "; activations are counted for a model from its config only, so a row that fits may not once they are added")
    return (f"Memory per GPU = model states (parameters, gradients, optimizer; sharded under --parallel), "
            f"activations, the compressor's state (error-feedback residual, PowerSGD's factors), as sidco compare "
            f"gives it, {against}{counted}; hover a cell for its parts.")


def quality_table(rows: list[dict]) -> html.Div:
    """What each row sends (achieved density (and ÷ target), energy vs Top-k, where they come from)
    and holds: its memory per GPU (GiB) against the device's, marked when it does not fit."""
    replaces = any("collective" in r for r in rows)
    room = next((r["memory_capacity_gib"] for r in rows if r.get("memory_capacity_gib") is not None), None)
    memory_head = "GiB per GPU" + ("" if room is None else f" (of {room:.1f})")
    head = html.Tr([html.Th(t) for t in ("configuration", "achieved density", "÷ target", "energy vs Top-k",
                                         *(["replaces"] if replaces else []), memory_head, "quality from")])
    body = [html.Tr([html.Td(r["label"]), html.Td(_cell(r["achieved_density"])),
                     html.Td(_cell(r["achieved_over_target"])), html.Td(_cell(r["energy_vs_topk"])),
                     *([html.Td(r.get("collective", "-"))] if replaces else []), ui.memory_cell(r),
                     html.Td(r["quality_source"])]) for r in rows]
    return html.Div(className="panel", children=[
        html.H4("What each configuration sends, and its memory per GPU"),
        html.Table([html.Thead(head), html.Tbody(body)], id="whatif-quality-table", className="quality-table"),
        ui.note(f"Energy vs Top-k = squared norm sent ÷ exact Top-k's at the same density on the same gradients "
                f"(none, casts: 1; PowerSGD: the share its rank captures). Where it comes from: {QUALITY_RULE}. "
                f"The verdict's rule: {CALL_RULE}. {memory_note(rows)}"),
    ])


def register(app: Dash, reader: StoreReader) -> None:
    """Wire the live projection."""

    @app.callback(
        Output(ui.graph_id("whatif-breakdown"), "figure"),
        Output(ui.graph_id("whatif-speedup"), "figure"),
        Output("whatif-message", "children"),
        Output("whatif-verdict", "children"),
        Output("whatif-quality", "children"),
        Input("whatif-source", "value"),
        Input("whatif-compressors", "value"),
        Input("whatif-density", "value"),
        Input("whatif-nodes", "value"),
        Input("whatif-bandwidth", "value"),
        Input("whatif-latency", "value"),
        Input("whatif-topology", "value"),
        Input("whatif-calibrated", "value"),
        Input("whatif-device", "value"),
        Input("whatif-costs", "value"),
        Input("whatif-samples-per-s", "value"),
        Input("whatif-step-profile", "value"),
        Input("whatif-tokens", "value"),
        Input("whatif-sites", "value"),
        Input("whatif-wan-bandwidth", "value"),
        Input("whatif-wan-rtt", "value"),
        *(Input(name, "value") for name in PARALLEL_IDS),
        Input("whatif-des", "n_clicks"),
    )
    def _project(source, compressors, density, nodes, bandwidth, latency, topology, calibrated, device, costs,
                 samples_per_s, step_profile, tokens, sites, wan_bandwidth, wan_rtt, *rest):
        held = parallel_values(*rest[:len(PARALLEL_IDS)])
        fidelity = "des" if ctx.triggered_id == "whatif-des" else "analytic"
        started = time.perf_counter()
        try:
            chosen = projection.parse_controls(source, compressors, density, nodes, bandwidth, latency, topology,
                                               calibrated=bool(calibrated), device=device or None,
                                               profile_id=costs or None, samples_per_s=samples_per_s, tokens=tokens,
                                               sites=sites, wan_bandwidth=wan_bandwidth, wan_rtt=wan_rtt,
                                               step_profile=projection.stored_step(reader.store(), step_profile),
                                               **held)
            results, problems = projection.project_each(reader.store(), chosen, fidelity)
            results, judged = projection.judged(reader.store(), chosen, results)
        except ValueError as exc:
            blank = ui.empty_figure("fix the highlighted control")
            return blank, blank, ui.error(str(exc)), "", ""
        elapsed = time.perf_counter() - started
        sharded = f" · {results[0]['parallel']}" if "parallel" in results[0] else ""
        title = (f"{chosen.cluster.nodes} nodes · {bandwidth} · {format_seconds(chosen.cluster.latency_s)} one-way · "
                 f"{topology}{sharded} · δ={chosen.densities[0]:g} · {fidelity} fidelity"
                 f"{sites_text(chosen.cluster).replace(';', ' ·')}")
        sources = "; ".join(f"{r['compressor']}: {r['cost_source']}" for r in results if r["cost_source"])
        note = ui.note(f"{fidelity} projection of {len(results)} compressors in {elapsed * 1e3:.0f} ms on "
                       f"{results[0]['device']} (compute from {results[0]['compute_source']}); "
                       f"{projection.workload_text(results[0])}"
                       + (f"; compression costs: {sources}" if sources else "") + f"; {KERNEL_BAND_NOTE}")
        message = html.Div([note, *(ui.error(problem) for problem in problems)])
        line = html.P([html.Strong("Verdict: "), judged["text"]])
        return (figures.whatif_breakdown(results, title), figures.whatif_speedup(results), message, line,
                quality_table(results))
