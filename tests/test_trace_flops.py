"""Per-layer forward FLOPs counted at capture, stored in the trace, and the projection they allow:
a trace projected onto another device by its FLOPs, or, without them, by the measured ratio."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from costs import devices, throughput
import traces
from pipeline import project as projection
from results.store import Store


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SIDCO_CACHE_DIR", str(tmp_path / "cache"))


BATCH = 2


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> traces.Trace:
    """A real capture of the built-in resnet20 (small width, two workers, two recorded steps)."""
    return traces.capture("resnet20", tmp_path_factory.mktemp("flops") / "t", workers=2, iterations=2, every=1,
                          width=0.25, batch_size=BATCH)


def _layer(trace: traces.Trace, name: str) -> int:
    return [n for n, _ in trace.layers].index(name)


def test_a_captured_linear_layer_carries_its_closed_form_flops(captured):
    fc_w, fc_b = _layer(captured, "fc.weight"), _layer(captured, "fc.bias")
    out_features, in_features = captured.layers[fc_w][1]
    assert captured.flops_batch_size == BATCH
    closed_form = 2 * BATCH * in_features * out_features
    assert captured.forward_flops[fc_w] + captured.forward_flops[fc_b] == pytest.approx(closed_form, rel=1e-12)
    # weight and bias share the module's FLOPs by element count
    assert captured.forward_flops[fc_w] == pytest.approx(closed_form * in_features / (in_features + 1), rel=1e-12)
    # a bias-free 3x3 convolution on the 32x32 input: 2 x batch x out x in x 9 per output pixel
    conv = _layer(captured, "conv1.weight")
    c_out, c_in, kh, kw = captured.layers[conv][1]
    assert captured.forward_flops[conv] == 2 * BATCH * c_out * c_in * kh * kw * 32 * 32
    assert captured.forward_flops[_layer(captured, "bn1.weight")] == 0


def test_the_layers_flops_sum_to_pytorchs_count_of_the_whole_forward(captured):
    work = traces.workloads.build("resnet20", width=0.25, batch_size=BATCH)
    inputs, _ = next(work.batches(0, 2))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        work.model.eval()(inputs)
    assert sum(captured.forward_flops) == pytest.approx(counter.get_total_flops(), rel=1e-12)
    assert captured.manifest["flops"]["forward"] == counter.get_total_flops()
    assert captured.manifest["flops"]["counter"] == "torch.utils.flop_counter.FlopCounterMode"


def test_a_users_loop_counts_flops_once_with_the_recorder(tmp_path: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    with traces.Recorder(model, tmp_path / "t", every=1, batch_size=4) as rec:
        x = torch.randn(4, 8)
        counted = rec.count_flops(x)
        for _ in range(2):
            model.zero_grad()
            model(x).sum().backward()
            rec.capture()
            rec.step()
    trace = traces.open(tmp_path / "t")
    assert trace.forward_flops == list(counted.per_parameter)
    per_module = [2 * 4 * 8 * 16, 2 * 4 * 16 * 3]
    assert trace.forward_flops[0] + trace.forward_flops[1] == pytest.approx(per_module[0], rel=1e-12)
    assert trace.forward_flops[2] + trace.forward_flops[3] == pytest.approx(per_module[1], rel=1e-12)
    assert trace.timings["passes"] == 2, "the counted forward is not timed"


def test_projecting_onto_a_gpu_uses_the_flops(tmp_path, captured):
    h200 = devices.get("h200")
    with Store(tmp_path / "r.sqlite") as store:
        own = projection.trace_source(store, path=captured.path)
        asked = projection.resolve(projection.Request(projection.Cluster(2, 10e9, 1e-5), trace=str(captured.path),
                                                      device="h200"), store)
        source = asked.source
        [result] = projection.project(store, asked)
    assert own.compute == "trace timings (cpu)" and not own.by_flops
    assert source.by_flops and "per-layer FLOPs of the trace" in source.compute
    rule = throughput.compute(h200, "amp", throughput.kind_of([s for _, s in captured.layers], captured.forward_flops))
    assert rule.note in source.compute and result["compute_source"] == source.compute
    assert source.compute_low == rule.low < 1 < rule.high == source.compute_high
    flops = rule.flops_per_s
    measured, projected = projection.workload(own), projection.workload(source)
    ratio = devices.compute_ratio(devices.get("cpu"), h200)
    for index, layer_flops in enumerate(captured.forward_flops):
        if layer_flops > 0:
            assert projected.layers[index].backward_s == pytest.approx(2 * layer_flops / flops, rel=1e-12)
        else:
            assert projected.layers[index].backward_s == pytest.approx(measured.layers[index].backward_s * ratio)
        assert projected.layers[index].shape == measured.layers[index].shape
    assert projected.forward_s == pytest.approx(sum(captured.forward_flops) / flops, rel=1e-12)
    assert projected.optimizer_s == pytest.approx(20 * captured.numel / h200.memory_bandwidth_Bps, rel=1e-12)
    assert projected.nbytes == measured.nbytes


def _strip_flops(src: traces.Trace, dst: Path) -> Path:
    """A copy of ``src`` whose manifest is in the format written before FLOPs were counted."""
    dst.mkdir()
    for name in src.manifest["files"].values():
        (dst / name).write_bytes((src.path / name).read_bytes())
    manifest = dict(src.manifest)
    manifest.pop("flops")
    manifest["layers"] = [{k: v for k, v in entry.items() if k != "forward_flops"} for entry in manifest["layers"]]
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_an_old_trace_without_flops_loads_and_projects_by_the_ratio(tmp_path, captured):
    old = traces.open(_strip_flops(captured, tmp_path / "old"))
    assert old.forward_flops is None and old.flops_batch_size is None
    assert old.timings == captured.timings
    with Store(tmp_path / "r.sqlite") as store:
        own = projection.trace_source(store, path=old.path)
        source = projection.trace_source(store, path=old.path, device="h200")
    ratio = devices.compute_ratio(devices.get("cpu"), devices.get("h200"))
    assert not source.by_flops and source.compute_scale == pytest.approx(ratio)
    assert "FLOPs" not in source.compute and "h200's bf16 peak" in source.compute
    base, projected = projection.workload(own), projection.workload(source)
    assert projected.backward_s == pytest.approx(base.backward_s * ratio)
    assert projected.optimizer_s == pytest.approx(base.optimizer_s * ratio)


@pytest.mark.parametrize("change, message", [
    (lambda m: m["layers"][0].pop("forward_flops"), "every layer or for none"),
    (lambda m: m["layers"][1].update(forward_flops=-1), "numbers of FLOPs >= 0"),
    (lambda m: m["layers"][1].update(forward_flops=math.inf), "numbers of FLOPs >= 0"),
    (lambda m: m.pop("flops"), "'flops' must be an object"),
    (lambda m: m["flops"].update(batch_size=0), "batch_size must be an integer >= 1"),
])
def test_malformed_flops_are_refused_in_one_line(tmp_path, captured, change, message):
    manifest = json.loads(json.dumps(captured.manifest))
    change(manifest)
    copy = _strip_flops(captured, tmp_path / "bad")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(traces.TraceError, match=message):
        traces.open(copy)
