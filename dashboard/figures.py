"""Figure builders: plain data (lists of dicts) in, plotly figure dicts with unit-labelled axes out.

Figures are built as plain ``{"data", "layout"}`` dicts (what ``dcc.Graph``
sends to plotly.js) rather than ``plotly.graph_objects`` objects, whose
per-property validation costs hundreds of milliseconds on large sweeps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import plotly.io as pio

from units import format_bandwidth

Figure = dict[str, Any]

PALETTE = (
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563",
    "#65a30d",
)
PARTS = (
    ("compute_s", "compute (forward + backward + optimizer)", "#94a3b8"),
    ("compress_s", "compress + decompress", "#f59e0b"),
    ("exposed_comm_s", "exposed communication", "#dc2626"),
    ("idle_s", "idle", "#cbd5e1"),
)
KIND_COLOURS = {"forward": "#64748b", "backward": "#2563eb", "compress": "#f59e0b", "decompress": "#a855f7",
                "optimizer": "#16a34a"}
TEMPLATE = pio.templates["plotly_white"].to_plotly_json()
FONT = {"family": "Inter, Segoe UI, Helvetica, Arial, sans-serif", "size": 12}
SIDE_LEGEND = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"}
"""A legend to the right of the plot, outside it: plotly widens the right margin to hold it, so it
never covers the plot, its ticks or its axis titles, however many series there are (the figures of
the full-width Sweeps and Time-to-accuracy cards)."""


def color(index: int) -> str:
    """The palette colour for series ``index``."""
    return PALETTE[index % len(PALETTE)]


def figure(data: list[dict[str, Any]], x_title: str, y_title: str, *, x_type: str | None = None,
           y_type: str | None = None, shapes: list[dict[str, Any]] | None = None, **layout: Any) -> Figure:
    """A figure dict with the common look and both axis titles (which carry the units).

    ``x_type``/``y_type``: ``"log"``, ``"category"``…; ``None`` lets plotly.js infer the type.
    """
    base = {
        "template": TEMPLATE,
        "font": FONT,
        "margin": {"l": 64, "r": 20, "t": 30, "b": 56},
        "legend": {"orientation": "h", "y": -0.24, "x": 0},
        "xaxis": {"title": {"text": x_title}, "automargin": True, **({"type": x_type} if x_type else {})},
        "yaxis": {"title": {"text": y_title}, "automargin": True, **({"type": y_type} if y_type else {})},
        "shapes": shapes or [],
    }
    for key, value in layout.items():
        if key in ("xaxis", "yaxis"):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return {"data": data, "layout": base}


def hline(y: float, dash: str = "dash") -> dict[str, Any]:
    """A horizontal reference line across the plot at ``y``."""
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y,
            "line": {"dash": dash, "color": "#374151", "width": 1.5}}


def vline(x: float, dash: str = "dash") -> dict[str, Any]:
    """A vertical reference line across the plot at ``x``."""
    return {"type": "line", "yref": "paper", "y0": 0, "y1": 1, "x0": x, "x1": x,
            "line": {"dash": dash, "color": "#374151", "width": 1.5}}


def _ms(seconds: float | None) -> float:
    return 0.0 if seconds is None else float(seconds) * 1e3


def series_name(compressor: str, density: float | None) -> str:
    """Legend name of a (compressor, density) configuration."""
    return compressor if density is None or compressor == "none" else f"{compressor} δ={density:g}"


def _groups(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[tuple, list[dict[str, Any]]]:
    grouped: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[tuple(row[k] for k in keys)].append(row)
    return dict(grouped)


def whatif_breakdown(results: Sequence[dict[str, Any]], title: str = "") -> Figure:
    """Stacked bars per compressor: compute, compress, exposed communication, idle (ms).

    Compute is ``iteration_s − compress_s − exposed_comm_s − idle_s``, so a bar's
    height is the projected iteration time; the speed-up over ``none`` is written on top.
    """
    names = [r.get("label") or r["compressor"] for r in results]
    parts: dict[str, list[float]] = {key: [] for key, _, _ in PARTS}
    for r in results:
        compress, exposed, idle = (_ms(r.get(k)) for k in ("compress_s", "exposed_comm_s", "idle_s"))
        parts["compress_s"].append(compress)
        parts["exposed_comm_s"].append(exposed)
        parts["idle_s"].append(idle)
        parts["compute_s"].append(max(_ms(r["iteration_s"]) - compress - exposed - idle, 0.0))
    data = [{"type": "bar", "x": names, "y": parts[key], "name": label, "marker": {"color": colour},
             "hovertemplate": "%{x}: %{y:.3g} ms<extra>" + label + "</extra>"} for key, label, colour in PARTS]
    totals = [_ms(r["iteration_s"]) for r in results]
    labels = [f"{t:.3g} ms · ×{r['speedup']:.2f}" if r.get("speedup") is not None else f"{t:.3g} ms"
              for t, r in zip(totals, results)]
    data.append({"type": "scatter", "x": names, "y": totals, "mode": "text", "text": labels,
                 "textposition": "top center", "showlegend": False, "hoverinfo": "skip",
                 "name": "iteration time (ms) · speed-up over none (×)"})
    top = max(totals, default=1.0) or 1.0
    return figure(data, "compressor", "projected iteration time (ms)", barmode="stack",
                  legend={"orientation": "h", "y": -0.24, "x": 0, "traceorder": "normal"},
                  yaxis={"range": [0, top * 1.2]}, title={"text": title, "font": {"size": 13}, "x": 0.01})


SPEEDUP_TEXT = {"textposition": "outside", "textfont": {"size": 13, "color": "#111827"}, "cliponaxis": False}
"""Speed-up labels outside their bars at a readable size (with ``uniformtext`` mode ``show``:
otherwise plotly shrinks them to the bar's thickness)."""


def whatif_speedup(results: Sequence[dict[str, Any]]) -> Figure:
    """Horizontal bars: speed-up over ``none`` (×, dimensionless) per compressor, with the 1× line
    and, where the results carry them, error bars spanning ``speedup_low`` to ``speedup_high``;
    when ``fp16`` is among the results, a second bar per compressor gives the speed-up over the
    fp16 dense baseline (its iteration time ÷ this one's), the strongest plain alternative."""
    values = [float(r["speedup"]) if r.get("speedup") is not None else 0.0 for r in results]
    colours = ["#16a34a" if v > 1.005 else "#dc2626" if v < 0.995 else "#6b7280" for v in values]
    names = [r.get("label") or r["compressor"] for r in results]
    dense16 = next((r for r in results if r["compressor"] == "fp16" and r.get("iteration_s")), None)
    data = [{"type": "bar", "orientation": "h", "x": values, "y": names, "marker": {"color": colours},
             "name": "speed-up" if dense16 is None else "vs none (fp32)", "text": [f"×{v:.2f}" for v in values],
             **SPEEDUP_TEXT}]
    if all(r.get("speedup_low") is not None and r.get("speedup_high") is not None for r in results):
        data[0]["error_x"] = {"type": "data", "symmetric": False,  # the error band of each projection
                              "array": [float(r["speedup_high"]) - v for r, v in zip(results, values)],
                              "arrayminus": [v - float(r["speedup_low"]) for r, v in zip(results, values)]}
        data[0].update(textposition="inside", insidetextanchor="start")  # outside, the error bar would cross it
    if dense16 is not None:
        versus = [float(dense16["iteration_s"]) / float(r["iteration_s"]) if r.get("iteration_s") else 0.0
                  for r in results]
        data.append({"type": "bar", "orientation": "h", "x": versus, "y": names, "marker": {"color": "#93c5fd"},
                     "name": "vs fp16", "text": [f"×{v:.2f}" for v in versus], **SPEEDUP_TEXT})
    title = "speed-up over none" + (" and over fp16" if dense16 is not None else "") + " in the same scenario (×)"
    return figure(data, title, "compressor", shapes=[vline(1.0)], showlegend=dense16 is not None,
                  yaxis={"autorange": "reversed"}, barmode="group", margin={"l": 64, "r": 64, "t": 30, "b": 56},
                  uniformtext={"mode": "show", "minsize": 12})


BANDWIDTH_AXIS = "NIC bandwidth per worker and direction (bits/s)"
"""The x axis of every sweep plot; its ticks are formatted bandwidths (``10 Gbit/s``) on all of them."""


def sweep_vs_bandwidth(rows: Sequence[dict[str, Any]], metric: str) -> Figure:
    """Iteration time (ms) or speed-up (×) against bandwidth (bit/s), log axes, per configuration."""
    data = []
    groups = sorted(_groups(rows, ("compressor", "density")).items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 0)))
    for i, ((compressor, density), series) in enumerate(groups):
        series = sorted(series, key=lambda r: r["bandwidth_bps"])
        ys = [_ms(r["iteration_s"]) if metric == "iteration_s" else r["speedup"] for r in series]
        data.append({"type": "scatter", "mode": "lines+markers", "x": [r["bandwidth_bps"] / 1e9 for r in series],
                     "y": ys, "name": series_name(compressor, density), "line": {"color": color(i)}})
    ticks = sorted({r["bandwidth_bps"] for r in rows})
    xaxis = {"tickvals": [b / 1e9 for b in ticks], "ticktext": [format_bandwidth(b) for b in ticks]}
    if metric == "iteration_s":
        return figure(data, BANDWIDTH_AXIS, "iteration time (ms)", x_type="log", y_type="log",
                      xaxis=xaxis, legend=SIDE_LEGEND)
    return figure(data, BANDWIDTH_AXIS, "speed-up over none (×)", x_type="log", y_type="log",
                  shapes=[hline(1.0)], xaxis=xaxis, legend=SIDE_LEGEND)


