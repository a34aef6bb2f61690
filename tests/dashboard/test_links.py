"""Pages open on the scenario their address names (the demo links to its own run and trace)."""

from __future__ import annotations

from dashboard.data import StoreReader
from dashboard.pages import tta, whatif


def _values(component, found=None) -> dict:
    found = {} if found is None else found
    if getattr(component, "id", None) is not None and hasattr(component, "value"):
        found[component.id] = component.value
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            _values(child, found)
    return found


def test_whatif_defaults_to_a_gpu_layout_and_takes_the_scenario_from_the_address(tmp_path):
    reader = StoreReader(tmp_path / "r.sqlite")
    plain = _values(whatif.layout(reader))
    assert plain["whatif-source"] == "layout:bert-base" and plain["whatif-bandwidth"] == "10Gbit"
    linked = _values(whatif.layout(reader, query={"source": "layout:gpt2", "nodes": "32", "bandwidth": "1Gbit",
                                                  "density": "0.001", "device": "h100"}))
    assert (linked["whatif-source"], linked["whatif-nodes"], linked["whatif-bandwidth"], linked["whatif-density"],
            linked["whatif-device"]) == ("layout:gpt2", "32", "1Gbit", "0.001", "h100")
    unknown = _values(whatif.layout(reader, query={"source": "trace:999", "device": "tpu"}))
    assert unknown["whatif-source"] == "layout:bert-base" and unknown["whatif-device"] == ""


def test_tta_takes_cluster_and_target_from_the_address(tmp_path):
    reader = StoreReader(tmp_path / "r.sqlite")
    linked = _values(tta.layout(reader, query={"nodes": "8", "bandwidth": "100Mbit", "target": "0.25"}))
    assert (linked["tta-nodes"], linked["tta-bandwidth"], linked["tta-target"]) == ("8", "100Mbit", "0.25")


def test_notes_keep_urls_and_cut_server_paths():
    """The Timeline note names chrome://tracing intact; absolute server paths are still cut."""
    from dashboard import components

    note = "Open the file at ui.perfetto.dev or chrome://tracing."
    assert components.public_message(note) == note
    assert components.public_message("see https://ui.perfetto.dev/#!/viewer") == "see https://ui.perfetto.dev/#!/viewer"
    assert components.public_message("cannot read /root/runs/x.sqlite") == "cannot read …/x.sqlite"



def test_sweep_plots_share_one_bandwidth_axis_with_units():
    """Line plots and the heatmap name the bandwidth axis alike and label ticks with units."""
    from dashboard import figures

    rows = [{"compressor": c, "density": d, "nodes": 8, "bandwidth_bps": b, "iteration_s": t, "speedup": s}
            for c, d, b, t, s in (("none", None, 1e9, 0.2, 1.0), ("none", None, 1e10, 0.1, 1.0),
                                  ("topk", 0.01, 1e9, 0.1, 2.0), ("topk", 0.01, 1e10, 0.09, 1.11))]
    best = [{**r, "rank": rank} for r, rank in ((rows[2], 1), (rows[0], 2), (rows[3], 1), (rows[1], 2))]
    line = figures.sweep_vs_bandwidth(rows, "iteration_s")["layout"]["xaxis"]
    heat = figures.best_heatmap(best)
    assert line["title"]["text"] == heat["layout"]["xaxis"]["title"]["text"] == figures.BANDWIDTH_AXIS
    assert line["ticktext"] == heat["data"][0]["x"] == ["1 Gbit/s", "10 Gbit/s"]
    assert heat["data"][0]["text"][0][0] == "topk δ=0.01<br>+100% · ×2.00"


def test_the_route_passes_the_address_query_to_the_page(tmp_path):
    from dashboard.app import create_app

    app = create_app(tmp_path / "r.sqlite", cache_dir=tmp_path / "cache")
    response = app.server.test_client().post("/_dash-update-component", json={
        "output": "..page.children...nav.children..",
        "outputs": [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"}],
        "inputs": [{"id": "url", "property": "pathname", "value": "/tta"}], "changedPropIds": ["url.pathname"],
        "state": [{"id": "url", "property": "search", "value": "?nodes=24&bandwidth=100Mbit"}]})
    assert response.status_code == 200
    values = _values_json(response.get_json()["response"]["page"]["children"])
    assert values["tta-nodes"] == "24" and values["tta-bandwidth"] == "100Mbit"


def _values_json(node, found=None) -> dict:
    found = {} if found is None else found
    if isinstance(node, dict):
        props = node.get("props", {})
        if "id" in props and "value" in props:
            found[props["id"]] = props["value"]
        _values_json(props.get("children"), found)
    elif isinstance(node, list):
        for child in node:
            _values_json(child, found)
    return found
