"""Time-to-accuracy page: held-out accuracy against projected wall-clock time on a chosen cluster,
the per-step pairs of a convergence run and the DiLoCo runs of its configuration ranked together
(:func:`pipeline.tta.time_to_accuracy`, as ``sidco tta`` ranks them)."""

from __future__ import annotations

from dash import Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

from dashboard import components as ui
from dashboard import converge_runner, data, figures, projection
from dashboard.data import StoreReader
from pipeline import project
from pipeline.catalog import workload_names
from pipeline.request import sites_options, sites_text
from pipeline.tta import convergence_run, projection_of, time_to_accuracy, verdict_text
from units import Pair, parse_bandwidth, parse_duration

PATH = "/tta"
TITLE = "Time to accuracy"

COLUMNS = [
    {"name": "configuration", "id": "label"}, {"name": "seeds", "id": "seeds"},
    {"name": "iterations to target (mean)", "id": "iterations_to_target"},
    {"name": "± spread", "id": "iterations_spread"}, {"name": "iteration (ms)", "id": "iteration_ms"},
    {"name": "time to target (s)", "id": "time_to_target_s"}, {"name": "± spread (s)", "id": "time_spread_s"},
    {"name": "sync every (H)", "id": "sync_every"}, {"name": "outer compressor", "id": "outer"},
    {"name": "utilization (%)", "id": "utilization"}, {"name": "memory per GPU (GiB)", "id": "memory"},
    {"name": "note", "id": "reason"},
]


def _run_options(store) -> list[dict[str, object]]:
    options = []
    for run in data.convergences(store):
        config = run["config"]
        options.append({"label": f"#{run['id']} · {config.get('workload')} · {config.get('workers')} workers · "
                                 f"{config.get('iterations')} iterations · {run['pairs']} runs · {run['status']}",
                        "value": run["id"]})
    return options


def table_rows(rows: list[dict]) -> list[dict]:
    """Time-to-target rows formatted for the table (iteration in ms, time in s; spreads over the
    seeds; a DiLoCo row's iterations are inner steps; H, outer compressor and utilization where the
    rows have them: beside DiLoCo rows or across sites; memory per GPU in GiB, marked where it does not fit)."""
    def rounded(value: float | None, digits: int) -> float | str:
        return "" if value is None else round(value, digits)

    return [{
        "label": r["label"],
        "seeds": r["seeds"],
        "iterations_to_target": rounded(r["iterations_to_target"], 1),
        "iterations_spread": rounded(r["iterations_spread"], 1),
        "iteration_ms": "" if r["iteration_s"] is None else round(r["iteration_s"] * 1e3, 3),
        "time_to_target_s": rounded(r["time_to_target_s"], 4),
        "time_spread_s": rounded(r["time_spread_s"], 4),
        "sync_every": r.get("sync_every", ""),
        "outer": "" if r.get("outer_compressor") is None else Pair(r["outer_compressor"], r["outer_density"]).label,
        "utilization": "" if r.get("utilization") is None else round(r["utilization"] * 100, 1),
        "memory": ui.memory_text(r),
        "reason": r["reason"] or "",
    } for r in rows]


def suggested_target(store, convergence_id: int) -> float:
    """A first target for the page: 90 % of the best held-out accuracy any run of ``convergence_id``
    reached, rounded down to 0.01 (0.5 when nothing was evaluated)."""
    value = store.best_accuracy(int(convergence_id))
    return 0.5 if value is None else max(0.01, int(value * 0.9 * 100) / 100)


def _launch_panel() -> html.Div:
    names = projection.compressor_names()
    return html.Div(className="panel", children=[
        html.H4("Launch a convergence run"),
        ui.labelled("Workload", dcc.Dropdown(id="tta-launch-workload", options=workload_names(), value="resnet20",
                                             clearable=False)),
        ui.labelled("Workers", dcc.Input(id="tta-launch-workers", value="2"), "simulated data-parallel workers"),
        ui.labelled("Iterations", dcc.Input(id="tta-launch-iterations", value="40"), "per compressor"),
        ui.labelled("Evaluate every", dcc.Input(id="tta-launch-eval", value="10"), "iterations"),
        ui.labelled("Width", dcc.Input(id="tta-launch-width", value="0.25"), "model width multiplier"),
        ui.labelled("Compressors", dcc.Dropdown(id="tta-launch-compressors", options=names, multi=True,
                                                value=[n for n in ("none", "topk", "sidco-e") if n in names])),
        ui.labelled("Densities", dcc.Input(id="tta-launch-densities", value="0.01"), "comma-separated, in (0, 1]"),
        *ui.launch_controls("tta-", "Launch run"),
    ])


