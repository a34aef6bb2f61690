"""Shared page pieces: figure cards with downloads, messages, empty-store notes."""

from __future__ import annotations

import re

from collections.abc import Callable
from typing import Any

from dash import MATCH, Dash, Input, Output, State, dcc, html, no_update

from dashboard.export import figure_csv, figure_html
from dashboard.figures import TEMPLATE
from dashboard.limits import INPUT_MAX_CHARS

GRAPH = "graph"


def graph_id(name: str) -> dict[str, str]:
    """The pattern-matching id of the figure called ``name``."""
    return {"type": GRAPH, "fig": name}


def figure_card(name: str, title: str, figure: dict[str, Any] | None = None, height: int = 380) -> html.Div:
    """A titled card holding a graph plus 'CSV' and 'HTML' download buttons.

    PNG comes from the plotly mode bar (camera icon).
    """
    config = {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": name, "scale": 2},
    }
    return html.Div(
        className="card",
        children=[
            html.Div(
                className="card-head",
                children=[
                    html.H3(title),
                    html.Div(
                        className="downloads",
                        children=[
                            html.Button("CSV", id={"type": "csv-btn", "fig": name}, className="btn-small"),
                            html.Button("HTML", id={"type": "html-btn", "fig": name}, className="btn-small"),
                            dcc.Download(id={"type": "csv-dl", "fig": name}),
                            dcc.Download(id={"type": "html-dl", "fig": name}),
                        ],
                    ),
                ],
            ),
            dcc.Graph(
                id=graph_id(name),
                figure=figure if figure is not None else empty_figure(""),
                config=config,
                style={"height": f"{height}px"},
            ),
        ],
    )


def empty_figure(message: str) -> dict[str, Any]:
    """A blank figure showing ``message`` in its middle."""
    return {
        "data": [],
        "layout": {
            "template": TEMPLATE,
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
            "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
            "annotations": [{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5,
                             "y": 0.5, "font": {"size": 14, "color": "#6b7280"}}],
        },
    }


def loading(children, delay_ms: int = 400) -> dcc.Loading:
    """Show a spinner over ``children`` when an update takes longer than ``delay_ms``
    (the first projection of a compressor measures its costs, which takes seconds)."""
    return dcc.Loading(children, delay_show=delay_ms, type="circle",
                       overlay_style={"visibility": "visible", "opacity": 0.55})


_ABSOLUTE_PATH = re.compile(r"(?P<url>\b[a-z][\w+.-]*://\S*)|(?<![\w.~])/(?:[^\s/:'\"]+/)*([^\s/:'\"]*)")
"""An absolute path (its last component in group 2), or a URL (``chrome://tracing``, kept whole)."""


def public_message(message: str) -> str:
    """``message`` with every absolute server path cut to its last component (``…/name``):
    pages never show where the server keeps its files."""
    return _ABSOLUTE_PATH.sub(lambda m: m["url"] or (f"…/{m[2]}" if m[2] else "…/"), str(message))


def error(message: str) -> html.Div:
    """An inline error message under a control (absolute paths removed, :func:`public_message`)."""
    return html.Div(public_message(message), className="inline-error", role="alert")


def note(message: str) -> html.Div:
    """An inline neutral message (absolute paths removed, :func:`public_message`)."""
    return html.Div(public_message(message), className="inline-note")


def memory_text(row: dict[str, Any]) -> str:
    """A row's memory per GPU (GiB, one decimal), ``✗ does not fit`` after it when it does not fit;
    ``-`` where the row has none."""
    if row.get("memory_gib") is None:
        return "-"
    return f"{row['memory_gib']:.1f}" + (" ✗ does not fit" if row.get("fits") is False else "")


def memory_cell(row: dict[str, Any]) -> html.Td:
    """A row's memory per GPU (GiB, :data:`pipeline.memory.MEMORY_KEYS`) as :func:`memory_text` says it;
    its parts on hover (its ``memory_reason`` where it has none)."""
    if row.get("memory_gib") is None:
        reason = row.get("memory_reason")
        return html.Td(memory_text(row), **({"title": reason} if reason else {}))
    parts = ", ".join(f"{name.replace('_', ' ')} {gib:.2f}" for name, gib in row["memory_parts_gib"].items())
    unfit = row.get("fits") is False
    return html.Td(memory_text(row), title=f"GiB: {parts}", **({"className": "unfit"} if unfit else {}))


def empty_store(what: str, command: str) -> html.Div:
    """The panel shown when the store holds nothing for a page: which command fills it."""
    return html.Div(
        className="empty-store",
        children=[
            html.P(f"The results store has no {what} yet. Fill it with:"),
            html.Pre(command),
        ],
    )


