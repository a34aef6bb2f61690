"""The dashboard in a real headless chromium (dash[testing] ``dash_duo``) over a populated store."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.keys import Keys

from dashboard import create_app, sweep_runner
from results.store import Store

ROOT = Path(__file__).resolve().parents[2]
PAGES = (("whatif", "/"), ("sweeps", "/sweeps"), ("quality", "/quality"), ("timeline", "/timeline"),
         ("validation", "/validation"), ("tta", "/tta"))

pytestmark = pytest.mark.browser


def _tree_status() -> str | None:
    """``git status --porcelain`` of the checkout (untracked files included), or None outside a git work tree."""
    result = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


@pytest.fixture(autouse=True)
def _tree_left_as_found(request):
    """Every browser test leaves the checkout as it found it: ``git status --porcelain`` is the
    same after the test as before (screenshots go to a temporary directory; only an explicit
    ``--screenshots DIR``, ``make screenshots``, writes elsewhere)."""
    before = _tree_status()
    yield
    if request.config.getoption("--screenshots") is None:
        assert _tree_status() == before, "the test changed the checkout (git status --porcelain)"


@pytest.fixture
def screenshots(request, tmp_path) -> Path:
    """Where the page screenshots go: ``--screenshots DIR`` (``make screenshots``: docs/screenshots),
    else a temporary directory, so that ``make test`` writes nothing into the checkout."""
    chosen = request.config.getoption("--screenshots")
    return Path(chosen).resolve() if chosen else tmp_path / "screenshots"


def _figure_data(dash_duo, name: str) -> list | None:
    """The plotted traces of figure ``name`` as plotly.js holds them (looked up inside the page, so a
    re-render between lookup and read cannot leave a stale handle)."""
    return dash_duo.driver.execute_script(
        "const box = document.getElementById(JSON.stringify({fig: arguments[0], type: 'graph'}));"
        "const p = box && box.querySelector('.js-plotly-plot');"
        "return p && p.data ? JSON.parse(JSON.stringify(p.data.map(t => ({name: t.name, x: t.x, y: t.y})))) : null;",
        name,
    )


def _wait_idle(dash_duo, timeout: float = 30.0) -> None:
    """Wait until no callback is pending, every graph is drawn, and the plotted traces stop changing
    over three polls 0.3 s apart (callbacks fire a moment after the layout arrives)."""
    state_js = (
        "const busy = document.querySelectorAll('[data-dash-is-loading=\"true\"]').length"
        " + (document.querySelectorAll('.dash-graph').length"
        " - document.querySelectorAll('.dash-graph .main-svg').length > 0 ? 1 : 0);"
        "const traces = Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".map(p => JSON.stringify((p.data || []).map(t => [t.name, t.y && t.y.length, t.x && t.x.length])));"
        "return [busy, traces.join('|')];"
    )
    deadline = time.time() + timeout
    last, stable = None, 0
    while time.time() < deadline:
        busy, traces = dash_duo.driver.execute_script(state_js)
        if not busy and traces == last:
            stable += 1
            if stable >= 3:
                return
        else:
            stable = 0
        last = traces
        time.sleep(0.3)
    raise AssertionError("page did not settle")


def _wait_for_figure(dash_duo, name: str, timeout: float = 30.0) -> list:
    """The traces of figure ``name`` once it has any."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        traces = _figure_data(dash_duo, name)
        if traces:
            return traces
        time.sleep(0.2)
    message = dash_duo.driver.execute_script("return document.querySelector('.page').innerText.slice(0, 600)")
    raise AssertionError(f"figure {name} stayed empty; page: {message}; console: {dash_duo.get_logs()}")


def _severe(dash_duo) -> list:
    return [entry for entry in dash_duo.get_logs() or [] if entry.get("level") == "SEVERE"]


def _screenshot(dash_duo, path: Path) -> None:
    """Save the whole page (not just the viewport) as a PNG."""
    height = int(dash_duo.driver.execute_script("return document.documentElement.scrollHeight"))
    metrics = {"width": 1400, "height": min(max(height, 900), 3000), "deviceScaleFactor": 1, "mobile": False}
    dash_duo.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    _wait_idle(dash_duo)
    dash_duo.driver.save_screenshot(str(path))
    dash_duo.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