def layout(reader: StoreReader, query: dict[str, str] | None = None) -> html.Div:
    """The page: run and cluster controls, the two accuracy figures, the time-to-target bars and
    table; ``query`` (the address's ``?run=3&nodes=8&bandwidth=100Mbit&latency=50us&target=0.25``)
    sets the starting run, cluster and accuracy target (the demo links here)."""
    query = query or {}
    store = reader.store()
    options = _run_options(store)
    run = next((o["value"] for o in options if str(o["value"]) == query.get("run")),
               options[0]["value"] if options else None)
    target = query.get("target") or (suggested_target(store, run) if options else 0.5)
    body = [
        html.Div(className="row", children=[
            ui.labelled("Convergence run", dcc.Dropdown(id="tta-run", options=options, clearable=False,
                                                        value=run), wide=True),
            ui.labelled("Nodes", dcc.Input(id="tta-nodes", value=query.get("nodes", "8"), debounce=True)),
            ui.labelled("Bandwidth", dcc.Input(id="tta-bandwidth", value=query.get("bandwidth", "1Gbit"),
                                               debounce=True), "per direction"),
            ui.labelled("Latency", dcc.Input(id="tta-latency", value=query.get("latency", "50us"), debounce=True)),
            ui.labelled("Topology", dcc.Dropdown(id="tta-topology", options=list(projection.TOPOLOGIES), value="ring",
                                                 clearable=False)),
            *ui.sites_controls("tta", query, "the nodes split evenly across sites joined by a WAN; 2 or more "
                               "project the DiLoCo runs", "with more than one site: e.g. 30ms"),
            ui.labelled("Target", dcc.Dropdown(id="tta-metric", clearable=False, value="accuracy", options=[
                {"label": "held-out accuracy ≥", "value": "accuracy"},
                {"label": "held-out loss ≤", "value": "eval_loss"}])),
            ui.labelled("Target value", dcc.Input(id="tta-target", value=target if isinstance(target, str) else f"{target:g}",
                                                   debounce=True),
                        "fraction (accuracy) or nats (loss)"),
        ]),
        html.Div(id="tta-message"),
        html.Div(className="grid1", children=[
            ui.figure_card("tta-time", "Held-out accuracy against projected wall-clock time"),
            ui.figure_card("tta-iterations", "Held-out accuracy against iterations"),
            ui.figure_card("tta-bars", "Time to target per configuration"),
            html.Div(className="card", children=[
                html.H3("Time to target (Export = CSV)"),
                dash_table.DataTable(id="tta-table", columns=COLUMNS, sort_action="native", page_size=12,
                                     export_format="csv", style_table={"overflowX": "auto"},
                                     style_cell={"fontFamily": "Inter, Segoe UI, Helvetica, Arial, sans-serif",
                                                 "fontSize": 12, "padding": "4px 8px", "textAlign": "right",
                                                 "whiteSpace": "normal", "height": "auto", "minWidth": "60px"},
                                     style_cell_conditional=[{"if": {"column_id": "reason"}, "textAlign": "left",
                                                              "maxWidth": "260px"}],
                                     style_header={"fontWeight": 600, "backgroundColor": "#f1f5f9"}),
            ]),
        ]),
    ]
    if not options:
        body.insert(0, ui.empty_store("convergence runs", data.FILL_COMMANDS["convergences"]))
    return html.Div(className="page", children=[
        html.H2("Time to accuracy: which compressor reaches the target first"),
        html.P("A convergence run (sidco converge: real training, compressed gradients, held-out evaluation) gives "
               "the iterations each compressor needs; the simulator projects one iteration on the cluster below "
               "(compute from the run's trace, compression costs from its replay). Time to target = iterations × "
               "iteration time, at the first evaluation that meets the target. The DiLoCo runs of the same "
               "configuration (sidco converge --sync-every H) are ranked with them: inner steps × the time per inner "
               "step on two or more sites (one site's step from the synchronous run's trace, plus the outer exchange "
               "over the WAN every H steps).", className="lead"),
        dcc.Interval(id="tta-poll", interval=1000, disabled=True),
        dcc.Store(id="tta-launched"),
        html.Div(className="layout", children=[_launch_panel(), html.Div(className="stack", children=body)]),
    ])


def _parse_cluster(nodes: str | None, bandwidth: str | None, latency: str | None, topology: str | None,
                   sites: str | None, wan_bandwidth: str | None, wan_rtt: str | None) -> project.Cluster:
    """The cluster of the page's controls (the sites and their WAN by the request's rule,
    :func:`pipeline.request.sites_options`; blank WAN fields are not given)."""
    text = str(nodes or "").strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"invalid node count {nodes!r}: a whole number ≥ 1")
    count = str(sites or "1").strip()
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"invalid sites {sites!r}: a whole number ≥ 1")
    wan = {"wan_bandwidth_bps": parse_bandwidth(wan_bandwidth) if str(wan_bandwidth or "").strip() else None,
           "wan_rtt_s": parse_duration(wan_rtt) if str(wan_rtt or "").strip() else None}
    return project.Cluster(int(text), parse_bandwidth(bandwidth or ""), parse_duration(latency or ""), topology,
                           options=sites_options(int(count), **wan))