def best_grid(best_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Grid of the fastest configuration per (nodes, bandwidth) from rank-1/rank-2 rows.

    Returns ``{"nodes", "bandwidths", "best": [[name]], "margin": [[fraction]], "speedup": [[×]]}``;
    margin = runner-up time / best time − 1 (0.10: the best is 10 % faster than the runner-up).
    """
    cells: dict[tuple[int, float], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in best_rows:
        cells[(r["nodes"], r["bandwidth_bps"])][int(r["rank"])] = r
    nodes = sorted({n for n, _ in cells})
    bandwidths = sorted({b for _, b in cells})
    grid: dict[str, Any] = {"nodes": nodes, "bandwidths": bandwidths, "best": [], "margin": [], "speedup": []}
    for n in nodes:
        best, margin, speedup = [], [], []
        for b in bandwidths:
            cell = cells.get((n, b), {})
            first, second = cell.get(1), cell.get(2)
            best.append(series_name(first["compressor"], first["density"]) if first else None)
            margin.append(second["iteration_s"] / first["iteration_s"] - 1.0
                          if first and second and first["iteration_s"] > 0 else 0.0 if first else None)
            speedup.append(first["speedup"] if first else None)
        grid["best"].append(best), grid["margin"].append(margin), grid["speedup"].append(speedup)
    return grid


def _cell(name: str | None, margin: float, speedup: float | None) -> str:
    """A heatmap cell: the fastest configuration, its margin over the runner-up (%) and speed-up over none (×)."""
    if name is None:
        return ""
    return f"{name}<br>+{margin * 100:.0f}%" + ("" if speedup is None else f" · ×{speedup:.2f}")


def best_heatmap(best_rows: Sequence[dict[str, Any]]) -> Figure:
    """Nodes × bandwidth heatmap: colour = fastest configuration, text = margin and speed-up over none."""
    grid = best_grid(best_rows)
    names = sorted({name for row in grid["best"] for name in row if name is not None})
    index = {name: i for i, name in enumerate(names)}
    z = [[index[name] if name is not None else None for name in row] for row in grid["best"]]
    text = [[_cell(name, m, s) for name, m, s in zip(row, mrow, srow)]
            for row, mrow, srow in zip(grid["best"], grid["margin"], grid["speedup"])]
    steps = max(len(names), 1)
    scale = []
    for i in range(steps):
        scale += [[i / steps, color(i)], [(i + 1) / steps, color(i)]]
    data = [{
        "type": "heatmap", "x": [format_bandwidth(b) for b in grid["bandwidths"]],
        "y": [str(n) for n in grid["nodes"]], "z": z, "text": text, "texttemplate": "%{text}",
        "textfont": {"size": 12, "color": "white"}, "colorscale": scale, "zmin": -0.5, "zmax": steps - 0.5,
        "name": "fastest configuration", "xgap": 2, "ygap": 2,
        "colorbar": {"tickvals": list(range(steps)), "ticktext": names, "title": {"text": "fastest"}},
        "hovertemplate": "%{y} nodes, %{x}<br>%{text}<extra></extra>",
    }]
    return figure(data, BANDWIDTH_AXIS, "nodes (workers)", x_type="category", y_type="category",
                  margin={"l": 64, "r": 20, "t": 30, "b": 56})


def crossover(points: Sequence[dict[str, Any]], nodes_axis: Sequence[int]) -> Figure:
    """Largest swept density at which each compressor beats ``none``, against nodes, with the 1/p line.

    The dashed 1/p line is where a sparse all-gather of 4-byte values + 4-byte
    indices moves as many bytes as a dense ring all-reduce.
    """
    data = []
    for i, ((compressor,), series) in enumerate(sorted(_groups(points, ("compressor",)).items())):
        data.append({"type": "scatter", "mode": "lines+markers", "x": [r["nodes"] for r in series],
                     "y": [r["density"] for r in series], "name": f"{compressor}: largest density with speed-up > 1",
                     "line": {"color": color(i)}})
    if nodes_axis:
        data.append({"type": "scatter", "mode": "lines", "x": list(nodes_axis), "y": [1.0 / n for n in nodes_axis],
                     "name": "1/p (byte crossover)", "line": {"dash": "dash", "color": "#111827"}})
    values = [r["density"] for r in points] + [1.0 / n for n in nodes_axis]
    ticks = sorted({r["density"] for r in points})
    if values:
        low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        ticks = sorted(set(ticks) | {10.0 ** e for e in range(low, high + 1)})
    return figure(data, "nodes p (workers)", "density k/n (fraction of elements sent)", x_type="log", y_type="log",
                  xaxis={"tickvals": list(nodes_axis)}, yaxis={"tickvals": ticks, "tickformat": ".3~g"},
                  legend=SIDE_LEGEND)


def quality_lines(rows: Sequence[dict[str, Any]], metric: str, y_title: str, reference: float | None = None,
                  log_y: bool = False) -> Figure:
    """``metric`` over iterations, one line per (compressor, density, error feedback)."""
    data = []
    groups = sorted(_groups(rows, ("compressor", "density", "error_feedback")).items(),
                    key=lambda kv: (kv[0][0], -kv[0][1], -kv[0][2]))
    for i, ((compressor, density, ef), series) in enumerate(groups):
        ys = [r[metric] for r in series]
        if all(y is None for y in ys):
            continue
        data.append({"type": "scatter", "mode": "lines+markers", "x": [r["iteration"] for r in series], "y": ys,
                     "name": f"{compressor} δ={density:g}" + ("" if ef else " (no EF)"),
                     "line": {"color": color(i)}, "marker": {"size": 5}})
    return figure(data, "training iteration", y_title, y_type="log" if log_y else None,
                  xaxis={"tickformat": "d"},
                  shapes=[hline(reference)] if reference is not None else [])


def compress_time(rows: Sequence[dict[str, Any]]) -> Figure:
    """Mean compression time per call (ms) against dense vector size (bytes), log–log."""
    data = []
    for i, ((compressor, density), series) in enumerate(sorted(_groups(rows, ("compressor", "density")).items())):
        data.append({"type": "scatter", "mode": "lines+markers", "x": [r["nbytes"] for r in series],
                     "y": [_ms(r["compress_s"]) for r in series], "name": series_name(compressor, density),
                     "line": {"color": color(i)}})
    return figure(data, "dense vector size (bytes, fp32)", "compress time per call (ms)", x_type="log", y_type="log")


def histogram_with_fits(hist: dict[str, Any]) -> Figure:
    """Histogram of |g| (probability density) with the fitted densities of :mod:`dashboard.fits`."""
    edges = hist["edges"]
    data = [{"type": "bar", "x": [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])], "y": hist["density"],
             "width": [b - a for a, b in zip(edges[:-1], edges[1:])], "name": "|g| histogram",
             "marker": {"color": "#cbd5e1", "line": {"width": 0}}}]
    for i, fit in enumerate(hist["fits"]):
        data.append({"type": "scatter", "mode": "lines", "x": hist["x"], "y": fit["pdf"], "name": fit["label"],
                     "line": {"color": color(i + 1), "width": 2}})
    shapes, annotations = [], []
    if hist.get("threshold") is not None:
        shapes.append(vline(hist["threshold"], "dot"))
        annotations.append({"x": hist["threshold"], "y": 1, "yref": "paper", "showarrow": False, "xanchor": "left",
                            "text": f" exact top-δ threshold {hist['threshold']:.3g}"})
    return figure(data, "|g| (gradient magnitude, parameter units)", "probability density (per |g| unit)",
                  y_type="log", shapes=shapes, annotations=annotations, bargap=0)


def gantt(events: Sequence[dict[str, Any]], process_names: dict[Any, str],
          thread_names: dict[tuple, str]) -> Figure:
    """Gantt chart of Chrome-trace complete events (ts/dur in µs), drawn in ms, one row per worker/stream.

    Colours follow the event kind, the first word of its name (forward, backward, compress,
    the collective in red, decompress, optimizer); a thin white edge separates buckets.
    """
    rows = sorted({(e["pid"], e.get("tid", 0)) for e in events})
    labels = {key: f"{process_names.get(key[0], f'worker {key[0]}')} · {thread_names.get(key, f'stream {key[1]}')}"
              for key in rows}
    categories: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        categories[str(e["name"]).split(" ")[0]].append(e)
    data = []
    order = list(KIND_COLOURS)
    for category, items in sorted(categories.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 2.5)):
        data.append({
            "type": "bar", "orientation": "h", "name": category,
            "y": [labels[(e["pid"], e.get("tid", 0))] for e in items], "x": [e["dur"] / 1e3 for e in items],
            "base": [e["ts"] / 1e3 for e in items], "text": [e["name"] for e in items], "textposition": "none",
            "marker": {"color": KIND_COLOURS.get(category, "#dc2626"), "line": {"color": "white", "width": 1}},
            "hovertemplate": "%{text}<br>start %{base:.3f} ms, duration %{x:.3f} ms<extra></extra>",
        })
    return figure(data, "time since iteration start (ms)", "worker · stream", barmode="overlay",
                  legend={"orientation": "h", "y": -0.16, "x": 0, "traceorder": "normal"},
                  yaxis={"categoryorder": "array", "categoryarray": [labels[k] for k in reversed(rows)]})


def validation_scatter(rows: Sequence[dict[str, Any]]) -> Figure:
    """Projected against measured iteration time (ms) with the y = x line, one series per
    (fidelity, calibrated); the hover names the cell's network share."""
    data = []
    keyed = [{**r, "fidelity": r.get("fidelity") or "analytic"} for r in rows]
    for i, ((fidelity, calibrated), series) in enumerate(sorted(_groups(keyed, ("fidelity", "calibrated")).items())):
        data.append({
            "type": "scatter", "mode": "markers", "x": [_ms(r["measured_s"]) for r in series],
            "y": [_ms(r["projected_s"]) for r in series],
            "name": f"{fidelity}, {'calibrated' if calibrated else 'uncalibrated'}",
            "marker": {"size": 9, "color": color(i), "opacity": 0.8},
            "text": [f"{r['workload']} · {r['compressor']} · {r['workers']} workers · network "
                     + ("?" if r.get("network_share") is None else f"{r['network_share']:.0%}") for r in series],
            "hovertemplate": "%{text}<br>measured %{x:.2f} ms, projected %{y:.2f} ms<extra></extra>",
        })
    values = [_ms(r[k]) for r in rows for k in ("measured_s", "projected_s")]
    if values:
        lo, hi = min(values) * 0.9, max(values) * 1.1
        data.append({"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [lo, hi], "name": "y = x",
                     "line": {"dash": "dash", "color": "#111827"}})
    return figure(data, "measured iteration time (ms)", "projected iteration time (ms)")


def tta_curves(curves: dict[str, list[dict[str, Any]]], x_key: str, metric: str, target: float | None) -> Figure:
    """Held-out ``metric`` (``accuracy``, fraction, or ``eval_loss``, nats) against ``x_key``
    (``time_s``: projected wall-clock seconds, or ``iteration``) per (compressor, density), with
    the target as a dashed line. Points are means over the seeds; where a curve has a spread
    (``<metric>_spread``: several seeds) it is drawn as a band of mean ± spread."""
    data = []
    for i, (name, points) in enumerate(sorted(curves.items())):
        points = sorted((p for p in points if p.get(metric) is not None and p.get(x_key) is not None),
                        key=lambda p: p["iteration"])
        xs, ys = [p[x_key] for p in points], [p[metric] for p in points]
        spreads = [p.get(f"{metric}_spread") for p in points]
        if points and all(s is not None for s in spreads):
            upper = [y + s for y, s in zip(ys, spreads)]
            lower = [y - s for y, s in zip(ys, spreads)]
            data.append({"type": "scatter", "mode": "lines", "name": f"{name} ± spread", "x": xs + xs[::-1],
                         "y": upper + lower[::-1], "fill": "toself", "line": {"width": 0, "color": color(i)},
                         "opacity": 0.2, "hoverinfo": "skip", "showlegend": False})
        data.append({"type": "scatter", "mode": "lines+markers", "name": name, "line": {"color": color(i)},
                     "x": xs, "y": ys})
    x_title = "projected wall-clock time (s)" if x_key == "time_s" else "iteration"
    y_title = "held-out accuracy (fraction)" if metric == "accuracy" else "held-out loss (nats)"
    return figure(data, x_title, y_title, shapes=[hline(target)] if target is not None else [], legend=SIDE_LEGEND)


def tta_bars(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> Figure:
    """Horizontal bars: time to target (s) per (compressor, density); unreached ones are named, with no bar."""
    labels = [f"{n} (never)" if r["time_to_target_s"] is None else n for n, r in zip(names, rows)]
    values = [r["time_to_target_s"] for r in rows]
    colours = ["#16a34a" if i == 0 and v is not None else "#94a3b8" for i, v in enumerate(values)]
    data = [{"type": "bar", "orientation": "h", "x": values, "y": labels, "marker": {"color": colours},
             "name": "time to target", "text": [("-" if v is None else f"{v:.3g} s") for v in values],
             "textposition": "auto"}]
    return figure(data, "time to target (s)", "compressor", showlegend=False, yaxis={"autorange": "reversed"})