def labelled(label: str, control, hint: str | None = None, wide: bool = False) -> html.Div:
    """A control with its label (and an optional unit hint); ``wide`` takes twice the room in a row.
    A text input takes at most :data:`~dashboard.limits.INPUT_MAX_CHARS` characters (the server's limit)."""
    if isinstance(control, dcc.Input):
        control.maxLength = INPUT_MAX_CHARS
    children = [html.Label(label), control]
    if hint:
        children.append(html.Small(hint, className="hint"))
    return html.Div(className="control wide" if wide else "control", children=children)


def sites_controls(prefix: str, query: dict[str, str], sites_hint: str, rtt_hint: str) -> list:
    """The sites, WAN bandwidth (bits/s, e.g. ``1Gbit``) and WAN round trip controls (``sidco compare``'s
    ``--sites``, ``--wan-bandwidth``, ``--wan-rtt``), ids ``<prefix>-sites``, ``-wan-bandwidth``, ``-wan-rtt``;
    ``query``'s ``sites``, ``wan_bandwidth`` and ``wan_rtt`` set their starting values."""
    return [
        labelled("Sites", dcc.Input(id=f"{prefix}-sites", value=query.get("sites", "1"), debounce=True), sites_hint),
        labelled("WAN bandwidth per site", dcc.Input(id=f"{prefix}-wan-bandwidth", value=query.get("wan_bandwidth", ""),
                                                     debounce=True), "with more than one site: e.g. 1Gbit"),
        labelled("WAN round trip", dcc.Input(id=f"{prefix}-wan-rtt", value=query.get("wan_rtt", ""), debounce=True),
                 rtt_hint),
    ]


def launch_controls(prefix: str, label: str) -> list:
    """The foot of a launch panel: the launch and cancel buttons, a progress bar with its text,
    and the status line; ids ``<prefix>launch-btn``, ``<prefix>cancel-btn``,
    ``<prefix>launch-progress``, ``<prefix>launch-progress-text``, ``<prefix>launch-status``."""
    return [
        html.Div(className="row", children=[
            html.Button(label, id=f"{prefix}launch-btn", className="btn"),
            html.Button("Cancel", id=f"{prefix}cancel-btn", className="btn secondary", disabled=True),
        ]),
        html.Div(style={"height": "8px"}),
        html.Progress(id=f"{prefix}launch-progress", value="0", max="1"),
        html.Div(id=f"{prefix}launch-progress-text", className="inline-note"),
        html.Div(id=f"{prefix}launch-status"),
    ]


def launch_callback(prefix: str, launched: str, poll: str, manager) -> dict[str, Any]:
    """Keyword arguments of the background callback behind :func:`launch_controls`: progress
    into the bar, its text and the ``launched`` store (the id of the run under way); while it
    runs, launch is disabled and cancel and the ``poll`` interval are enabled."""
    return {
        "background": True,
        "manager": manager,
        "progress": [Output(f"{prefix}launch-progress", "value"), Output(f"{prefix}launch-progress", "max"),
                     Output(f"{prefix}launch-progress-text", "children"), Output(launched, "data")],
        "running": [(Output(f"{prefix}launch-btn", "disabled"), True, False),
                    (Output(f"{prefix}cancel-btn", "disabled"), False, True),
                    (Output(poll, "disabled"), False, True)],
        "cancel": [Input(f"{prefix}cancel-btn", "n_clicks")],
        "prevent_initial_call": True,
    }


def register_downloads(app: Dash) -> None:
    """Wire every figure card's CSV/HTML buttons to its graph."""
    for kind, export in (("csv", figure_csv), ("html", figure_html)):
        _register_download(app, kind, export)


def _register_download(app: Dash, kind: str, export: Callable[[dict], str]) -> None:
    """One pattern-matching callback: the ``{kind}-btn`` button of a card sends its figure,
    rendered by ``export``, as ``<figure name>.{kind}``."""

    @app.callback(
        Output({"type": f"{kind}-dl", "fig": MATCH}, "data"),
        Input({"type": f"{kind}-btn", "fig": MATCH}, "n_clicks"),
        State({"type": GRAPH, "fig": MATCH}, "figure"),
        State({"type": GRAPH, "fig": MATCH}, "id"),
        prevent_initial_call=True,
    )
    def _download(clicks, figure, ident):
        if not clicks or not figure:
            return no_update
        return dcc.send_string(export(figure), f"{ident['fig']}.{kind}")
