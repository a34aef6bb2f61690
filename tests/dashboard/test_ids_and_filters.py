"""Ids and filters no store row can match (a huge trace id, text in a sweep filter) answer over
HTTP with the page's one-line inline error, never HTTP 500 (issue 36 item 12)."""

from __future__ import annotations

import json

import pytest

from benchmarks.dashboard_bench import fill
from dashboard import sweep_runner
from dashboard.limits import INPUT_MAX_CHARS
from dashboard.app import create_app
from results.store import MAX_ROW_ID, Store

HUGE = "99999999999999999999999"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A filled store (traces, replays, a sweep), the app over it and its test client."""
    root = tmp_path_factory.mktemp("ids")
    with Store(root / "r.sqlite") as store:
        fill(store, rows=3000)
        sweep_id = store.sweep_list()[0]["id"]
        axes = store.sweep_axes(sweep_id)
        replay_id = store.replay_list()[0]["id"]
    app = create_app(root / "r.sqlite", cache_dir=root / "cache")
    return {"app": app, "client": app.server.test_client(), "sweep": sweep_id, "axes": axes, "replay": replay_id}


def call(served, marker: str, values: dict) -> tuple[int, dict]:
    """Post the page callback whose output names ``marker``, its inputs and state taken from
    ``values`` (component id → value); the HTTP status and the JSON response."""
    app = served["app"]
    key = next(k for k in app.callback_map if marker in k)
    spec = app.callback_map[key]
    outputs = [{"id": o.component_id, "property": o.component_property} for o in spec["output"]]

    def given(items):
        return [{**item, "value": values.get(item["id"])} for item in items]

    response = served["client"].post("/_dash-update-component", json={
        "output": key, "outputs": outputs, "inputs": given(spec["inputs"]), "state": given(spec["state"]),
        "changedPropIds": [f"{spec['inputs'][0]['id']}.{spec['inputs'][0]['property']}"]})
    return response.status_code, (response.get_json() or {}).get("response", {})


def inline_errors(body: dict) -> list[str]:
    """The texts of the inline errors (``ui.error``) anywhere in a callback's response."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            props = node.get("props")
            if isinstance(props, dict) and props.get("className") == "inline-error":
                found.append(props["children"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(body)
    return found


WHATIF = {"whatif-compressors": ["none"], "whatif-density": "0.01", "whatif-nodes": "8", "whatif-bandwidth": "10Gbit",
          "whatif-latency": "50us", "whatif-topology": "ring", "whatif-calibrated": [], "whatif-device": "",
          "whatif-costs": ""}


@pytest.mark.parametrize("source, message", [
    (f"trace:{HUGE}", f"unknown trace '{HUGE}'"),
    (f"trace:{MAX_ROW_ID + 1}", f"unknown trace '{MAX_ROW_ID + 1}'"),
    ("trace:" + "9" * (INPUT_MAX_CHARS - len("trace:")), "unknown trace '9999"),  # the longest value a page takes
    ("trace:²", "unknown trace '²'"),
    ("trace:0", "unknown trace '0'"),
    (f"trace:{MAX_ROW_ID}", f"trace #{MAX_ROW_ID} is not registered"),
])
def test_a_trace_id_no_row_can_have_is_an_inline_error_on_the_whatif_page(served, source, message):
    status, body = call(served, "whatif-message", {**WHATIF, "whatif-source": source})
    assert status == 200
    [error] = inline_errors(body)
    assert error.startswith(message) and "\n" not in error


def test_a_huge_device_profile_id_is_an_inline_error(served):
    status, body = call(served, "whatif-message", {**WHATIF, "whatif-source": "layout:resnet50", "whatif-costs": HUGE})
    assert status == 200
    assert inline_errors(body) == [f"unknown device profile '{HUGE}'"]


def test_a_sweep_launched_on_a_huge_trace_id_is_refused_before_it_starts():
    with pytest.raises(ValueError, match=f"^unknown trace '{HUGE}'$"):
        sweep_runner.parse_spec(f"trace:{HUGE}", ["topk"], "0.01", "2", "1Gbit", "50us", "ring")


def sweep_values(served, **changed) -> dict:
    """The Sweeps page's picker and filters at the sweep's first values, with ``changed`` ones."""
    axes = served["axes"]
    values = {"sweep-select": served["sweep"], "sweep-latency": axes["latency_s"][0],
              "sweep-topology": axes["topology"][0], "sweep-nodes": axes["nodes"][-1],
              "sweep-bandwidth": axes["bandwidth_bps"][0]}
    return {**values, **{f"sweep-{name}": value for name, value in changed.items()}}


def test_the_sweeps_page_plots_a_sweep_at_its_own_filter_values(served):
    status, body = call(served, "sweep-message", sweep_values(served))
    assert status == 200 and inline_errors(body) == []
    time_plot = body['{"fig":"sweep-time","type":"graph"}']["figure"]
    assert sum(len(trace["x"]) for trace in time_plot["data"]) > 0


@pytest.mark.parametrize("changed, message", [
    ({"select": "abc"}, "unknown sweep 'abc'"),
    ({"select": HUGE}, f"unknown sweep '{HUGE}'"),
    ({"select": 10**30}, f"unknown sweep {10**30}"),
    ({"select": 12345}, "sweep #12345 has no scenario in the store"),
    ({"latency": "abc"}, "has no latency 'abc'"),
    ({"latency": 0.125}, "has no latency 0.125"),
    ({"nodes": "x"}, "has no node count 'x'"),
    ({"nodes": 10**30}, f"has no node count {10**30}"),
    ({"bandwidth": "fast"}, "has no bandwidth 'fast'"),
    ({"topology": 7}, "has no topology 7"),
])
def test_a_sweep_filter_the_sweep_does_not_have_is_an_inline_error(served, changed, message):
    status, body = call(served, "sweep-message", sweep_values(served, **changed))
    assert status == 200
    [error] = inline_errors(body)
    assert message in error and "\n" not in error
    assert all(not body[f'{{"fig":"{name}","type":"graph"}}']["figure"]["data"]
               for name in ("sweep-time", "sweep-speedup", "sweep-best", "sweep-crossover"))


@pytest.mark.parametrize("sweep", ["abc", HUGE, 12345])
def test_the_filters_of_a_sweep_no_row_has_are_empty(served, sweep):
    status, body = call(served, "sweep-latency", sweep_values(served, select=sweep))
    assert status == 200
    assert json.dumps(body["sweep-latency"]) == json.dumps({"options": [], "value": None})


@pytest.mark.parametrize("replay", ["abc", HUGE, 10**30, 12345])
def test_a_replay_id_no_row_has_leaves_the_quality_page_blank(served, replay):
    status, body = call(served, "quality-compressors", {"quality-replay": replay})
    assert status == 200 and body["quality-compressors"] == {"options": [], "value": []}
    status, body = call(served, "quality-aot", {"quality-replay": replay, "quality-compressors": ["topk"]})
    assert status == 200
    figure = body['{"fig":"quality-aot","type":"graph"}']["figure"]
    assert not figure["data"] and "choose a replay from the list" in json.dumps(figure["layout"])


def test_the_quality_page_still_plots_a_stored_replay(served):
    status, body = call(served, "quality-compressors", {"quality-replay": served["replay"]})
    assert status == 200 and body["quality-compressors"]["options"]


@pytest.mark.parametrize("share", ["abc", 0.2, HUGE])
def test_a_network_share_the_validation_filter_does_not_offer_is_a_blank_plot(served, share):
    status, body = call(served, "validation-scatter", {"validation-calibrated": [], "validation-fidelity": "all",
                                                       "validation-share": share})
    assert status == 200
    figure = body['{"fig":"validation-scatter","type":"graph"}']["figure"]
    assert not figure["data"] and "choose a network share from the list" in json.dumps(figure["layout"])


@pytest.mark.parametrize("run", ["abc", HUGE, "0"])
def test_a_convergence_id_no_row_can_have_is_an_inline_error_on_the_tta_page(served, run):
    status, body = call(served, "tta-message", {"tta-run": run, "tta-nodes": "8", "tta-bandwidth": "1Gbit",
                                                "tta-latency": "50us", "tta-topology": "ring",
                                                "tta-metric": "accuracy", "tta-target": "0.5"})
    assert status == 200
    assert inline_errors(body) == [f"invalid convergence {run!r}: an id or 'latest'"]
