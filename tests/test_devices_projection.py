"""Projections on a device: the cost policy's order, GPU layouts with GPU costs, trace projection,
and numbers that do not depend on how busy the machine computing them is."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from costs import costmodel, devices
import traces
from machine import host_identity
from pipeline.costs import compression_profile
from pipeline import project as projection
from results.store import Store
from sidco.cli import main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SIDCO_CACHE_DIR", str(tmp_path / "cache"))


def _replay_rows(compressor, density, per_element_s, numel=10_000):
    k = max(1, round(density * numel))
    return [{"compressor": compressor, "density": density, "error_feedback": 1, "iteration": 0, "worker": w,
             "bucket": 0, "numel": numel, "selected": k, "achieved_density": k / numel,
             "achieved_over_target": k / numel / density, "threshold": None, "stages": None,
             "compress_s": per_element_s * numel, "decompress_s": 1e-6, "wire_bytes": 8 * k, "rel_error": 0.5}
            for w in range(2)]


def test_policy_takes_replays_then_measured_profiles_then_the_model(tmp_path):
    with Store(tmp_path / "r.sqlite") as store:
        trace_id = store.register_trace(tmp_path / "t", {"workload": "w", "workers": 2, "iterations": [0]})
        replay_id, _ = store.get_or_create("replays", {"t": 1}, trace_id=trace_id, device="cpu")
        store.add_replay_rows(replay_id, _replay_rows("topk", 0.01, 3e-9))
        profile = [{"compressor": c, "density": 0.01, "numel": n, "compress_s": 5e-9 * n, "decompress_s": 1e-10 * n}
                   for c in ("topk", "dgc") for n in (1 << 20, 1 << 22)]
        store.add_device_profile("cpu", {}, "measured", profile)
        pairs = [("topk", 0.01), ("dgc", 0.01), ("sidco-e", 0.01)]
        costs = compression_profile(store, trace_id=trace_id, device=devices.get("cpu"), pairs=pairs)
        assert costs.cost("topk", 0.01).source.startswith(f"replay #{replay_id} cpu ")
        assert costs.cost("topk", 0.01).compress_per_element_s == pytest.approx(3e-9)
        assert costs.cost("dgc", 0.01).source.startswith("measured cpu ")
        assert costs.cost("dgc", 0.01).compress_per_element_s == pytest.approx(5e-9)
        model = costs.cost("sidco-e", 0.01)
        assert model.source == "model cpu (defaults)"
        assert model == costmodel.cost("sidco-e", 0.01, devices.get("cpu"))


def test_shipped_profiles_come_after_stored_ones_and_before_the_model(tmp_path, monkeypatch):
    from costs import device_profile
    import profiles

    rows = [{"compressor": c, "density": 0.01, "numel": n, "compress_s": 7e-9 * n, "decompress_s": 1e-10 * n}
            for c in ("topk", "dgc") for n in (1 << 20, 1 << 22)]
    here = host_identity()
    elsewhere = {**here, "cpu": "Some Other CPU"}
    shipped = [device_profile.DeviceProfile("cpu", "measured elsewhere", tuple(rows), "2026-11-30", elsewhere),
               device_profile.DeviceProfile("cpu", "measured here", tuple(rows), "2026-12-01", here),
               device_profile.DeviceProfile("h100", "measured on an h100", tuple(rows), "2026-12-01", {})]
    paths = [p.save(tmp_path / f"{i}.json") for i, p in enumerate(shipped)]
    monkeypatch.setattr(profiles, "paths", lambda: paths)
    with Store(tmp_path / "r.sqlite") as store:
        store.add_device_profile("cpu", {}, "measured", [dict(r, compress_s=3e-9 * r["numel"]) for r in rows
                                                        if r["compressor"] == "topk"])
        pairs = [("topk", 0.01), ("dgc", 0.01), ("sidco-e", 0.01)]
        costs = compression_profile(store, trace_id=None, device=devices.get("cpu"), pairs=pairs)
        assert costs.cost("topk", 0.01).source.startswith("measured cpu ")
        assert costs.cost("topk", 0.01).compress_per_element_s == pytest.approx(3e-9)
        assert costs.cost("dgc", 0.01).source == "measured cpu 2026-12-01 (shipped 1.json)"
        assert costs.cost("sidco-e", 0.01).source.startswith("model cpu")
        on_h100 = compression_profile(store, trace_id=None, device=devices.get("h100"), pairs=pairs)
        assert on_h100.cost("dgc", 0.01).source == "measured h100 2026-12-01 (shipped 2.json)"


def test_a_layout_on_an_h200_gets_gpu_costs_never_this_hosts(tmp_path, capsys):
    store_path = tmp_path / "r.sqlite"
    with Store(store_path) as store:  # measured CPU costs are there, and must not be used
        store.add_device_profile("cpu", {}, "measured", [
            {"compressor": "topk", "density": 0.01, "numel": n, "compress_s": 1e-7 * n, "decompress_s": 1e-9 * n}
            for n in (1 << 20, 1 << 22)])
    argv = ["simulate", "--layout", "vgg19", "--nodes", "8", "--bandwidth", "1Gbit", "--compressor", "topk",
            "--density", "0.01", "--store", str(store_path), "--json", "--fidelity", "analytic"]
    assert main(argv + ["--device", "h200"]) == 0
    on_gpu = json.loads(capsys.readouterr().out)
    assert on_gpu["device"] == "h200" and on_gpu["cost_source"] == "model h200"
    assert "h200 amp: bf16 peak 989 TFLOP/s" in on_gpu["compute_source"]
    h200 = devices.get("h200")
    expected = costmodel.cost("topk", 0.01, h200)
    wl = projection.workload(projection.layout_source("vgg19", device="h200"))
    per_bucket = [expected.compress_s(b.numel) for b in wl.buckets()]
    assert on_gpu["compress_total_s"] == pytest.approx(sum(per_bucket), rel=1e-6)
    assert main(argv + ["--device", "cpu"]) == 0
    on_cpu = json.loads(capsys.readouterr().out)
    assert on_cpu["cost_source"].startswith("measured cpu ")
    assert on_gpu["compress_total_s"] < on_cpu["compress_total_s"] / 100


def test_a_cpu_trace_is_projected_onto_a_gpu_by_the_peak_ratio(tmp_path):
    trace = traces.synthetic(tmp_path / "t", "laplace", 50_000, workers=2, iterations=1, seed=0)
    with Store(tmp_path / "r.sqlite") as store:
        own = projection.trace_source(store, path=trace.path)
        on_h100 = projection.trace_source(store, path=trace.path, device="h100")
    ratio = devices.get("cpu").fp32_flops / devices.get("h100").bf16_flops
    assert own.compute_scale == 1.0 and on_h100.compute_scale == pytest.approx(ratio)
    assert "x " in on_h100.compute and "h100's bf16 peak" in on_h100.compute
    base, projected = projection.workload(own), projection.workload(on_h100)
    assert projected.forward_s == pytest.approx(base.forward_s * ratio)
    assert projected.backward_s == pytest.approx(base.backward_s * ratio)
    assert projected.nbytes == base.nbytes


def _projection_json(store: str) -> list[str]:
    runs = []
    for extra in (["--layout", "resnet50", "--device", "h200"], ["--layout", "bert-base", "--device", "cpu"]):
        argv = [sys.executable, "-m", "sidco", "simulate", *extra, "--nodes", "8", "--bandwidth", "1Gbit",
                "--compressor", "sidco-e", "--density", "0.001", "--store", store, "--json", "--fidelity", "analytic"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
        runs.append(done.stdout)
    return runs


@pytest.mark.slow
def test_the_same_projection_on_a_quiet_and_on_a_busy_machine_is_the_same(tmp_path):
    """Nothing is timed implicitly: a CPU-burning neighbour changes no number."""
    store = str(tmp_path / "r.sqlite")
    quiet = _projection_json(store)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        busy = _projection_json(store)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert busy == quiet
    assert json.loads(quiet[0])["cost_source"] == "model h200 fused"  # SIDCo on a GPU: the fused path



def test_a_v100_is_never_said_to_train_in_bf16():
    """A V100 has no bf16 units: whatever the precision, its layout note names fp32 or fp16, never bf16."""
    from pipeline import project

    for precision in ("fp32", "tf32", "amp"):
        note = project.layout_source("resnet50", device="v100", precision=precision).compute
        assert "bf16" not in note and ("fp16 peak" in note or "fp32 peak" in note), note
    assert "bf16 peak" in project.layout_source("resnet50", device="a100", precision="amp").compute
