"""The dashboard's latency fields say they are one-way and take a round trip the way the CLI's
``--rtt`` does (``rtt 100us``: one-way = half), through the one home of that rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from dashboard import projection, sweep_runner
from dashboard.data import StoreReader
from dashboard.pages import sweeps, whatif
from pipeline.request import one_way_latencies


@given(st.floats(min_value=1e-9, max_value=10.0, allow_nan=False))
def test_a_page_latency_is_one_way_and_rtt_is_the_clis_round_trip(seconds):
    text = f"{seconds!r}s"
    assert projection.parse_latency(text) == one_way_latencies(text, None)[0] == pytest.approx(seconds)
    for written in (f"rtt {text}", f"{text} RTT", f"  Rtt   {text} "):
        assert projection.parse_latency(written) == one_way_latencies(None, text)[0] == pytest.approx(seconds / 2)


@pytest.mark.parametrize("text, message", [("", "give a latency"), ("rtt", "give a latency"),
                                           ("50", "invalid duration"), ("rtt rtt 1ms", "one duration"),
                                           ("1ms,2ms", "one duration")])
def test_a_bad_page_latency_is_one_line_naming_it(text, message):
    with pytest.raises(ValueError, match=message):
        projection.parse_latency(text)


def test_the_whatif_and_sweep_launch_take_a_round_trip():
    chosen = projection.parse_controls("layout:resnet50", ["topk"], "0.01", "8", "10Gbit", "rtt 100us", "ring")
    assert chosen.cluster.latency_s == pytest.approx(50e-6)
    spec = sweep_runner.parse_spec("layout:resnet50", ["topk"], "0.01", "2", "10Gbit", "100us rtt", "ring")
    assert spec.grid.latencies_s == pytest.approx((50e-6,))


def test_the_latency_labels_say_one_way(tmp_path):
    def shown(component) -> str:
        return json.dumps(component, default=lambda c: c.to_plotly_json())

    assert "Latency per message, one-way" in shown(whatif.controls("whatif", [], True))
    page = shown(sweeps.layout(StoreReader(tmp_path / "s.sqlite")))
    assert "Latency, one-way" in page and "Latency per message, one-way" in page
    for text in (shown(whatif.controls("whatif", [], True)), page):
        assert projection.LATENCY_HINT in text and "rtt 100us" in projection.LATENCY_HINT
