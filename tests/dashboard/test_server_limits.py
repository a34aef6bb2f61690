"""The dashboard server's limits (dashboard.limits): a multi-megabyte input is refused in one short
line, never echoed into the page or its log; the front page stays fast while 200 What-if
projections are asked for at once (a real threaded server on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.serving import make_server

from dashboard import create_app, limits

BIG = "9" * (3 * 2**20)  # a 3 MiB "bandwidth"
CONTROLS = {"whatif-source": "layout:resnet50", "whatif-compressors": ["none", "topk"], "whatif-density": "0.01",
            "whatif-nodes": "8", "whatif-bandwidth": "10Gbit", "whatif-latency": "50us", "whatif-topology": "ring",
            "whatif-calibrated": [], "whatif-device": "", "whatif-costs": "", "whatif-samples-per-s": "",
            "whatif-step-profile": "",
            "whatif-tokens": "", "whatif-sites": "1", "whatif-wan-bandwidth": "", "whatif-wan-rtt": "",
            "whatif-gpus-per-node": "", "whatif-batch-size": "", "whatif-parallel": "ddp",
            "whatif-shard-size": "", "whatif-micro-batch": "", "whatif-reduce-dtype": "fp32",
            "whatif-param-dtype": "bf16", "whatif-checkpointing": [], "whatif-des": None}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The dashboard over an empty store (the What-if page projects the shipped layouts without one)."""
    root = tmp_path_factory.mktemp("limits")
    return create_app(root / "results.sqlite", cache_dir=root / "cache")


def _whatif_body(app, **values) -> dict:
    """The request a page sends for the What-if projection, with ``values`` (control id: value) changed."""
    [(key, spec)] = [(k, v) for k, v in app.callback_map.items() if "whatif-breakdown" in k]
    chosen = {**CONTROLS, **values}
    outputs = [{"id": json.loads(o) if o.startswith("{") else o, "property": p}
               for o, p in (part.rsplit(".", 1) for part in key.strip(".").split("..."))]
    return {"output": key, "outputs": outputs, "changedPropIds": ["whatif-nodes.value"], "state": [],
            "inputs": [{**i, "value": chosen[i["id"]]} for i in spec["inputs"]]}


def test_a_what_if_request_is_answered(app):
    response = app.server.test_client().post(limits.CALLBACK_PATH, json=_whatif_body(app))
    assert response.status_code == 200
    assert "8 nodes" in response.get_data(as_text=True)


def test_a_multi_megabyte_input_is_refused_in_one_line_and_never_echoed(app, caplog):
    client = app.server.test_client()
    with caplog.at_level(logging.INFO):
        for response in (client.post(limits.CALLBACK_PATH, json=_whatif_body(app, **{"whatif-bandwidth": BIG})),
                         client.post(limits.CALLBACK_PATH, json=_whatif_body(app, **{"whatif-compressors": [BIG]})),
                         client.get("/?bandwidth=" + BIG[:100_000]),
                         client.post(limits.CALLBACK_PATH, data=b"{" + BIG.encode() * 6 + b"}",
                                     content_type="application/json")):
            text = response.get_data(as_text=True)
            assert response.status_code == 413 and text.count("\n") == 1 and len(text) < 200, text[:300]
            assert "9" * 100 not in text
    assert all(len(r.getMessage()) < 2 * limits.LOG_MAX_CHARS for r in caplog.records)


def test_text_up_to_the_limit_passes_and_figures_are_not_counted(app):
    client = app.server.test_client()
    response = client.post(limits.CALLBACK_PATH,
                           json=_whatif_body(app, **{"whatif-bandwidth": "1" * limits.INPUT_MAX_CHARS}))
    assert response.status_code == 200 and "invalid bandwidth" in response.get_data(as_text=True)
    assert limits.oversized({"state": [{"id": {"fig": "x", "type": "graph"}, "property": "figure",
                                        "value": {"data": [{"text": BIG}]}}]}) is None


@settings(max_examples=40, deadline=None)
@given(st.recursive(st.text(max_size=3) | st.integers() | st.none(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=8),
       st.booleans())
def test_any_value_holding_a_long_text_is_refused_wherever_it_hides(value, nested):
    """Short values pass; the same value with a text one character over the limit inside it is refused."""
    entry = {"id": "whatif-nodes", "property": "value", "value": value}
    assert limits.oversized({"inputs": [[entry]] if nested else [entry]}) is None
    hidden = {"id": "whatif-nodes", "property": "value", "value": [value, {"k": "x" * (limits.INPUT_MAX_CHARS + 1)}]}
    assert limits.oversized({"state": [[hidden]] if nested else [hidden]}) == 'value of "whatif-nodes"'


def test_a_long_log_line_is_cut():
    record = logging.LogRecord("werkzeug", logging.INFO, __file__, 1, "%s - - %s", ("127.0.0.1", "GET /?" + BIG), None)
    limits._ShortLines().filter(record)
    assert len(record.getMessage()) < limits.LOG_MAX_CHARS + 40 and record.getMessage().endswith("characters)")


def test_front_page_stays_under_a_second_while_200_what_if_requests_run(app):
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"

    def ask(i):  # 200 different clusters: each projection is computed, none is a repeat
        body = json.dumps(_whatif_body(app, **{"whatif-nodes": str(2 + i)})).encode()
        request = urllib.request.Request(base + limits.CALLBACK_PATH, data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status

    try:
        with ThreadPoolExecutor(200) as pool:
            answers = [pool.submit(ask, i) for i in range(200)]
            time.sleep(0.5)  # the requests are in: every worker slot busy, the rest waiting
            front = []
            for _ in range(5):
                started = time.perf_counter()
                with urllib.request.urlopen(base + "/", timeout=30) as response:
                    assert response.status == 200 and b"SIDCo testbed" in response.read()
                front.append(time.perf_counter() - started)
                time.sleep(0.1)
            busy = sum(not a.done() for a in answers)
            statuses = [a.result() for a in answers]
    finally:
        server.shutdown()
    assert busy > 0, "the What-if requests had all finished: the front page was not timed under load"
    assert statuses == [200] * 200
    assert max(front) < 1.0, front