def _parse_target(target: str | None) -> float:
    try:
        return float(str(target))
    except ValueError:
        raise ValueError(f"invalid target {target!r}: a number, e.g. 0.6") from None


def register(app: Dash, reader: StoreReader, manager) -> None:
    """Wire the projection, the run list refresh and the background launch."""

    @app.callback(
        Output("tta-run", "options"),
        Output("tta-run", "value"),
        Input("tta-poll", "n_intervals"),
        Input("tta-launched", "data"),
        State("tta-run", "value"),
        prevent_initial_call=True,
    )
    def _refresh_runs(_ticks, launched, current):
        options = _run_options(reader.store())
        if ctx.triggered_id == "tta-launched" and launched is not None:
            return options, launched
        return options, current if current is not None else (options[0]["value"] if options else None)

    @app.callback(
        Output(ui.graph_id("tta-time"), "figure"),
        Output(ui.graph_id("tta-iterations"), "figure"),
        Output(ui.graph_id("tta-bars"), "figure"),
        Output("tta-table", "data"),
        Output("tta-message", "children"),
        Input("tta-run", "value"),
        Input("tta-nodes", "value"),
        Input("tta-bandwidth", "value"),
        Input("tta-latency", "value"),
        Input("tta-topology", "value"),
        Input("tta-sites", "value"),
        Input("tta-wan-bandwidth", "value"),
        Input("tta-wan-rtt", "value"),
        Input("tta-metric", "value"),
        Input("tta-target", "value"),
        Input("tta-launch-status", "children"),
    )
    def _project(run_id, nodes, bandwidth, latency, topology, sites, wan_bandwidth, wan_rtt, metric, target, _finished):
        blank = ui.empty_figure("no convergence run selected" if run_id is None else "")
        if run_id is None:
            return blank, blank, blank, [], None
        try:
            cluster = _parse_cluster(nodes, bandwidth, latency, topology, sites, wan_bandwidth, wan_rtt)
            target_value = _parse_target(target)
            targets = {"target_accuracy": target_value} if metric == "accuracy" else {"target_loss": target_value}
            store = reader.store()
            run = convergence_run(store, run_id)
            result = time_to_accuracy(store, projection_of(store, run, cluster), run, **targets)
        except ValueError as exc:
            return blank, blank, blank, [], ui.error(str(exc))
        curves = result["curves"]
        names = [r["label"] for r in result["rows"]]
        synchronous = ("" if result["synchronous_id"] == result["convergence_id"] else
                       f" · per-step pairs and trace of its synchronous run #{result['synchronous_id']}")
        note = (f"{verdict_text(result)} · {result['seeds']} seed(s), mean ± spread · trained with "
                f"{result['workers_trained']} workers{synchronous}, projected on {cluster.nodes} × {result['device']}"
                f"{sites_text(cluster).replace(';', ' ·')} · compression costs: "
                + ("; ".join(f"{k}: {v}" for k, v in sorted(result["cost_sources"].items())) or "none needed"))
        return (figures.tta_curves(curves, "time_s", metric, target_value),
                figures.tta_curves(curves, "iteration", metric, target_value),
                figures.tta_bars(result["rows"], names), table_rows(result["rows"]), ui.note(note))

    @app.callback(
        Output("tta-launch-status", "children"),
        Input("tta-launch-btn", "n_clicks"),
        State("tta-launch-workload", "value"),
        State("tta-launch-workers", "value"),
        State("tta-launch-iterations", "value"),
        State("tta-launch-eval", "value"),
        State("tta-launch-width", "value"),
        State("tta-launch-compressors", "value"),
        State("tta-launch-densities", "value"),
        **ui.launch_callback("tta-", "tta-launched", "tta-poll", manager),
    )
    def _launch(set_progress, clicks, workload, workers, iterations, eval_every, width, compressors, densities):
        if not clicks:
            return no_update
        try:
            spec = converge_runner.parse_spec(workload, workers, iterations, eval_every, width, compressors, densities)
        except ValueError as exc:
            return ui.error(str(exc))
        state: dict[str, int | None] = {"run": None}

        def started(convergence_id: int) -> None:
            state["run"] = convergence_id

        def progress(done: int, total: int, what: str) -> None:
            set_progress((str(done), str(total), f"{done} / {total} iterations · {what}", state["run"]))

        try:
            convergence_id = converge_runner.run(reader.path, spec, progress, started)
        except ValueError as exc:
            return ui.error(str(exc))
        return ui.note(f"convergence run #{convergence_id} finished: {len(spec.pairs)} runs in the store")
