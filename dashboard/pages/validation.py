"""Validation page: projected against measured iteration time, from emulated runs."""

from __future__ import annotations

from dash import Dash, Input, Output, dash_table, dcc, html

from dashboard import components as ui
from dashboard import data, figures
from dashboard.data import StoreReader
from units import format_bandwidth, format_seconds

PATH = "/validation"
TITLE = "Validation"


SHARE_CHOICES = (0.0, 0.1, 0.3, 0.5)  # network-share thresholds offered by the filter (fractions)


def filter_rows(rows: list[dict], fidelity: str = "all", calibrated_only: bool = False, min_share: float = 0.0) -> list[dict]:
    """The validation rows of one ``fidelity`` (``all``: every one; rows from before fidelities
    were recorded count as ``analytic``), only calibrated ones if asked, and with a projected
    network share (transfer time ÷ iteration, 0..1) of at least ``min_share`` (rows without a
    recorded share pass only ``min_share`` 0)."""
    out = []
    for r in rows:
        if fidelity != "all" and (r.get("fidelity") or "analytic") != fidelity:
            continue
        if calibrated_only and not r["calibrated"]:
            continue
        share = r.get("network_share")
        if min_share > 0 and (share is None or share < min_share):
            continue
        out.append(r)
    return out


def table_rows(rows: list[dict]) -> list[dict]:
    """Validation rows formatted for the error table (times in ms, error and network share in %)."""
    return [{
        "workload": r["workload"],
        "compressor": r["compressor"],
        "density": "" if r["density"] is None else f"{r['density']:g}",
        "workers": r["workers"],
        "bandwidth": "" if r["bandwidth_bps"] is None else format_bandwidth(r["bandwidth_bps"]),
        "measured_ms": round(r["measured_s"] * 1e3, 3),
        "projected_ms": round(r["projected_s"] * 1e3, 3),
        "error_pct": round(r["error_pct"], 2),
        "calibrated": "yes" if r["calibrated"] else "no",
        "fidelity": r.get("fidelity") or "analytic",
        "network_pct": "" if r.get("network_share") is None else round(r["network_share"] * 100, 1),
    } for r in rows]


COLUMNS = [
    {"name": "workload", "id": "workload"}, {"name": "compressor", "id": "compressor"},
    {"name": "density", "id": "density"}, {"name": "workers", "id": "workers"},
    {"name": "bandwidth", "id": "bandwidth"}, {"name": "measured (ms)", "id": "measured_ms"},
    {"name": "projected (ms)", "id": "projected_ms"}, {"name": "error (%)", "id": "error_pct"},
    {"name": "network share (%)", "id": "network_pct"}, {"name": "fidelity", "id": "fidelity"},
    {"name": "calibrated", "id": "calibrated"},
]


def layout(reader: StoreReader) -> html.Div:
    """The page: summary numbers, the scatter with y = x, and the error table."""
    store = reader.store()
    rows = store.validation()
    header = [
        html.H2("Validation: projections against real runs"),
        html.P("Real torch.distributed runs on shaped links (emulation) against the simulator's projection of the "
               "same scenario, by each fidelity (analytic closed forms, des link-level SimPy). Error = (projected − "
               "measured) / measured. Network share = projected transfer time (exposed and hidden behind "
               "backward) ÷ projected iteration: cells with a small share barely test the network model.",
               className="lead"),
    ]
    if not rows:
        return html.Div(className="page", children=[*header, ui.empty_store("validation runs",
                                                                             data.FILL_COMMANDS["validation"])])
    errors = [abs(r["error_pct"]) for r in rows]
    heavy = [abs(r["error_pct"]) for r in filter_rows(rows, min_share=0.3)]
    calibration = store.latest_calibration()
    kpis = [
        html.Div(className="kpi", children=[html.B(f"{len(rows)}"), html.Span("validated scenarios")]),
        html.Div(className="kpi", children=[html.B(f"{sum(errors) / len(errors):.1f} %"),
                                            html.Span("mean |error|")]),
        html.Div(className="kpi", children=[html.B(f"{max(errors):.1f} %"), html.Span("max |error|")]),
        html.Div(className="kpi", children=[html.B(f"{max(heavy):.1f} %" if heavy else "–"),
                                            html.Span(f"max |error|, network share ≥ 30 % ({len(heavy)} rows)")]),
    ]
    if calibration:
        kpis.append(html.Div(className="kpi", children=[
            html.B(f"α {format_seconds(calibration['alpha_s'])}"),
            html.Span(f"β {calibration['beta_s_per_byte']:.3g} s/byte · efficiency {calibration['efficiency']:.2f}"),
        ]))
    return html.Div(className="page", children=[
        *header,
        html.Div(className="kpis", children=kpis),
        html.Div(className="row", children=[
            ui.labelled("Fidelity", dcc.Dropdown(id="validation-fidelity", options=["all", "analytic", "des"],
                                                 value="all", clearable=False)),
            ui.labelled("Network share at least", dcc.Dropdown(
                id="validation-share", options=[{"label": f"{v:.0%}", "value": v} for v in SHARE_CHOICES],
                value=0.0, clearable=False), hint="of the projected iteration"),
            dcc.Checklist(id="validation-calibrated",
                          options=[{"label": " calibrated projections only", "value": "on"}], value=[]),
        ]),
        html.Div(children=[
            ui.figure_card("validation-scatter", "Projected against measured iteration time", height=440),
            html.Div(className="card", children=[
                html.H3("Error per scenario (Export = CSV)"),
                dash_table.DataTable(id="validation-table", columns=COLUMNS, sort_action="native", page_size=12,
                                     export_format="csv", style_table={"overflowX": "auto"},
                                     style_cell={"fontFamily": "Inter, Segoe UI, Helvetica, Arial, sans-serif", "fontSize": 12,
                                                 "padding": "4px 8px", "textAlign": "right"},
                                     style_header={"fontWeight": 600, "backgroundColor": "#f1f5f9"}),
            ]),
        ]),
    ])


def register(app: Dash, reader: StoreReader) -> None:
    """Wire the filters (fidelity, minimum network share, calibrated only)."""

    @app.callback(
        Output(ui.graph_id("validation-scatter"), "figure"),
        Output("validation-table", "data"),
        Input("validation-calibrated", "value"),
        Input("validation-fidelity", "value"),
        Input("validation-share", "value"),
    )
    def _update(calibrated_only, fidelity, min_share):
        if min_share not in (None, *SHARE_CHOICES):
            return ui.empty_figure("choose a network share from the list"), []
        rows = filter_rows(reader.store().validation(), fidelity or "all", bool(calibrated_only),
                           float(min_share or 0.0))
        if not rows:
            return ui.empty_figure("no validation rows match the filters"), []
        return figures.validation_scatter(rows), table_rows(rows)
