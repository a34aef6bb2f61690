"""Non-browser tests of the dashboard's data functions, figures, exports, fits and sweep runner."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dashboard import data, figures, projection, sweep_runner
from pipeline import fits
from benchmarks.dashboard_bench import fill, time_page, time_whatif_updates
from dashboard.export import figure_csv, figure_html
from results.store import Store


# --- fits -------------------------------------------------------------------------------------

def test_fits_recover_known_parameters():
    rng = np.random.default_rng(0)
    exp = rng.exponential(0.02, 400_000)
    assert fits.fit_exponential(exp)["scale"] == pytest.approx(0.02, rel=0.01)
    gamma = rng.gamma(0.5, 3.0, 400_000)
    fitted = fits.fit_gamma(gamma)
    assert fitted["shape"] == pytest.approx(0.5, rel=0.03)
    assert fitted["scale"] == pytest.approx(3.0, rel=0.05)
    xi, sigma = 0.2, 1.5
    gp = sigma / xi * (rng.random(400_000) ** -xi - 1)
    fitted = fits.fit_gpareto(gp)
    assert fitted["shape"] == pytest.approx(xi, abs=0.03)
    assert fitted["scale"] == pytest.approx(sigma, rel=0.05)


def test_page_fits_are_sidcos_estimators_on_a_gradient_with_zeros():
    """The quality page draws the laws SIDCo fits: the same parameters as compressors.numerics.estimators
    (zeros count in μ, not in mean ln), and each law's tail quantile (SciPy) is the estimator's
    threshold."""
    import torch
    from scipy import stats

    from compressors.numerics import estimators

    rng = np.random.default_rng(3)
    g = (rng.laplace(0, 1e-3, 50_000) * (rng.random(50_000) > 0.3)).astype(np.float32)  # ~30 % zeros
    x = torch.from_numpy(np.abs(g))
    mu, var = estimators.mean_and_var(x)
    mean_log = estimators.mean_log_positive(x)
    alpha = estimators.gamma_shape(mu, mean_log)
    xi, sigma = estimators.gpareto_params(mu, var)
    hist = fits.histogram(g, density_target=0.01)
    params = {f["name"]: f["params"] for f in hist["fits"]}
    assert params["exponential"] == {"scale": pytest.approx(float(mu), rel=1e-12)}
    assert params["gamma"] == {"shape": pytest.approx(float(alpha), rel=1e-12),
                               "scale": pytest.approx(float(mu / alpha), rel=1e-12)}
    assert params["gpareto"] == {"shape": pytest.approx(float(xi), rel=1e-12),
                                 "scale": pytest.approx(float(sigma), rel=1e-12)}
    p = 0.01
    assert stats.expon.isf(p, scale=params["exponential"]["scale"]) == pytest.approx(
        float(estimators.exponential_threshold(mu, p)), rel=1e-9)
    assert stats.gamma.isf(p, params["gamma"]["shape"], scale=params["gamma"]["scale"]) == pytest.approx(
        float(estimators.gamma_threshold(mu, mean_log, p)), rel=1e-5)
    assert stats.genpareto.isf(p, params["gpareto"]["shape"], scale=params["gpareto"]["scale"]) == pytest.approx(
        float(estimators.gpareto_threshold(mu, var, p)), rel=1e-9)


def test_histogram_threshold_is_the_exact_top_delta_value():
    g = np.random.default_rng(1).laplace(0, 1e-3, 100_000)
    hist = fits.histogram(g, density_target=0.01)
    assert np.mean(np.abs(g) > hist["threshold"]) == pytest.approx(0.01, abs=2e-4)
    assert {f["name"] for f in hist["fits"]} == {"exponential", "gamma", "gpareto"}


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, st.integers(1, 3000), elements=st.floats(-1e3, 1e3, width=32)))
def test_histogram_of_any_finite_gradient_is_a_probability_density(g):
    hist = fits.histogram(g)
    widths = np.diff(hist["edges"])
    mass = float(np.sum(np.asarray(hist["density"]) * widths))
    assert mass <= 1.0 + 1e-9
    assert mass >= 0.99 or np.quantile(np.abs(g), 0.9995) < np.max(np.abs(g))
    for fit in hist["fits"]:
        assert all(math.isfinite(v) and v >= 0 for v in fit["pdf"])


def test_histogram_rejects_nan_and_empty():
    with pytest.raises(ValueError, match="NaN"):
        fits.histogram(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="empty"):
        fits.histogram(np.array([]))


# --- export -----------------------------------------------------------------------------------

def _typed(values, dtype):
    arr = np.asarray(values, dtype=dtype)
    return {"dtype": arr.dtype.str[1:], "bdata": base64.b64encode(arr.tobytes()).decode()}


def test_figure_csv_decodes_typed_arrays_and_names_axes_with_units():
    fig = figures.figure(
        [{"type": "scatter", "name": "topk", "x": _typed([1e9, 1e10], "<f8"), "y": [3.5, 1.25]}],
        "bandwidth per worker (bit/s)", "iteration time (ms)",
    )
    rows = list(csv.reader(io.StringIO(figure_csv(fig))))
    assert rows[0][:3] == ["trace", "x (bandwidth per worker (bit/s))", "y (iteration time (ms))"]
    assert [(r[0], float(r[1]), float(r[2])) for r in rows[1:]] == [("topk", 1e9, 3.5), ("topk", 1e10, 1.25)]


def test_figure_csv_writes_heatmaps_cell_by_cell():
    rows = [
        {"nodes": 2, "bandwidth_bps": 1e9, "compressor": "sidco-e", "density": 0.01, "iteration_s": 1.0,
         "speedup": 2.0, "rank": 1},
        {"nodes": 2, "bandwidth_bps": 1e9, "compressor": "topk", "density": 0.01, "iteration_s": 1.5,
         "speedup": 1.3, "rank": 2},
        {"nodes": 4, "bandwidth_bps": 1e9, "compressor": "none", "density": None, "iteration_s": 2.0,
         "speedup": 1.0, "rank": 1},
    ]
    out = list(csv.reader(io.StringIO(figure_csv(figures.best_heatmap(rows)))))
    assert len(out) == 1 + 2
    assert "sidco-e δ=0.01" in out[1][5] and "+50%" in out[1][5]


def test_figure_html_is_standalone():
    html = figure_html(figures.whatif_speedup([{"compressor": "topk", "speedup": 1.5}]))
    assert html.lower().startswith("<!doctype html>") and "topk" in html
    assert 'src="https://' not in html and len(html) > 1_000_000  # plotly.js inlined: opens offline


# --- figures ----------------------------------------------------------------------------------

def test_best_grid_margin_against_brute_force():
    rng = np.random.default_rng(2)
    scenarios = [{"nodes": n, "bandwidth_bps": b, "compressor": c, "density": 0.01, "iteration_s": float(t),
                  "speedup": 1.0}
                 for n in (2, 4) for b in (1e9, 1e10) for c, t in zip(("a", "b", "c"), rng.random(3) + 0.1)]
    ranked = []
    for n in (2, 4):
        for b in (1e9, 1e10):
            cell = sorted((s for s in scenarios if s["nodes"] == n and s["bandwidth_bps"] == b),
                          key=lambda s: s["iteration_s"])
            ranked += [{**cell[0], "rank": 1}, {**cell[1], "rank": 2}]
            grid = figures.best_grid(ranked)
            i, j = grid["nodes"].index(n), grid["bandwidths"].index(b)
            assert grid["best"][i][j] == f"{cell[0]['compressor']} δ=0.01"
            assert grid["margin"][i][j] == pytest.approx(cell[1]["iteration_s"] / cell[0]["iteration_s"] - 1)


def test_whatif_breakdown_bar_heights_are_the_iteration_times():
    results = [{"compressor": "none", "iteration_s": 0.2, "compress_s": 0.0, "exposed_comm_s": 0.15, "idle_s": 0.0,
                "speedup": 1.0},
               {"compressor": "sidco-e", "iteration_s": 0.08, "compress_s": 0.01, "exposed_comm_s": 0.02,
                "idle_s": 0.001, "speedup": 2.5}]
    fig = figures.whatif_breakdown(results)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    heights = [sum(t["y"][i] for t in bars) for i in range(2)]
    assert heights == pytest.approx([200.0, 80.0])
    assert "×2.50" in fig["data"][-1]["text"][1]
    assert fig["layout"]["yaxis"]["title"]["text"].endswith("(ms)")


# --- store queries ----------------------------------------------------------------------------

def test_queries_on_a_filled_store(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    written = fill(store, rows=3000)
    assert sum(written.values()) >= 3000
    sweep = store.sweep_list()[0]
    assert sweep["landed"] == written["scenarios"]
    axes = data.sweep_axes(store, sweep["id"])
    assert "none" in axes["compressor"] and axes["nodes"] == sorted(axes["nodes"])
    latency, topology = axes["latency_s"][0], axes["topology"][0]
    best = data.best_two(store, sweep["id"], latency, topology)
    assert {r["rank"] for r in best} == {1, 2}
    assert len(best) == 2 * len(axes["nodes"]) * len(axes["bandwidth_bps"])
    for a, b in zip(best[::2], best[1::2]):
        assert a["iteration_s"] <= b["iteration_s"]
    points = data.crossover_points(store, sweep["id"], axes["bandwidth_bps"][0], latency, topology)
    for p in points:
        beats = store.query("SELECT MAX(density) FROM scenarios WHERE sweep_id=? AND compressor=? AND nodes=?"
                            " AND bandwidth_bps=? AND speedup > 1",
                            (sweep["id"], p["compressor"], p["nodes"], axes["bandwidth_bps"][0]))[0][0]
        assert p["density"] == beats
    replay = store.replay_list()[0]
    quality = store.quality_by_iteration(replay["id"])
    assert all(r["aot_min"] <= r["achieved_over_target"] <= r["aot_max"] for r in quality)
    store.close()


def test_every_page_answers_over_http_on_a_filled_store(tmp_path):
    from dashboard.app import PAGES, create_app

    store = Store(tmp_path / "r.sqlite")
    fill(store, rows=3000)
    store.close()
    app = create_app(tmp_path / "r.sqlite", cache_dir=tmp_path / "cache")
    client = app.server.test_client()
    for page in PAGES:
        result = time_page(app, client, page.PATH)
        assert result["requests"] >= 2, page.PATH
    # the bench's live What-if update is the page's own callback (it raises on an HTTP or inline error)
    assert len(time_whatif_updates(app, client, "layout:resnet50", [8, 16])) == 2


def test_empty_store_pages_name_the_command_that_fills_them(tmp_path):
    from dashboard.app import PAGES, create_app

    app = create_app(tmp_path / "empty.sqlite", cache_dir=tmp_path / "cache")
    client = app.server.test_client()
    texts = {}
    for page in PAGES:
        response = client.post("/_dash-update-component", json={
            "output": "..page.children...nav.children..",
            "outputs": [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"}],
            "inputs": [{"id": "url", "property": "pathname", "value": page.PATH}],
            "changedPropIds": ["url.pathname"], "state": [{"id": "url", "property": "search", "value": ""}]})
        assert response.status_code == 200
        texts[page.PATH] = json.dumps(response.get_json())
    assert "sidco sweep" in texts["/sweeps"]
    assert "sidco replay" in texts["/quality"]
    assert "sidco emulate" in texts["/validation"]
    assert "sidco capture" in texts["/"]


# --- controls and projections -----------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("density", "0", "density must be in (0, 1]"),
    ("density", "lots", "density must be a number"),
    ("nodes", "2.5", "nodes must be a whole number"),
    ("nodes", "0", "nodes must be a whole number"),
    ("bandwidth", "10G", "invalid bandwidth"),
    ("latency", "50", "invalid duration"),
    ("topology", "mesh", "unknown topology"),
    ("source", "/etc/passwd", "choose a trace or a model layout"),
    ("source", "trace:../x", "unknown trace"),
    ("source", "trace:99999999999999999999999", "unknown trace"),
])
def test_invalid_controls_give_one_line_messages(field, value, message):
    controls = {"source": "layout:resnet50", "compressors": ["none"], "density": "0.01", "nodes": "8",
                "bandwidth": "10Gbit", "latency": "50us", "topology": "ring"}
    controls[field] = value
    with pytest.raises(projection.ProjectionError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")) as info:
        projection.parse_controls(**controls)
    assert "\n" not in str(info.value)


def test_layout_projection_matches_the_simulator(tmp_path):
    import simulator
    from costs import devices, throughput

    store = Store(tmp_path / "r.sqlite")
    controls = projection.parse_controls("layout:resnet50", ["none"], "0.01", "16", "25Gbit", "20us", "ring")
    [row] = projection.project(store, controls)
    a100 = devices.get("a100")  # layouts default to a GPU
    flops = throughput.compute(a100, "amp", "cnn", "resnet50").flops_per_s
    layout = simulator.workload_from_layout("resnet50", device_flops_per_s=flops,
                                            memory_bandwidth_Bps=a100.memory_bandwidth_Bps)
    direct = simulator.simulate(simulator.Scenario(layout, 16, 25e9, 20e-6))
    assert row["iteration_s"] == pytest.approx(direct["iteration_s"])
    assert row["speedup"] == pytest.approx(1.0) and row["device"] == "a100"
    store.close()


# --- sweep runner -----------------------------------------------------------------------------

def test_sweep_spec_validation():
    good = ("layout:resnet50", ["topk"], "0.01", "2,4", "1Gbit,10Gbit", "50us", "ring")
    spec = sweep_runner.parse_spec(*good)
    assert spec.grid.compressors == ("none", "fp16", "powersgd", "topk") and len(spec.grid) == 2 * 2 * 4
    for index, bad, message in ((3, "2,x", "invalid node count"), (4, "10", "invalid bandwidth"),
                                (2, "2", "invalid density"), (5, "1", "invalid duration"),
                                (1, [], "at least one compressor")):
        args = list(good)
        args[index] = bad
        with pytest.raises(ValueError, match=message):
            sweep_runner.parse_spec(*args)
    with pytest.raises(ValueError, match="more than the page launches"):
        sweep_runner.parse_spec("layout:resnet50", ["topk"], "0.1,0.01", ",".join(str(n) for n in range(1, 60)),
                                ",".join(f"{b}Gbit" for b in range(1, 60)), "50us", "ring")


def test_an_interrupted_sweep_resumes_and_lands_each_scenario_once(populated_store, tmp_path):
    import shutil

    path = tmp_path / "copy.sqlite"
    shutil.copy(populated_store["path"], path)
    spec = sweep_runner.parse_spec(f"trace:{populated_store['trace']}", ["sidco-e"], "0.1", "2,4,8",
                                   "1Gbit,10Gbit", "10us", "ring")

    class Interrupted(Exception):
        pass

    def stop_after_first_chunk(done: int, total: int) -> None:
        if done > 0:
            raise Interrupted

    with pytest.raises(Interrupted):
        sweep_runner.run(path, spec, stop_after_first_chunk, chunk_size=4)
    sweep_id = sweep_runner.run(path, spec, chunk_size=4)
    store = Store(path)
    count, distinct = store.query("SELECT COUNT(*), COUNT(DISTINCT scenario_key) FROM scenarios WHERE sweep_id=?",
                                  (sweep_id,))[0]
    assert count == distinct == len(spec.grid) == 3 * 2 * 4  # none, fp16, powersgd and sidco-e
    assert store.query("SELECT status FROM sweeps WHERE id=?", (sweep_id,))[0][0] == "done"
    store.close()


# --- command line -----------------------------------------------------------------------------

def test_cli_help_and_bad_port(capsys):
    from sidco.cli import main

    with pytest.raises(SystemExit):
        main(["dashboard", "--help"])
    out = capsys.readouterr().out
    assert "--store" in out and "127.0.0.1" in out
    assert main(["dashboard", "--port", "70000"]) == 2
    assert "invalid port 70000" in capsys.readouterr().err


def test_cli_rejects_a_file_that_is_not_a_store(tmp_path, capsys):
    from sidco.cli import main

    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("not a database " * 100)
    assert main(["dashboard", "--store", str(bogus)]) == 2
    err = capsys.readouterr().err
    assert "not a results store" in err and len(err.strip().splitlines()) == 1


def test_csv_and_html_buttons_download_the_figure_they_sit_on(tmp_path):
    from dashboard.app import create_app

    app = create_app(tmp_path / "r.sqlite", cache_dir=tmp_path / "cache")
    client = app.server.test_client()
    fig = figures.whatif_speedup([{"compressor": "sidco-e", "speedup": 3.25}])
    for kind, name in (("csv", "whatif-speedup.csv"), ("html", "whatif-speedup.html")):
        response = client.post("/_dash-update-component", json={
            "output": f'{{"fig":["MATCH"],"type":"{kind}-dl"}}.data',
            "outputs": {"id": {"fig": "whatif-speedup", "type": f"{kind}-dl"}, "property": "data"},
            "inputs": [{"id": {"fig": "whatif-speedup", "type": f"{kind}-btn"}, "property": "n_clicks", "value": 1}],
            "state": [{"id": {"fig": "whatif-speedup", "type": "graph"}, "property": "figure", "value": fig},
                      {"id": {"fig": "whatif-speedup", "type": "graph"}, "property": "id",
                       "value": {"fig": "whatif-speedup", "type": "graph"}}],
            "changedPropIds": [f'{{"fig":"whatif-speedup","type":"{kind}-btn"}}.n_clicks']})
        assert response.status_code == 200
        download = next(iter(response.get_json()["response"].values()))["data"]
        assert download["filename"] == name
        assert "sidco-e" in download["content"]
        assert kind == "html" or "speed-up,3.25,sidco-e" in download["content"].replace("\r", "")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e12, 1e12, allow_nan=False), st.floats(-1e12, 1e12, allow_nan=False)),
                max_size=40),
       st.text(min_size=1, max_size=12))
def test_figure_csv_has_one_row_per_plotted_point(points, name):
    fig = figures.figure([{"type": "scatter", "name": name, "x": [p[0] for p in points], "y": [p[1] for p in points]}],
                         "x (s)", "y (bytes)")
    rows = list(csv.reader(io.StringIO(figure_csv(fig))))
    assert len(rows) == 1 + len(points)
    assert [(float(r[1]), float(r[2])) for r in rows[1:]] == [(float(x), float(y)) for x, y in points]
    assert all(r[0] == name for r in rows[1:])


def test_timeline_page_simulates_and_downloads_perfetto_json(populated_store, tmp_path):
    from dashboard.app import create_app

    app = create_app(populated_store["path"], cache_dir=tmp_path / "cache")
    client = app.server.test_client()
    values = {"timeline-source": f"trace:{populated_store['trace']}", "timeline-compressors": "sidco-e",
              "timeline-density": "0.01", "timeline-nodes": "4", "timeline-bandwidth": "1Gbit",
              "timeline-latency": "50us", "timeline-topology": "ring", "timeline-fidelity": "des"}
    response = client.post("/_dash-update-component", json={
        "output": '..{"fig":"timeline-gantt","type":"graph"}.figure...timeline-message.children...timeline-data.data..',
        "outputs": [{"id": {"fig": "timeline-gantt", "type": "graph"}, "property": "figure"},
                    {"id": "timeline-message", "property": "children"}, {"id": "timeline-data", "property": "data"}],
        "inputs": [{"id": k, "property": "value", "value": v} for k, v in values.items()],
        "state": [], "changedPropIds": ["timeline-nodes.value"]})
    assert response.status_code == 200
    body = response.get_json()["response"]
    trace = body["timeline-data"]["data"]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    gantt = body['{"fig":"timeline-gantt","type":"graph"}']["figure"]
    assert sum(len(t["x"]) for t in gantt["data"]) == len(spans)
    assert gantt["layout"]["xaxis"]["title"]["text"] == "time since iteration start (ms)"
    download = client.post("/_dash-update-component", json={
        "output": "timeline-perfetto.data", "outputs": {"id": "timeline-perfetto", "property": "data"},
        "inputs": [{"id": "timeline-perfetto-btn", "property": "n_clicks", "value": 1}],
        "state": [{"id": "timeline-data", "property": "data", "value": trace}],
        "changedPropIds": ["timeline-perfetto-btn.n_clicks"]}).get_json()["response"]["timeline-perfetto"]["data"]
    assert download["filename"].endswith(".json")
    assert json.loads(download["content"])["traceEvents"] == trace["traceEvents"]


def test_sidco_dashboard_serves_on_loopback_and_prints_its_address(populated_store):
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "sidco", "dashboard", "--store", str(populated_store["path"]), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    assert response.status == 200 and "SIDCo testbed" in response.read().decode()
                break
            except OSError:
                assert time.time() < deadline and process.poll() is None
                time.sleep(0.3)
        listening = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as lines:
                for line in list(lines)[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        listening.append(local.rsplit(":", 1)[0])
        assert listening == ["0100007F"]  # 127.0.0.1 only (little-endian hex), no IPv6 or wildcard
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_sweep_queries_keep_latencies_and_topologies_apart(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    sweep_id, _ = store.get_or_create("sweeps", {"hand": 1}, total=8)
    rows = []
    for latency, topology, winner in ((1e-6, "ring", "topk"), (1e-3, "ring", "sidco-e"), (1e-6, "tree", "sidco-e")):
        for compressor in ("topk", "sidco-e"):
            t = 1.0 if compressor == winner else 2.0
            rows.append({"scenario_key": f"{latency}|{topology}|{compressor}",
                         "compressor": compressor, "density": 0.01, "nodes": 8, "bandwidth_bps": 1e9,
                         "latency_s": latency, "topology": topology, "fidelity": "analytic", "iteration_s": t,
                         "samples_per_s": None, "forward_s": None, "backward_s": None, "compress_s": None,
                         "exposed_comm_s": None, "idle_s": None, "speedup": 3.0 / t, "result_json": "{}"})
    store.add_scenarios(sweep_id, rows)
    for latency, topology, winner in ((1e-6, "ring", "topk"), (1e-3, "ring", "sidco-e"), (1e-6, "tree", "sidco-e")):
        best = data.best_two(store, sweep_id, latency, topology)
        assert [(r["rank"], r["compressor"]) for r in best][0] == (1, winner) and len(best) == 2
        assert len(store.scenarios(int(sweep_id), nodes=8, latency_s=latency, topology=topology)) == 2
    axes = data.sweep_axes(store, sweep_id)
    assert axes["latency_s"] == [1e-6, 1e-3] and axes["topology"] == ["ring", "tree"]
    store.close()


def test_achieved_over_target_is_weighted_by_elements(tmp_path):
    """A tiny bucket where k = max(1, δ·n) rounds up must not dominate the per-iteration ratio."""
    store = Store(tmp_path / "r.sqlite")
    trace_id = store.register_trace(tmp_path / "t", {"workload": "w", "workers": 1, "iterations": [0]})
    replay_id, _ = store.get_or_create("replays", {"t": trace_id}, trace_id=trace_id)
    base = dict(compressor="topk", density=0.01, error_feedback=1, iteration=0,
                worker=0, threshold=None, stages=None, compress_s=1e-4, decompress_s=1e-5, rel_error=0.5)
    store.add_replay_rows(replay_id, [
        dict(base, bucket=0, numel=100_000, selected=1_000, achieved_density=0.01,
             achieved_over_target=1.0, wire_bytes=8_000),
        dict(base, bucket=1, numel=10, selected=1, achieved_density=0.1,
             achieved_over_target=10.0, wire_bytes=8),
    ])
    (row,) = store.quality_by_iteration(int(replay_id))
    assert row["achieved_over_target"] == pytest.approx(1001 / 100_010 / 0.01)
    assert (row["aot_min"], row["aot_max"]) == (1.0, 10.0)
    store.close()


def test_whatif_compares_against_fp16_and_powersgd_by_default():
    from dashboard.pages import whatif

    controls = whatif.controls("t", [{"label": "x", "value": "layout:gpt2"}], multi=True)
    chosen = next(c for c in controls if "t-compressors" in str(c)).children[-1].value
    assert chosen[:3] == ["none", "fp16", "powersgd"]
    results = [{"compressor": "none", "speedup": 1.0, "iteration_s": 2.0},
               {"compressor": "fp16", "speedup": 1.6, "iteration_s": 1.25},
               {"compressor": "sidco-e", "speedup": 2.0, "iteration_s": 1.0}]
    fig = figures.whatif_speedup(results)
    assert [t["name"] for t in fig["data"]] == ["vs none (fp32)", "vs fp16"]
    assert fig["data"][1]["x"] == [0.625, 1.0, 1.25]          # fp16's 1.25 s ÷ each iteration time
