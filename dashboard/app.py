"""The Dash application: six pages over one results store.

``create_app(store_path)`` builds the app; ``app.run(host, port)`` serves it. Pages are
routed by URL path; each page reads the store through :mod:`dashboard.data`
when it is opened, so a store that fills while the app runs shows new data on
the next visit (the sweeps page also refreshes while a sweep it launched runs).
"""

from __future__ import annotations

import functools
import inspect
import os
import tempfile
from pathlib import Path
from urllib.parse import parse_qs

import diskcache
from dash import Dash, DiskcacheManager, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import limits, projection
from dashboard.data import StoreReader
from dashboard.pages import quality, sweeps, timeline, tta, validation, whatif
from processes.jobs import run_as_child

PAGES = (whatif, sweeps, quality, timeline, validation, tta)
ASSETS = Path(__file__).parent / "assets"


class ChildManager(DiskcacheManager):
    """Dash's disk-cache manager whose background jobs (sweeps and training runs launched from the
    pages) are safe children of the dashboard (:func:`processes.children.adopt`): they end when
    the dashboard ends and import nothing from its working directory."""

    def call_job_fn(self, key, job_fn, args, context):
        return super().call_job_fn(key, functools.partial(run_as_child, os.getpid(), job_fn), args, context)


def _nav(pathname: str) -> list:
    return [dcc.Link(page.TITLE, href=page.PATH, className="active" if page.PATH == pathname else "",
                     id=f"nav-{page.__name__.rsplit('.', 1)[-1]}")
            for page in PAGES]


def create_app(store_path: str | Path, cache_dir: str | Path | None = None) -> Dash:
    """Build the dashboard over the store at ``store_path``.

    ``cache_dir`` holds the background-callback cache (a temporary directory,
    removed when the process exits, if not given). The compressor and layout registries (which import
    torch) are loaded here, once, so the first page load does not pay for them.
    """
    reader = StoreReader(store_path)
    reader.store()
    projection.compressor_names()
    projection.layout_names()
    scratch = None if cache_dir else tempfile.TemporaryDirectory(prefix="sidco-dashboard-")
    cache = diskcache.Cache(str(cache_dir or scratch.name))
    manager = ChildManager(cache)
    app = Dash(__name__, title="SIDCo testbed", assets_folder=str(ASSETS), suppress_callback_exceptions=True,
               background_callback_manager=manager)
    app.sidco_scratch = scratch  # lives (and is removed at exit) with the app
    limits.install(app.server)
    app.layout = html.Div([
        dcc.Location(id="url"),
        html.Header(className="topbar", children=[
            html.Div(className="brand", children=["SIDCo testbed", html.Small("what-if dashboard")]),
            html.Nav(id="nav", children=_nav("/")),
            html.Div(f"store: {Path(store_path)}", className="store"),
        ]),
        html.Main(id="page"),
    ])
    routes = {page.PATH: page for page in PAGES}

    @app.callback(Output("page", "children"), Output("nav", "children"), Input("url", "pathname"),
                  State("url", "search"))
    def _route(pathname, search):
        page = routes.get(pathname or "/")
        if page is None:
            return html.Div(className="page", children=[html.H2("Not found"), html.P(f"No page at {pathname}.")]), \
                _nav(pathname)
        if "query" in inspect.signature(page.layout).parameters:  # e.g. /tta?run=3&nodes=8 (the demo's links)
            query = {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items()}
            return page.layout(reader, query=query), _nav(page.PATH)
        return page.layout(reader), _nav(page.PATH)

    ui.register_downloads(app)
    whatif.register(app, reader)
    sweeps.register(app, reader, manager)
    quality.register(app, reader)
    timeline.register(app, reader)
    validation.register(app, reader)
    tta.register(app, reader, manager)
    return app

