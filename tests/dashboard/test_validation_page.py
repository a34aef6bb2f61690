"""The validation page: network share and fidelity in the table, filters on both."""

from __future__ import annotations

import json

from dashboard.pages import validation

ROWS = [
    {"workload": "resnet20", "compressor": "none", "density": None, "workers": 2, "bandwidth_bps": 2e7,
     "measured_s": 0.66, "projected_s": 0.62, "error_pct": -6.1, "calibrated": 0, "fidelity": "analytic",
     "network_share": 0.70},
    {"workload": "resnet20", "compressor": "topk", "density": 0.1, "workers": 2, "bandwidth_bps": 2e7,
     "measured_s": 0.31, "projected_s": 0.30, "error_pct": -3.2, "calibrated": 1, "fidelity": "des",
     "network_share": 0.29},
    {"workload": "resnet20", "compressor": "topk", "density": 0.01, "workers": 2, "bandwidth_bps": 1e8,
     "measured_s": 0.21, "projected_s": 0.20, "error_pct": -4.8, "calibrated": 0, "fidelity": None,
     "network_share": None},
]


def test_filters_by_fidelity_share_and_calibration():
    assert validation.filter_rows(ROWS) == ROWS
    assert validation.filter_rows(ROWS, fidelity="des") == [ROWS[1]]
    assert validation.filter_rows(ROWS, fidelity="analytic") == [ROWS[0], ROWS[2]]  # old rows were analytic
    assert validation.filter_rows(ROWS, min_share=0.3) == [ROWS[0]]
    assert validation.filter_rows(ROWS, min_share=0.1) == ROWS[:2]
    assert validation.filter_rows(ROWS, calibrated_only=True) == [ROWS[1]]
    assert validation.filter_rows(ROWS, fidelity="analytic", min_share=0.5, calibrated_only=True) == []


def test_table_shows_network_share_and_fidelity():
    table = validation.table_rows(ROWS)
    assert [t["network_pct"] for t in table] == [70.0, 29.0, ""]
    assert [t["fidelity"] for t in table] == ["analytic", "des", "analytic"]
    ids = {c["id"] for c in validation.COLUMNS}
    assert {"network_pct", "fidelity", "calibrated", "error_pct"} <= ids


def test_page_callback_filters(tmp_path):
    from dashboard.app import create_app
    from results.store import Store

    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        with store.transaction() as cur:
            cur.execute("INSERT INTO emulations(created, kind, config_json, cores, status) VALUES(0, 'train', '{}', 2, 'done')")
        store.add_validation([{**r, "emulation_id": 1, "detail_json": "{}"} for r in ROWS])
    app = create_app(path, cache_dir=tmp_path / "cache")
    client = app.server.test_client()
    page = client.post("/_dash-update-component", json={
        "output": "..page.children...nav.children..",
        "outputs": [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"}],
        "inputs": [{"id": "url", "property": "pathname", "value": validation.PATH}],
        "changedPropIds": ["url.pathname"], "state": [{"id": "url", "property": "search", "value": ""}]})
    text = json.dumps(page.get_json())
    assert "validation-fidelity" in text and "validation-share" in text and "network share" in text
    graph = {"fig": "validation-scatter", "type": "graph"}
    response = client.post("/_dash-update-component", json={
        "output": f"..{json.dumps(graph, separators=(',', ':'))}.figure...validation-table.data..",
        "outputs": [{"id": graph, "property": "figure"},
                    {"id": "validation-table", "property": "data"}],
        "inputs": [{"id": "validation-calibrated", "property": "value", "value": []},
                   {"id": "validation-fidelity", "property": "value", "value": "analytic"},
                   {"id": "validation-share", "property": "value", "value": 0.3}],
        "changedPropIds": ["validation-share.value"], "state": []})
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    body = response.get_json()["response"]
    data = body["validation-table"]["data"]
    assert [(r["compressor"], r["fidelity"], r["network_pct"]) for r in data] == [("none", "analytic", 70.0)]
