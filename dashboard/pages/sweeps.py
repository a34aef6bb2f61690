"""Sweeps page: results of simulator sweeps, their memory per GPU, and launching a sweep from the page."""

from __future__ import annotations

import json

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from dashboard import components as ui
from dashboard import data, figures, projection, sweep_runner
from dashboard.data import StoreReader
from pipeline.memory import capacity_gib
from pipeline.request import pair
from pipeline.sweep import scenario_rows, sharding_of, sharding_text
from units import format_bandwidth, format_seconds

PATH = "/sweeps"
TITLE = "Sweeps"


def _origin(sweep: dict) -> str:
    """What a sweep simulated: its trace's workload or its layout, and the ``--parallel`` family it was
    projected under (:func:`pipeline.sweep.sharding_of`, as ``sidco sweep`` prints it), from the sweep's config."""
    source = json.loads(sweep["config_json"]).get("source")
    held = sharding_of(sweep["config_json"])
    under = "" if held is None else f" · {sharding_text(held)}"
    if isinstance(source, dict) and source.get("layout"):
        return f"layout {source['layout']}{under}"
    if sweep["trace_id"] is not None:
        return f"trace #{sweep['trace_id']}{under}"
    return f"sweep{under}"


def _sweep_options(store) -> list[dict[str, object]]:
    options = []
    for s in store.sweep_list():
        options.append({"label": f"#{s['id']} · {_origin(s)} · {s['landed']}/{s['total']} scenarios · {s['status']}",
                        "value": s["id"]})
    return options


def _launch_panel(store) -> html.Div:
    options = projection.sources(store)
    names = [n for n in projection.compressor_names() if n != "none"]
    return html.Div(className="panel", children=[
        html.H4("Launch a sweep"),
        ui.labelled("Trace or model layout", dcc.Dropdown(
            id="launch-source", options=options, value=options[0]["value"] if options else None, clearable=False)),
        ui.labelled("Compressors (none is always included)", dcc.Dropdown(
            id="launch-compressors", options=names, value=[n for n in ("topk", "sidco-e") if n in names], multi=True)),
        ui.labelled("Densities", dcc.Input(id="launch-densities", value="0.01,0.001"), "comma-separated, in (0, 1]"),
        ui.labelled("Nodes", dcc.Input(id="launch-nodes", value="2,4,8,16,32"), "comma-separated worker counts"),
        ui.labelled("Bandwidths", dcc.Input(id="launch-bandwidths", value="1Gbit,10Gbit,25Gbit,100Gbit"),
                    "comma-separated, with units"),
        ui.labelled("Latency per message, one-way", dcc.Input(id="launch-latency", value="50us"),
                    projection.LATENCY_HINT),
        ui.labelled("Topology", dcc.Dropdown(id="launch-topology", options=list(projection.TOPOLOGIES),
                                             value="ring", clearable=False)),
        *ui.launch_controls("", "Launch sweep"),
    ])


def memory_table(rows: list[dict], nodes: int) -> html.Div | None:
    """Memory per GPU of each configuration of ``rows`` (a sweep's scenarios at ``nodes`` nodes,
    :func:`pipeline.sweep.scenario_rows`; it depends on neither bandwidth, latency nor topology) against
    the device's, marked when it does not fit; ``None`` without rows."""
    if not rows:
        return None
    shown: dict[tuple, dict] = {}
    for row in rows:
        shown.setdefault((pair(row["compressor"], row["density"]).label, row["memory_gib"]), row)
    room = capacity_gib(rows)
    head = html.Tr([html.Th("configuration"), html.Th("GiB per GPU" + ("" if room is None else f" (of {room:.1f})"))])
    body = [html.Tr([html.Td(label), ui.memory_cell(row)]) for (label, _), row in shown.items()]
    against = ("✗: does not fit, never a cluster's best nor called by its verdict" if room is not None
               else "the device's memory is not modelled, so no fit is judged")
    return html.Div(className="panel", children=[
        html.H4(f"Memory per GPU at {nodes} nodes"),
        html.Table([html.Thead(head), html.Tbody(body)], id="sweep-memory-table", className="quality-table"),
        ui.note("Model states (sharded under the sweep's --parallel), the compressor's state and, for a model from "
                f"its config, activations, as sidco compare gives them ({against}); hover a cell for its parts."),
    ])


