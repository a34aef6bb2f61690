"""The Time-to-accuracy page on a DiLoCo run (it has no trace): the callback answers with the rows
``sidco tta`` ranks (pipeline.tta.time_to_accuracy on the synchronous run's trace), the DiLoCo
variant among them, instead of an error."""

from __future__ import annotations

import pytest
from diloco_family import train
from test_ids_and_filters import call, inline_errors

from dashboard.app import create_app
from dashboard.pages.tta import table_rows
from pipeline.request import Cluster, sites_options
from pipeline.tta import convergence_run, projection_of, time_to_accuracy
from results.store import Store

PAGE = {"tta-nodes": "4", "tta-bandwidth": "10Gbit", "tta-latency": "50us", "tta-topology": "ring",
        "tta-sites": "2", "tta-wan-bandwidth": "100Mbit", "tta-wan-rtt": "20ms", "tta-metric": "eval_loss"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A store holding a synchronous run and a DiLoCo run (H = 4) of its configuration, one seed
    each, the app over it and its test client."""
    root = tmp_path_factory.mktemp("tta-diloco-page")
    ids = train(str(root / "r.sqlite"), [("--sync-every", "4", "--eval-every", "4")], seeds=1)
    with Store(root / "r.sqlite") as store:
        losses = [r["eval_loss"] for r in store.convergence_rows(ids["sync"][0]) if r["eval_loss"] is not None]
    app = create_app(root / "r.sqlite", cache_dir=root / "cache")
    return {"app": app, "client": app.server.test_client(), "path": root / "r.sqlite", "ids": ids,
            "target": losses[-1]}


@pytest.mark.timeout(300)
def test_the_page_ranks_a_diloco_run_as_sidco_tta_does(served):
    diloco = served["ids"]["--sync-every 4 --eval-every 4"][0]
    values = {**PAGE, "tta-run": diloco, "tta-target": repr(served["target"])}
    status, body = call(served, "tta-table", values)
    assert status == 200 and inline_errors(body) == []
    shown = body["tta-table"]["data"]
    with Store(served["path"]) as store:
        run = convergence_run(store, diloco)
        cluster = Cluster(4, 10e9, 50e-6, "ring", options=sites_options(2, 100e6, 20e-3))
        expected = time_to_accuracy(store, projection_of(store, run, cluster), run, target_loss=served["target"])
    assert shown == table_rows(expected["rows"])
    labels = [r["label"] for r in shown]
    assert sorted(labels) == ["diloco H=4", "none"]
    row = shown[labels.index("diloco H=4")]
    assert row["sync_every"] == 4 and row["outer"] == "none" and row["utilization"] != ""
    assert row["time_to_target_s"] != "" and row["iteration_ms"] != ""
    figure = body['{"fig":"tta-time","type":"graph"}']["figure"]
    assert "diloco H=4" in {trace["name"] for trace in figure["data"]}
    message = str(body["tta-message"]["children"])
    assert f"synchronous run #{served['ids']['sync'][0]}" in message and "2 sites over a 100 Mbit/s WAN" in message


def test_one_site_leaves_the_diloco_row_untimed_with_the_reason(served):
    diloco = served["ids"]["--sync-every 4 --eval-every 4"][0]
    values = {**PAGE, "tta-sites": "1", "tta-wan-bandwidth": "", "tta-wan-rtt": "", "tta-run": diloco,
              "tta-target": repr(served["target"])}
    status, body = call(served, "tta-table", values)
    assert status == 200 and inline_errors(body) == []
    (row,) = [r for r in body["tta-table"]["data"] if r["label"] == "diloco H=4"]
    assert row["iteration_ms"] == "" and row["time_to_target_s"] == ""
    assert row["reason"].startswith("no projected time per inner step: DiLoCo syncs across sites")


@pytest.mark.parametrize("sites, wan, message", [
    ("2", "", "--sites 2 needs --wan-bandwidth and --wan-rtt"),
    ("two", "100Mbit", "invalid sites 'two'"),
])
def test_bad_sites_are_an_inline_error(served, sites, wan, message):
    values = {**PAGE, "tta-sites": sites, "tta-wan-bandwidth": wan, "tta-wan-rtt": "",
              "tta-run": served["ids"]["sync"][0], "tta-target": "7"}
    status, body = call(served, "tta-table", values)
    assert status == 200 and [e for e in inline_errors(body) if message in e]
