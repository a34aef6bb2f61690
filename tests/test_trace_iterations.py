"""A manifest cannot list more iterations than the trace's files hold: every recorded iteration has
its own file, checked when the trace is opened (before any replay starts), in one line."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces
from traces.format import MANIFEST


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("iters") / "t"
    traces.synthetic(path, "laplace", numel=32, workers=1, iterations=3, seed=0)
    return path


def _edited(original: Path, tmp: Path, iterations: list[int], names: list[str]) -> Path:
    path = tmp / "t"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(original, path)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["iterations"] = iterations
    manifest["files"] = {str(i): name for i, name in zip(iterations, names)}
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def test_a_million_iterations_on_three_files_are_refused_at_once(original, tmp_path):
    files = sorted(json.loads((original / MANIFEST).read_text())["files"].values())
    n = 10**6
    path = _edited(original, tmp_path, list(range(n)), [files[i % len(files)] for i in range(n)])
    start = time.monotonic()
    with pytest.raises(traces.TraceError, match="lists 1000000 iterations but the trace directory holds 3"):
        traces.open(path)
    assert time.monotonic() - start < 5


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=6))
def test_iterations_open_only_when_each_has_its_own_file(original, tmp_path, picks):
    files = sorted(json.loads((original / MANIFEST).read_text())["files"].values())
    names = [files[p] for p in picks]
    path = _edited(original, tmp_path, list(range(len(picks))), names)
    try:
        trace = traces.open(path)
    except traces.TraceError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        assert len(set(names)) < len(names) or len(names) > len(files)
    else:
        assert len(set(names)) == len(names) and len(trace.iterations) == len(picks)