def layout(reader: StoreReader) -> html.Div:
    """The page: sweep picker and filters, four figures, and the launch panel."""
    store = reader.store()
    options = _sweep_options(store)
    body = [
        html.Div(className="row", children=[
            ui.labelled("Sweep", dcc.Dropdown(id="sweep-select", options=options,
                                              value=options[0]["value"] if options else None, clearable=False),
                        wide=True),
            ui.labelled("Latency, one-way", dcc.Dropdown(id="sweep-latency", clearable=False)),
            ui.labelled("Topology", dcc.Dropdown(id="sweep-topology", clearable=False)),
            ui.labelled("Nodes (bandwidth plots)", dcc.Dropdown(id="sweep-nodes", clearable=False)),
            ui.labelled("Bandwidth (crossover plot)", dcc.Dropdown(id="sweep-bandwidth", clearable=False)),
        ]),
        html.Div(id="sweep-message"),
        html.Div(className="grid1", children=[
            ui.figure_card("sweep-time", "Iteration time against bandwidth"),
            ui.figure_card("sweep-speedup", "Speed-up over no compression against bandwidth"),
            ui.figure_card("sweep-best", "Fastest configuration per nodes × bandwidth (and its margin)"),
            ui.figure_card("sweep-crossover", "Crossover: densities at which compression pays off"),
        ]),
        html.Div(id="sweep-memory"),
    ]
    if not options:
        body.insert(0, ui.empty_store("sweeps", data.FILL_COMMANDS["sweeps"] + "\n(or launch one with the form)"))
    return html.Div(className="page", children=[
        html.H2("Sweeps: which compressor wins where"),
        html.P("Every scenario of a simulator sweep. Bandwidth plots fix the node count; the heatmap shows the "
               "fastest compressor (and density) that fits in one GPU's memory per cell (as sidco sweep's best) with its "
               "margin over the runner-up; the crossover plot "
               "shows the largest density at which each compressor still beats no compression.", className="lead"),
        dcc.Interval(id="sweep-poll", interval=1000, disabled=True),
        dcc.Store(id="launched-sweep"),
        html.Div(className="layout", children=[_launch_panel(store), html.Div(className="stack", children=body)]),
    ])