LAYOUT_PROBLEMS_JS = """
const box = (e) => { const r = e.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
const overlap = (a, b) => Math.min(a.r, b.r) - Math.max(a.l, b.l) > 1 && Math.min(a.b, b.b) - Math.max(a.t, b.t) > 1;
const inside = (a, b) => a.l >= b.l - 1 && a.t >= b.t - 1 && a.r <= b.r + 1 && a.b <= b.b + 1;
const problems = [];
for (const plot of document.querySelectorAll('.js-plotly-plot')) {
  const name = JSON.parse(plot.closest('[id^="{"]').id).fig;
  const svg = box(plot.querySelector('.main-svg'));
  const areas = Array.from(plot.querySelectorAll('.nsewdrag')).map(box);
  const labels = Array.from(plot.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text'))
    .filter(e => e.textContent.trim()).map(e => [e.textContent.trim(), box(e)]);
  for (const [text, b] of labels) if (!inside(b, svg)) problems.push(`${name}: label '${text}' is clipped`);
  for (const area of areas) if (area.r - area.l < MIN_PLOT_WIDTH) problems.push(`${name}: plot squeezed to ${Math.round(area.r - area.l)} px`);
  const legend = plot.querySelector('.legend .bg');
  if (!legend) continue;
  const key = box(legend);
  if (!inside(key, svg)) problems.push(`${name}: legend is clipped`);
  for (const area of areas) if (overlap(key, area)) problems.push(`${name}: legend overlaps the plot`);
  for (const [text, b] of labels) if (overlap(key, b)) problems.push(`${name}: legend overlaps the label '${text}'`);
}
return problems;
"""
"""The layout faults of every figure on the page, read from the DOM's bounding boxes: a legend that
overlaps a plot area, a tick label or an axis title, or is cut off by its figure's edge; a tick label
or axis title cut off; a plot area narrower than ``MIN_PLOT_WIDTH`` (px)."""


def _layout_problems(dash_duo, min_plot_width: int = 400) -> list[str]:
    """:data:`LAYOUT_PROBLEMS_JS` on the open page (plot areas at least ``min_plot_width`` px wide)."""
    return dash_duo.driver.execute_script(LAYOUT_PROBLEMS_JS.replace("MIN_PLOT_WIDTH", str(min_plot_width)))


def _open_idle(dash_duo, app, path: str, ready: str) -> None:
    """Start the app, open ``path``, wait for the element ``ready`` and for the callbacks to settle."""
    dash_duo.start_server(app)
    dash_duo.driver.get(dash_duo.server_url + path)
    dash_duo.wait_for_element(ready, timeout=10)
    _wait_idle(dash_duo)


def _set_input(dash_duo, selector: str, value: str) -> None:
    element = dash_duo.find_element(selector)
    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(Keys.DELETE)
    element.send_keys(value, Keys.ENTER)


@pytest.fixture
def store_path(populated_store, tmp_path) -> Path:
    """A private copy of the populated store (SQLite backup), so tests that launch sweeps don't interfere."""
    path = tmp_path / "results.sqlite"
    source, target = sqlite3.connect(populated_store["path"]), sqlite3.connect(path)
    source.backup(target)
    source.close(), target.close()
    return path


@pytest.fixture
def app(store_path, tmp_path):
    return create_app(store_path, cache_dir=tmp_path / "cache")


