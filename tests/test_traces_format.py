"""The trace format: writing, lazy opening, synthetic traces and every kind of bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from scipy import stats

import traces
from traces.format import MANIFEST, TraceWriter, iteration_file
from traces.synthetic import sample


@pytest.fixture
def small(tmp_path: Path) -> traces.Trace:
    """A 2-worker, 3-iteration synthetic trace split into three layers."""
    return traces.synthetic(
        tmp_path / "small", "laplace", numel=60, workers=2, iterations=3, seed=5,
        layers=[("a.weight", (4, 5)), ("a.bias", (4,)), ("b.weight", (6, 6))],
    )


def _manifest(trace_dir: Path) -> dict:
    return json.loads((trace_dir / MANIFEST).read_text())


def _edit_manifest(trace_dir: Path, **changes) -> None:
    data = _manifest(trace_dir)
    data.update(changes)
    (trace_dir / MANIFEST).write_text(json.dumps(data))


def test_synthetic_round_trip(small: traces.Trace) -> None:
    t = traces.open(small.path)
    assert t.workers == 2
    assert t.iterations == [1, 2, 3]
    assert t.layers == [("a.weight", (4, 5)), ("a.bias", (4,)), ("b.weight", (6, 6))]
    assert [e["offset"] for e in t.manifest["layers"]] == [0, 20, 24]
    g = t.gradient(2, 1)
    assert g.dtype == torch.float32 and g.shape == (60,)
    assert torch.equal(g, sample("laplace", 60, 5, 2, 1))
    assert not torch.equal(t.gradient(2, 0), g), "workers draw different gradients"
    assert not torch.equal(t.gradient(1, 1), g), "iterations draw different gradients"
    assert set(t.timings) >= {"forward_s", "backward_s", "optimizer_s", "batch_size", "device"}
    assert len(t.timings["backward_s"]) == 3
    assert os.fspath(t) == str(small.path)


def test_synthetic_is_reproducible(tmp_path: Path) -> None:
    a = traces.synthetic(tmp_path / "a", "gamma", numel=1000, workers=1, iterations=1, seed=3)
    b = traces.synthetic(tmp_path / "b", "gamma", numel=1000, workers=1, iterations=1, seed=3)
    c = traces.synthetic(tmp_path / "c", "gamma", numel=1000, workers=1, iterations=1, seed=4)
    assert torch.equal(a.gradient(1, 0), b.gradient(1, 0))
    assert not torch.equal(a.gradient(1, 0), c.gradient(1, 0))
    assert a.manifest["trace_id"] != b.manifest["trace_id"]


def _mixture_cdf(x):
    return 0.7 * stats.norm.cdf(x, scale=1e-4) + 0.3 * stats.norm.cdf(x, scale=1e-2)


@pytest.mark.parametrize(
    ("kind", "params", "cdf", "of_magnitude"),
    [
        ("laplace", {"scale": 2e-3}, stats.expon(scale=2e-3).cdf, True),
        ("gamma", {"shape": 0.4, "scale": 1e-3}, stats.gamma(0.4, scale=1e-3).cdf, True),
        ("gpareto", {"xi": 0.3, "scale": 1e-3}, stats.genpareto(0.3, scale=1e-3).cdf, True),
        ("student_t", {"df": 4.0, "scale": 1e-3}, stats.t(4.0, scale=1e-3).cdf, False),
        ("gaussian_mixture", {"weights": [0.7, 0.3], "sigmas": [1e-4, 1e-2]}, _mixture_cdf, False),
    ],
)
def test_synthetic_follows_its_law(tmp_path: Path, kind: str, params: dict, cdf, of_magnitude: bool) -> None:
    t = traces.synthetic(tmp_path / kind, kind, numel=40_000, workers=1, iterations=1, seed=11, **params)
    g = t.gradient(1, 0).double().numpy()
    assert t.manifest["synthetic"]["kind"] == kind and t.manifest["synthetic"]["seed"] == 11
    assert t.manifest["synthetic"]["params"] == params
    assert stats.kstest(np.abs(g) if of_magnitude else g, cdf).pvalue > 1e-3
    assert 0.47 < (g > 0).mean() < 0.53, "signs are symmetric"
    wrong = stats.kstest(np.abs(g) if of_magnitude else g, lambda x: cdf(x / 1.3))
    assert wrong.pvalue < 1e-6, "the test can tell a 30 % wrong scale"


def test_synthetic_rejects_bad_parameters(tmp_path: Path) -> None:
    with pytest.raises(traces.TraceError, match="unknown synthetic kind"):
        traces.synthetic(tmp_path / "x", "cauchy", numel=10)
    with pytest.raises(traces.TraceError, match="unknown parameter"):
        traces.synthetic(tmp_path / "x", "laplace", numel=10, shape=2.0)
    with pytest.raises(traces.TraceError, match="scale"):
        traces.synthetic(tmp_path / "x", "laplace", numel=10, scale=-1.0)
    with pytest.raises(traces.TraceError, match="xi"):
        traces.synthetic(tmp_path / "x", "gpareto", numel=10, xi=1.5)
    assert not (tmp_path / "x").exists()


def test_writer_leaves_nothing_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "t"
    with pytest.raises(RuntimeError):
        with TraceWriter(out, workload="w", layers=[("p", (3,), "float32")], workers=1) as writer:
            writer.write_iteration(1, [torch.ones(3)])
            raise RuntimeError("crash mid-capture")
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_nan_and_wrong_sizes(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t", workload="w", layers=[("p", (3,), "float32")], workers=1) as writer:
        with pytest.raises(traces.TraceError, match="not finite"):
            writer.write_iteration(1, [torch.tensor([1.0, float("nan"), 0.0])])
        with pytest.raises(traces.TraceError, match="4 elements"):
            writer.write_iteration(1, [torch.ones(4)])
    assert list(tmp_path.iterdir()) == []


def test_overwrite_only_with_permission(tmp_path: Path, small: traces.Trace) -> None:
    with pytest.raises(traces.TraceError, match="already exists"):
        traces.synthetic(small.path, "laplace", numel=10)
    t = traces.synthetic(small.path, "laplace", numel=10, overwrite=True)
    assert t.numel == 10 and len(list(small.path.iterdir())) == 2
    other = tmp_path / "notatrace"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(traces.TraceError, match="not a trace directory"):
        traces.synthetic(other, "laplace", numel=10, overwrite=True)
    assert (other / "keep.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary directory left behind"


def _expect(path: Path, pattern: str, *, on_gradient: bool = False) -> None:
    if on_gradient:
        t = traces.open(path)
        with pytest.raises(traces.TraceError, match=pattern) as info:
            for it in t.iterations:
                for w in range(t.workers):
                    t.gradient(it, w)
    else:
        with pytest.raises(traces.TraceError, match=pattern) as info:
            traces.open(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message, "the message names the file"


def test_missing_file(small: traces.Trace) -> None:
    (small.path / iteration_file(2)).unlink()  # caught when the trace opens: fewer files than iterations
    _expect(small.path, "manifest lists 3 iterations but the trace directory holds 2 gradient files")


def test_truncated_file(small: traces.Trace) -> None:
    f = small.path / iteration_file(3)
    f.write_bytes(f.read_bytes()[:-7])
    _expect(small.path, "truncated")


def test_corrupt_header(small: traces.Trace) -> None:
    f = small.path / iteration_file(1)
    data = bytearray(f.read_bytes())
    data[10:20] = b"\xff" * 10
    f.write_bytes(bytes(data))
    _expect(small.path, "corrupt safetensors header")


def test_unknown_schema_version(small: traces.Trace) -> None:
    _edit_manifest(small.path, schema_version=99)
    _expect(small.path, "unknown schema version 99")


def test_shape_mismatch(small: traces.Trace) -> None:
    data = _manifest(small.path)
    data["layers"][2]["shape"] = [6, 7]
    data["layers"][2]["numel"] = 42
    data["numel"] = 66
    (small.path / MANIFEST).write_text(json.dumps(data))
    _expect(small.path, r"shape \[60\], manifest layers sum to \[66\]")


@pytest.mark.parametrize("name, said", [
    ("x" * 10_000_000, r"layer 1 name 'x{40}'… is 10,000,000 characters long, over the limit of 1,024"),
    ("a.weight", r"layer 1 name 'a.weight' repeats an earlier layer's"),
    ("", r"layer 1 has no name"),
    (7, r"layer 1 has no name")])
def test_a_ten_megabyte_or_repeated_layer_name_is_refused_in_one_short_line(small: traces.Trace, name, said) -> None:
    data = _manifest(small.path)
    data["layers"][1]["name"] = name
    (small.path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(traces.TraceError, match=said) as info:
        traces.open(small.path)
    assert len(str(info.value)) < 300 + len(str(small.path)) and str(small.path) in str(info.value)


def test_the_writer_refuses_a_repeated_or_overlong_layer_name(tmp_path: Path) -> None:
    for layers, said in (([("w", (2,)), ("w", (3,))], "layer 1 name 'w' repeats"),
                         ([("w" * 2000, (2,))], "layer 0 name 'w{40}'… is 2,000 characters long")):
        with pytest.raises(ValueError, match=said):
            traces.synthetic(tmp_path / "t", "laplace", numel=sum(math.prod(s) for _, s in layers), layers=layers)
        assert not (tmp_path / "t").exists()


def test_inconsistent_layer_offsets(small: traces.Trace) -> None:
    data = _manifest(small.path)
    data["layers"][1]["offset"] = 3
    (small.path / MANIFEST).write_text(json.dumps(data))
    _expect(small.path, "do not match its shape")


def test_nan_in_stored_gradient(small: traces.Trace) -> None:
    bad = torch.zeros(60)
    bad[7] = float("nan")
    save_file({"worker_0": torch.zeros(60), "worker_1": bad}, str(small.path / iteration_file(2)))
    _expect(small.path, "NaN or Inf", on_gradient=True)


def test_not_a_trace(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    _expect(tmp_path / "d", "not a trace directory")
    _expect(tmp_path / "nothing", "no such trace directory")
    (tmp_path / "f").write_text("hello")
    _expect(tmp_path / "f", "not a trace directory")
    (tmp_path / "d" / MANIFEST).write_text("{not json")
    _expect(tmp_path / "d", "corrupt manifest")
    (tmp_path / "d" / MANIFEST).write_text(json.dumps({"format": "other"}))
    _expect(tmp_path / "d", "not a sidco-trace manifest")


def test_workers_mismatch(small: traces.Trace) -> None:
    _edit_manifest(small.path, workers=3)
    _expect(small.path, "manifest says 3 workers")


def test_huge_header_length_is_refused(small: traces.Trace) -> None:
    f = small.path / iteration_file(1)
    data = f.read_bytes()
    f.write_bytes(struct.pack("<Q", 2**60) + data[8:])
    _expect(small.path, "header length beyond end of file")


def test_unrecorded_iteration_and_worker(small: traces.Trace) -> None:
    with pytest.raises(traces.TraceError, match="iteration 7 was not recorded"):
        small.gradient(7, 0)
    with pytest.raises(traces.TraceError, match="worker 2 out of range"):
        small.gradient(1, 2)


def test_open_is_lazy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = traces.synthetic(tmp_path / "t", "laplace", numel=250_000, workers=4, iterations=4, seed=0)
    read_sizes: list[int] = []
    real_open = Path.open

    def spy(self, *args, **kwargs):
        handle = real_open(self, *args, **kwargs)
        real_read = handle.read

        def read(n=-1):
            data = real_read(n)
            read_sizes.append(len(data))
            return data

        handle.read = read
        return handle

    monkeypatch.setattr(Path, "open", spy)
    traces.open(t.path)
    assert sum(read_sizes) < 4 * 1000, "opening reads only the headers, never the 16 MB of gradients"


def test_cli_reports_bad_trace_in_one_line(tmp_path: Path, small: traces.Trace, capsys) -> None:
    from sidco.cli import main

    (small.path / iteration_file(2)).write_bytes(b"garbage")
    assert main(["replay", str(small.path), "--store", str(tmp_path / "r.sqlite")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and iteration_file(2) in lines[0] and "truncated" in lines[0]


def test_trace_copy_is_still_valid(tmp_path: Path, small: traces.Trace) -> None:
    shutil.copytree(small.path, tmp_path / "copy")
    t = traces.open(tmp_path / "copy")
    assert torch.equal(t.gradient(3, 1), small.gradient(3, 1))
    assert math.isclose(float(t.gradient(3, 1).abs().sum()), float(small.gradient(3, 1).abs().sum()))


_shapes = st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(
    shapes=_shapes.filter(lambda s: sum(math.prod(x) for x in s) > 0),
    workers=st.integers(1, 3),
    iterations=st.lists(st.integers(0, 10**6), min_size=1, max_size=3, unique=True),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_write_read_round_trip(shapes, workers, iterations, dtype, seed) -> None:
    """Any layer shapes, worker count, iteration numbers and gradient dtype survive a round trip."""
    numel = sum(math.prod(s) for s in shapes)
    gen = torch.Generator().manual_seed(seed)
    iterations = sorted(iterations)
    written = {(i, w): (torch.randn(numel, generator=gen) * 10).to(dtype) for i in iterations for w in range(workers)}
    with tempfile.TemporaryDirectory() as tmp:
        with TraceWriter(
            Path(tmp) / "t", workload="prop", layers=[(f"p{i}", s, str(dtype)) for i, s in enumerate(shapes)], workers=workers
        ) as writer:
            for i in iterations:
                writer.write_iteration(i, [written[(i, w)] for w in range(workers)])
            writer.close(timings={"forward_s": 0.0, "backward_s": [0.0] * len(shapes), "optimizer_s": 0.0,
                                  "batch_size": 1, "device": "cpu"})
        t = traces.open(Path(tmp) / "t")
        assert t.iterations == iterations and t.workers == workers and t.numel == numel
        assert t.layers == [(f"p{i}", tuple(s)) for i, s in enumerate(shapes)]
        offsets = [e["offset"] for e in t.manifest["layers"]]
        assert offsets == [sum(math.prod(s) for s in shapes[:i]) for i in range(len(shapes))]
        for (i, w), grad in written.items():
            assert torch.equal(t.gradient(i, w), grad.float())