def register(app: Dash, reader: StoreReader, manager) -> None:
    """Wire the figures, the live refresh and the background launch."""

    @app.callback(
        Output("sweep-select", "options"),
        Output("sweep-select", "value"),
        Input("sweep-poll", "n_intervals"),
        Input("launched-sweep", "data"),
        State("sweep-select", "value"),
        prevent_initial_call=True,
    )
    def _refresh_sweeps(_ticks, launched, current):
        options = _sweep_options(reader.store())
        if ctx.triggered_id == "launched-sweep" and launched is not None:
            return options, launched
        return options, current if current is not None else (options[0]["value"] if options else None)

    @app.callback(
        Output("sweep-latency", "options"),
        Output("sweep-latency", "value"),
        Output("sweep-topology", "options"),
        Output("sweep-topology", "value"),
        Output("sweep-nodes", "options"),
        Output("sweep-nodes", "value"),
        Output("sweep-bandwidth", "options"),
        Output("sweep-bandwidth", "value"),
        Input("sweep-select", "value"),
        Input("sweep-poll", "n_intervals"),
        State("sweep-latency", "value"),
        State("sweep-topology", "value"),
        State("sweep-nodes", "value"),
        State("sweep-bandwidth", "value"),
    )
    def _filters(sweep_id, _ticks, latency, topology, nodes, bandwidth):
        try:
            axes = data.sweep_axes(reader.store(), sweep_id) if sweep_id is not None else None
        except ValueError:  # a sweep no row can have: the figures callback says so
            axes = None
        if axes is None:
            return [], None, [], None, [], None, [], None

        def keep(current, values, default):
            return current if current in values else (default(values) if values else None)

        return (
            [{"label": format_seconds(v), "value": v} for v in axes["latency_s"]],
            keep(latency, axes["latency_s"], min),
            [{"label": t, "value": t} for t in axes["topology"]],
            keep(topology, axes["topology"], lambda v: v[0]),
            [{"label": f"{n} nodes", "value": n} for n in axes["nodes"]],
            keep(nodes, axes["nodes"], max),
            [{"label": format_bandwidth(b), "value": b} for b in axes["bandwidth_bps"]],
            keep(bandwidth, axes["bandwidth_bps"], min),
        )

    @app.callback(
        Output(ui.graph_id("sweep-time"), "figure"),
        Output(ui.graph_id("sweep-speedup"), "figure"),
        Output(ui.graph_id("sweep-best"), "figure"),
        Output(ui.graph_id("sweep-crossover"), "figure"),
        Output("sweep-message", "children"),
        Output("sweep-memory", "children"),
        Input("sweep-select", "value"),
        Input("sweep-latency", "value"),
        Input("sweep-topology", "value"),
        Input("sweep-nodes", "value"),
        Input("sweep-bandwidth", "value"),
        Input("sweep-poll", "n_intervals"),
    )
    def _figures(sweep_id, latency, topology, nodes, bandwidth, _ticks):
        if sweep_id is None or latency is None or topology is None:
            blank = ui.empty_figure("no scenario of this sweep has landed yet" if sweep_id else "no sweep selected")
            return blank, blank, blank, blank, None, None
        store = reader.store()
        try:
            sweep_id = data.check_sweep_filters(store, sweep_id, latency_s=latency, topology=topology, nodes=nodes,
                                                bandwidth_bps=bandwidth)
        except ValueError as exc:
            blank = ui.empty_figure("fix the highlighted filter")
            return blank, blank, blank, blank, ui.error(str(exc)), None
        axes = data.sweep_axes(store, sweep_id)
        at_nodes = scenario_rows(store, sweep_id, nodes=nodes, latency_s=latency, topology=topology)
        points = [] if bandwidth is None else data.crossover_points(store, sweep_id, bandwidth, latency, topology)
        message = ui.note(
            f"{', '.join(axes['fidelity'])} fidelity · latency {format_seconds(latency)} one-way · {topology} · bandwidth "
            f"plots at {nodes} nodes · crossover at {format_bandwidth(bandwidth) if bandwidth else '-'}")
        return (figures.sweep_vs_bandwidth(at_nodes, "iteration_s"), figures.sweep_vs_bandwidth(at_nodes, "speedup"),
                figures.best_heatmap(data.best_two(store, sweep_id, latency, topology)),
                figures.crossover(points, axes["nodes"]), message, memory_table(at_nodes, nodes))

    @app.callback(
        Output("launch-status", "children"),
        Input("launch-btn", "n_clicks"),
        State("launch-source", "value"),
        State("launch-compressors", "value"),
        State("launch-densities", "value"),
        State("launch-nodes", "value"),
        State("launch-bandwidths", "value"),
        State("launch-latency", "value"),
        State("launch-topology", "value"),
        **ui.launch_callback("", "launched-sweep", "sweep-poll", manager),
    )
    def _launch(set_progress, clicks, source, compressors, densities, nodes, bandwidths, latency, topology):
        if not clicks:
            return no_update
        try:
            spec = sweep_runner.parse_spec(source, compressors, densities, nodes, bandwidths, latency, topology)
        except ValueError as exc:
            return ui.error(str(exc))
        state: dict[str, int | None] = {"sweep": None, "done": 0}

        def started(sweep_id: int) -> None:
            state["sweep"] = sweep_id

        def progress(done: int, total: int) -> None:
            state["done"] = done
            set_progress((str(done), str(total), f"{done} / {total} scenarios landed", state["sweep"]))

        def waiting(text: str) -> None:
            done, total = state["done"] or 0, len(spec.grid)
            set_progress((str(done), str(total), f"{done} / {total} scenarios landed; {text}", state["sweep"]))

        try:
            sweep_id = sweep_runner.run(reader.path, spec, progress, started, waiting=waiting)
        except ValueError as exc:
            return ui.error(str(exc))
        total = len(spec.grid)
        return ui.note(f"sweep #{sweep_id} finished: {total} scenarios in the store")