def test_every_page_loads_without_console_errors_and_is_screenshotted(dash_duo, app, store_path, screenshots):
    """Every page loads without console errors, and at 1400 × 1000 no legend covers a plot area, a
    tick label or an axis title, nothing is cut off and no plot is squeezed (:func:`_layout_problems`),
    also with a legend of 13 series: the Sweeps page opens on the newest sweep, here six compressors
    at two densities beside none."""
    screenshots.mkdir(parents=True, exist_ok=True)
    many = ["topk", "dgc", "sidco-e", "gaussiank", "redsync", "randomk"]
    sweep_runner.run(store_path, sweep_runner.parse_spec("layout:resnet50", many, "0.1,0.01", "2,8",
                                                         "1Gbit,10Gbit,100Gbit", "50us", "ring"))
    dash_duo.start_server(app)
    for name, path in PAGES:
        started = time.perf_counter()
        dash_duo.driver.get(dash_duo.server_url + path)
        dash_duo.wait_for_element(".page h2", timeout=10)
        _wait_idle(dash_duo)
        elapsed = time.perf_counter() - started
        assert dash_duo.find_elements(".js-plotly-plot"), f"{name}: no figure drawn"
        assert _severe(dash_duo) == [], f"{name}: console errors"
        if name == "quality":  # the two thresholds are explained on the page
            assert "Two thresholds, two inputs" in dash_duo.find_element(".page").text
        if name == "timeline":
            assert "chrome://tracing" in dash_duo.find_element(".page").text
        if name == "sweeps":
            entries = dash_duo.driver.execute_script(
                "return document.querySelectorAll('.js-plotly-plot .legend .traces').length")
            assert entries >= 2 * 13, "both bandwidth plots show the 13 series of the newest sweep"
        assert _layout_problems(dash_duo) == [], name
        _screenshot(dash_duo, screenshots / f"{name}.png")
        assert (screenshots / f"{name}.png").stat().st_size > 10_000, f"{name}: the screenshot is blank"
        # after the screenshot's wait for an idle page; read in the page, as find_elements would wait
        # its implicit 2 s for an element that is (rightly) absent
        errors = dash_duo.driver.execute_script(
            "return Array.from(document.querySelectorAll('.inline-error')).map(e => e.innerText)")
        assert not errors, f"{name}: {errors[0]}"
        assert elapsed < 15, f"{name} took {elapsed:.1f} s in the browser"


def test_changing_a_control_updates_the_projection_and_bad_input_is_inline(dash_duo, app):
    dash_duo.start_server(app)
    _wait_for_figure(dash_duo, "whatif-breakdown")
    _wait_idle(dash_duo)
    before = _figure_data(dash_duo, "whatif-breakdown")
    assert before and before[0]["x"], "the what-if figure is empty"
    dash_duo.wait_for_contains_text("#whatif-verdict", "measure it: sidco ", timeout=10)
    dash_duo.wait_for_contains_text("#whatif-quality-table", "energy vs Top-k", timeout=10)
    assert "shipped table: transformer" in dash_duo.find_element("#whatif-quality-table").text  # BERT-base's
    _set_input(dash_duo, "#whatif-nodes", "64")
    dash_duo.wait_for_contains_text(".js-plotly-plot .gtitle", "64 nodes", timeout=10)
    _wait_idle(dash_duo)
    after = _figure_data(dash_duo, "whatif-breakdown")
    assert after[-1]["y"] != before[-1]["y"], "iteration times did not change with the node count"
    _set_input(dash_duo, "#whatif-samples-per-s", "400")
    dash_duo.wait_for_contains_text("#whatif-message", "compute from your measured throughput", timeout=10)
    _set_input(dash_duo, "#whatif-samples-per-s", "0")
    dash_duo.wait_for_contains_text(".inline-error", "--samples-per-s must be a finite number > 0", timeout=10)
    _set_input(dash_duo, "#whatif-samples-per-s", "")
    _set_input(dash_duo, "#whatif-bandwidth", "fast")
    dash_duo.wait_for_contains_text(".inline-error", "invalid bandwidth", timeout=10)
    assert _severe(dash_duo) == []


def test_a_sweep_launched_from_the_page_lands_rows(dash_duo, app, store_path):
    store = Store(store_path)
    before = {row[0] for row in store.query("SELECT id FROM sweeps")}
    _open_idle(dash_duo, app, "/sweeps", "#launch-btn")
    _set_input(dash_duo, "#launch-nodes", "2,8")
    _set_input(dash_duo, "#launch-bandwidths", "1Gbit,25Gbit")
    dash_duo.find_element("#launch-btn").click()
    dash_duo.wait_for_contains_text("#launch-status", "finished", timeout=90)
    new = [row for row in store.query("SELECT id, total FROM sweeps") if row[0] not in before]
    assert len(new) == 1
    sweep_id, total = new[0]
    landed = store.query("SELECT COUNT(*), COUNT(DISTINCT scenario_key) FROM scenarios WHERE sweep_id=?",
                         (sweep_id,))[0]
    assert landed[0] == landed[1] == total == 2 * 2 * (3 + 2 * 2)
    dash_duo.wait_for_contains_text("#sweep-select", f"#{sweep_id}", timeout=10)
    config = json.loads(store.query("SELECT config_json FROM sweeps WHERE id=?", (sweep_id,))[0][0])
    assert config["source"]["origin"] == "dashboard"
    store.close()
    assert _severe(dash_duo) == []


