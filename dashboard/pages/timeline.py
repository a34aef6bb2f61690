"""Timeline page: one simulated iteration as a Gantt chart per worker, downloadable for Perfetto."""

from __future__ import annotations

import json
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboard import components as ui
from dashboard import figures, projection
from dashboard.data import StoreReader
from dashboard.pages.whatif import controls

PATH = "/timeline"
TITLE = "Timeline"


def chrome_events(timeline: Any) -> list[dict[str, Any]]:
    """The event list of a Chrome/Perfetto trace (``{"traceEvents": [...]}`` or a bare list)."""
    if isinstance(timeline, dict):
        timeline = timeline.get("traceEvents", [])
    if not isinstance(timeline, list):
        raise ValueError("the simulator returned no timeline")
    return timeline


def split_events(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[Any, str], dict[tuple, str]]:
    """Complete events (``ph == "X"``) plus process and thread names from the metadata events."""
    spans = [e for e in events if e.get("ph") == "X"]
    process_names = {e["pid"]: e["args"]["name"] for e in events
                     if e.get("ph") == "M" and e.get("name") == "process_name"}
    thread_names = {(e["pid"], e.get("tid", 0)): e["args"]["name"] for e in events
                    if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return spans, process_names, thread_names


def layout(reader: StoreReader) -> html.Div:
    """The page: scenario controls and the Gantt chart."""
    options = projection.sources(reader.store())
    side = html.Div(className="panel", children=[
        html.H4("Scenario"),
        *controls("timeline", options, multi=False),
        ui.labelled("Fidelity", dcc.Dropdown(id="timeline-fidelity", options=["analytic", "des"], value="des",
                                             clearable=False)),
        html.Button("Download Perfetto JSON", id="timeline-perfetto-btn", className="btn"),
        dcc.Download(id="timeline-perfetto"),
        ui.note("Open the file at ui.perfetto.dev or chrome://tracing."),
    ])
    return html.Div(className="page", children=[
        html.H2("Timeline: one simulated iteration"),
        html.P("Forward, backward per bucket, compression and communication on each worker's compute and "
               "communication streams, as the simulator schedules them (DDP semantics).", className="lead"),
        dcc.Store(id="timeline-data"),
        html.Div(className="layout", children=[
            side,
            ui.loading(html.Div(className="stack", children=[
                html.Div(id="timeline-message"),
                ui.figure_card("timeline-gantt", "Gantt chart per worker and stream", height=560),
            ])),
        ]),
    ])


def register(app: Dash, reader: StoreReader) -> None:
    """Wire the simulation and the download."""

    @app.callback(
        Output(ui.graph_id("timeline-gantt"), "figure"),
        Output("timeline-message", "children"),
        Output("timeline-data", "data"),
        Input("timeline-source", "value"),
        Input("timeline-compressors", "value"),
        Input("timeline-density", "value"),
        Input("timeline-nodes", "value"),
        Input("timeline-bandwidth", "value"),
        Input("timeline-latency", "value"),
        Input("timeline-topology", "value"),
        Input("timeline-fidelity", "value"),
    )
    def _simulate(source, compressor, density, nodes, bandwidth, latency, topology, fidelity):
        try:
            chosen = projection.parse_controls(source, [compressor] if compressor else [], density, nodes,
                                               bandwidth, latency, topology)
            timeline = projection.timeline(reader.store(), chosen, fidelity)
            spans, process_names, thread_names = split_events(chrome_events(timeline))
        except ValueError as exc:
            return ui.empty_figure("fix the highlighted control"), ui.error(str(exc)), None
        if not spans:
            return ui.empty_figure("the simulator returned an empty timeline"), None, None
        end_ms = max(e["ts"] + e["dur"] for e in spans) / 1e3
        message = ui.note(f"{compressor} · {chosen.cluster.nodes} nodes · {bandwidth} · {fidelity} fidelity · "
                          f"iteration ends at {end_ms:.3g} ms · {len(spans)} spans")
        return figures.gantt(spans, process_names, thread_names), message, {"traceEvents": chrome_events(timeline)}

    @app.callback(
        Output("timeline-perfetto", "data"),
        Input("timeline-perfetto-btn", "n_clicks"),
        State("timeline-data", "data"),
        prevent_initial_call=True,
    )
    def _download(clicks, timeline):
        if not clicks or not timeline:
            return no_update
        return dcc.send_string(json.dumps(timeline), "iteration.perfetto.json")
