"""Fuzzing the trace loader: random bytes, truncations and edited manifests.

Whatever is on disk, ``traces.open`` and ``Trace.gradient`` either work or raise
``traces.TraceError`` with one line naming a file, never anything else.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces
from traces.format import MANIFEST, iteration_file

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "t"
    traces.synthetic(path, "student_t", numel=48, workers=2, iterations=2, seed=1, layers=[("w", (6, 6)), ("b", (12,))])
    return path


def _load_all(path: Path) -> list[torch.Tensor]:
    t = traces.open(path)
    return [t.gradient(i, w) for i in t.iterations for w in range(t.workers)]


def _check(path: Path) -> str:
    """Load everything; return 'ok' or the error message, failing on any other exception."""
    try:
        grads = _load_all(path)
    except traces.TraceError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message
        return message
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    return "ok"


def _copy(original: Path, scratch: str) -> Path:
    target = Path(scratch) / "t"
    shutil.copytree(original, target)
    return target


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_as_gradient_file(original: Path, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = _copy(original, scratch)
        (path / iteration_file(2)).write_bytes(data)
        assert _check(path) != "ok"


@FUZZ
@given(data=st.data())
def test_every_truncation_is_detected(original: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = _copy(original, scratch)
        f = path / iteration_file(1)
        full = f.read_bytes()
        cut = data.draw(st.integers(0, len(full) - 1))
        f.write_bytes(full[:cut])
        message = _check(path)
        assert message != "ok" and iteration_file(1) in message


@FUZZ
@given(data=st.data())
def test_flipped_bytes_never_crash(original: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = _copy(original, scratch)
        f = path / iteration_file(2)
        content = bytearray(f.read_bytes())
        for _ in range(data.draw(st.integers(1, 8))):
            content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
        f.write_bytes(bytes(content))
        _check(path)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


@FUZZ
@given(data=st.data())
def test_edited_manifests(original: Path, data: st.DataObject) -> None:
    manifest = json.loads((original / MANIFEST).read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from([p for p in _paths(manifest) if p]))
        parent = manifest
        for step in where[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = data.draw(_json)
    with tempfile.TemporaryDirectory() as scratch:
        path = _copy(original, scratch)
        (path / MANIFEST).write_text(json.dumps(manifest))
        _check(path)


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_manifest_bytes(original: Path, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = _copy(original, scratch)
        (path / MANIFEST).write_bytes(data)
        assert _check(path) != "ok"