def test_a_running_sweep_can_be_cancelled_from_the_page(dash_duo, app, store_path):
    store = Store(store_path)
    before = {row[0] for row in store.query("SELECT id FROM sweeps")}
    _open_idle(dash_duo, app, "/sweeps", "#launch-btn")
    dash_duo.select_dcc_dropdown("#launch-source", "layout: vgg19")
    _set_input(dash_duo, "#launch-densities", "0.05,0.002")
    _set_input(dash_duo, "#launch-nodes", ",".join(str(n) for n in range(900, 1024, 2)))  # big clusters: slow enough to cancel
    dash_duo.find_element("#launch-btn").click()
    deadline = time.time() + 30
    while time.time() < deadline and not [r for r in store.query("SELECT id FROM sweeps") if r[0] not in before]:
        time.sleep(0.2)
    dash_duo.wait_for_element("#cancel-btn:not([disabled])", timeout=10).click()
    dash_duo.wait_for_element("#launch-btn:not([disabled])", timeout=15)
    [(sweep_id, total, status)] = [tuple(r) for r in store.query("SELECT id, total, status FROM sweeps")
                                   if r[0] not in before]
    landed = store.query("SELECT COUNT(*) FROM scenarios WHERE sweep_id=?", (sweep_id,))[0][0]
    assert status == "running" and landed < total
    assert "finished" not in dash_duo.find_element("#launch-status").text
    store.close()


def test_time_to_accuracy_page_projects_on_the_chosen_cluster(dash_duo, app, populated_store):
    dash_duo.start_server(app)
    dash_duo.driver.get(dash_duo.server_url + "/tta")
    dash_duo.wait_for_element("#tta-run", timeout=10)
    traces = _wait_for_figure(dash_duo, "tta-time")
    _wait_idle(dash_duo)
    assert sorted(t["name"] for t in traces) == ["none", "topk@0.1"]
    assert [t["x"] for t in _figure_data(dash_duo, "tta-iterations")][0] == [2, 4, 6, 8]
    shapes = dash_duo.driver.execute_script(
        "const box = document.getElementById(JSON.stringify({fig: 'tta-time', type: 'graph'}));"
        "return box.querySelector('.js-plotly-plot').layout.shapes.map(s => s.y0);")
    target = float(dash_duo.find_element("#tta-target").get_attribute("value"))
    assert shapes == [target], "the target line is drawn at the target"
    rows = dash_duo.driver.execute_script("return document.querySelectorAll('#tta-table tbody tr').length")
    assert rows == 1 + 2, "header plus one row per (compressor, density)"
    before = dash_duo.find_element("#tta-table").text
    _set_input(dash_duo, "#tta-bandwidth", "10Mbit")
    deadline = time.time() + 20
    while time.time() < deadline and dash_duo.find_element("#tta-table").text == before:
        time.sleep(0.2)
    assert dash_duo.find_element("#tta-table").text != before, "iteration times did not follow the bandwidth"
    _set_input(dash_duo, "#tta-nodes", "2.5")
    dash_duo.wait_for_contains_text(".inline-error", "invalid node count", timeout=10)
    assert _severe(dash_duo) == []


def test_a_convergence_run_launched_from_the_page_lands_rows(dash_duo, app, store_path):
    _open_idle(dash_duo, app, "/tta", "#tta-launch-btn")
    _set_input(dash_duo, "#tta-launch-iterations", "4")
    _set_input(dash_duo, "#tta-launch-eval", "2")
    dash_duo.find_element("#tta-launch-btn").click()
    dash_duo.wait_for_contains_text("#tta-launch-status", "finished", timeout=180)
    store = Store(store_path)
    run = store.convergence("latest")
    counts = store.query("SELECT compressor, COUNT(*) FROM convergence_rows WHERE convergence_id=? GROUP BY compressor",
                         (run["id"],))
    assert sorted(tuple(r) for r in counts) == [("none", 4), ("sidco-e", 4), ("topk", 4)]
    assert run["trace_id"] is not None and run["status"] == "done"
    store.close()
    dash_duo.wait_for_contains_text("#tta-run", f"#{run['id']}", timeout=10)
    assert _severe(dash_duo) == []
