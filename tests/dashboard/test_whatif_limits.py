"""The What-if request's compressor list: each compressor at most once, so a request holds no more
entries than there are compressors; a 10,000-entry request is refused at once, in one line."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
from dashboard import projection

CONTROLS = {"source": "layout:resnet50", "density": "0.01", "nodes": "8", "bandwidth": "10Gbit",
            "latency": "50us", "topology": "ring"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(compressors.names()), min_size=1, max_size=30))
def test_a_compressor_list_parses_only_without_repeats(names):
    try:
        controls = projection.parse_controls(compressors=names, **CONTROLS)
    except projection.ProjectionError as exc:
        assert len(set(names)) < len(names) and "chosen twice" in str(exc) and "\n" not in str(exc)
    else:
        assert list(controls.compressors) == names and len(names) <= len(compressors.names())


@pytest.mark.parametrize("names", [["topk"] * 10_000, [f"c{i}" for i in range(10_000)],
                                   compressors.names() * 2000])
def test_ten_thousand_entries_are_refused_at_once(names):
    start = time.monotonic()
    with pytest.raises(projection.ProjectionError) as info:
        projection.parse_controls(compressors=names, **CONTROLS)
    assert time.monotonic() - start < 0.5 and "\n" not in str(info.value)
