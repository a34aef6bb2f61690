"""Turn a plotly figure (as the browser holds it) into CSV and standalone HTML."""

from __future__ import annotations

import base64
import csv
import io
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

_COLUMNS = ("x", "y", "z", "base", "text")


def _array(value: Any) -> list | None:
    """Decode a plotly data array: a list, or a ``{"dtype", "bdata", "shape"}`` typed array."""
    if value is None:
        return None
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            dims = [int(d) for d in str(shape).split(",")] if isinstance(shape, str) else list(shape)
            data = data.reshape(dims)
        return data.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def figure_csv(figure: dict[str, Any]) -> str:
    """CSV of the data behind ``figure``: one row per plotted point, with the trace name.

    Heatmaps are written one row per cell (x, y, z). The header names the
    axes with their units, taken from the axis titles.
    """
    layout = figure.get("layout", {}) or {}

    def title(axis: str, default: str) -> str:
        node = layout.get(axis, {}) or {}
        text = node.get("title", {})
        text = text.get("text") if isinstance(text, dict) else text
        return f"{default} ({text})" if text else default

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["trace", title("xaxis", "x"), title("yaxis", "y"), "z", "base", "text"])
    for index, trace in enumerate(figure.get("data", []) or []):
        name = trace.get("name") or f"trace {index}"
        arrays = {key: _array(trace.get(key)) for key in _COLUMNS}
        if trace.get("type") == "heatmap" and arrays["z"] is not None:
            xs, ys = arrays["x"], arrays["y"]
            texts = arrays["text"]
            for i, row in enumerate(arrays["z"]):
                for j, z in enumerate(row):
                    label = texts[i][j] if texts and i < len(texts) and isinstance(texts[i], list) else ""
                    writer.writerow([name, xs[j] if xs else j, ys[i] if ys else i, z, "", label])
            continue
        length = max((len(a) for a in arrays.values() if a is not None), default=0)
        for i in range(length):
            writer.writerow(
                [name]
                + [
                    (arrays[key][i] if arrays[key] is not None and i < len(arrays[key]) else "")
                    for key in _COLUMNS
                ]
            )
    return out.getvalue()


def figure_html(figure: dict[str, Any]) -> str:
    """A standalone HTML page of ``figure`` (plotly.js inlined, works offline)."""
    return pio.to_html(go.Figure(figure), include_plotlyjs=True, full_html=True)
