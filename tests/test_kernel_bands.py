"""Kernel bands by kind: each kind's band covers its published GPU timings, held out by harness;
a compressor's band is the mix of the kinds its declared work uses."""

from __future__ import annotations

import json

import pytest

from costs import costmodel, devices, kernel_bands, published
from costs.profile import CompressionCost
import profiles
from compressors import work as declared
from pipeline.costs import cost_band, measured_band


@pytest.mark.parametrize("device", ("a100", "v100@pytorch-1.3", "cpu"))
def test_the_kinds_of_a_call_add_up_to_its_modelled_seconds(device):
    model = devices.get(device)
    for name in declared.DECLARATIONS:
        call = costmodel.call_work(name, 1 << 20, 0.01, model)
        for side in (call.compress, call.decompress):
            parts = costmodel.seconds_by_kind(side, model)
            assert set(parts) == set(costmodel.KERNEL_KINDS)
            assert sum(parts.values()) == pytest.approx(costmodel.seconds(side, model), rel=1e-12)
            assert min(parts.values()) >= 0


def test_every_published_row_names_its_gpu_harness_and_source_and_prices_held_out():
    rows = kernel_bands.evidence()
    raw = json.loads(profiles.KERNEL_EVIDENCE.read_text())["rows"]
    assert len([e for e in rows if not e.fitted]) == len(raw)
    for e in rows:
        assert e.harness and e.row["source"].strip() and e.device and e.row.get("software")
        assert e.kind == kernel_bands.KIND_OF_KERNEL[e.row["kernel"]]
        if e.ratio is not None:
            assert e.ratio == pytest.approx(e.published_s / e.model_s)
    # nothing else predicts the H100's one published copy or the one published launch floor: listed, not counted
    assert {(e.device, e.row["kernel"]) for e in rows if e.ratio is None} == {("h100", "copy"), ("h100", "launch")}


def test_a_copy_row_is_predicted_by_the_bandwidth_of_the_other_harness_only():
    """The V100's 14 torch copies (chsasank) are priced at the bandwidth of RRZE's one streaming copy:
    2 · 8 · (2²⁸ + 2) bytes over its time; the sync, with no other V100 row including one, is the
    other GPUs' median."""
    rrze = next(r for r in published.profile("v100").kernels if r["kernel"] == "copy" and "RRZE" in r["harness"])
    bandwidth = 2 * rrze["numel"] * rrze["element_bytes"] / rrze["seconds"]
    held = kernel_bands.held_out_device("v100", "chsasank/device-benchmarks", "elementwise")
    assert held.memory_bandwidth_Bps == pytest.approx(bandwidth, rel=1e-9)
    assert held.sync_s == published.sync_s()
    assert held.topk_s(0.01) == pytest.approx(20 / bandwidth)  # every rule derived from it moves with it
    row = next(e for e in kernel_bands.evidence() if e.device == "v100" and e.row["numel"] == 1 << 20)
    expected = 2 * (1 << 20) * 4 / bandwidth + held.launch_s + published.sync_s()
    assert row.model_s == pytest.approx(expected, rel=1e-9)


def test_each_kinds_band_spans_exactly_its_rows_and_a_kind_without_rows_is_unmeasured():
    bands = kernel_bands.kind_bands()
    assert set(bands) == set(costmodel.KERNEL_KINDS)
    for kind, band in bands.items():
        ratios = [e.ratio for e in kernel_bands.evidence() if e.kind == kind and e.ratio is not None]
        if not ratios:
            assert (band.low, band.high, band.rows) == (*kernel_bands.UNMEASURED, 0)
            continue
        assert (band.low, band.high) == (min(1.0, min(ratios)), max(1.0, max(ratios)))
        assert band.rows == len(ratios) and band.harnesses
    # the published torch.topk series (pytorch/pytorch#164459) lies 3.8-5.5x above the 20-bytes rule
    assert bands["sort/top-k"].high > 3.5 and bands["sort/top-k"].low < 0.6


def test_top_ks_band_comes_from_the_sort_and_top_k_evidence(monkeypatch):
    a100 = devices.get("a100")
    bands = kernel_bands.bands_on(a100)
    parts = kernel_bands.shares("topk", 0.001, a100, 1 << 24)
    # beside error feedback's streaming passes, its GPU time is one torch.topk over the gradient
    assert parts["sort/top-k"] > 0.3 * sum(parts.values()) and parts["compaction"] == 0
    low, high = kernel_bands.mix(parts, bands)
    total = sum(parts.values())
    assert high == pytest.approx(sum(t * bands[k][1] for k, t in parts.items()) / total)
    assert kernel_bands.compressor_band("topk", 0.001, a100)[1] >= high > 2.0
    # with the sort/top-k evidence removed (its band a point), Top-k's band falls to the other kinds'
    monkeypatch.setattr(kernel_bands, "_BANDS", {})
    monkeypatch.setattr(kernel_bands, "bands_on", lambda device: {**bands, "sort/top-k": (1.0, 1.0)})
    assert kernel_bands.compressor_band("topk", 0.001, a100)[1] < 1.6


def test_an_earlier_pytorchs_top_k_is_unmeasured_on_the_v100():
    then = kernel_bands.bands_on(devices.get("v100@pytorch-1.3"))
    assert then["sort/top-k"] == kernel_bands.UNMEASURED
    assert then["elementwise"] == kernel_bands.bands_on(devices.get("v100"))["elementwise"]


def test_a_measured_cost_takes_the_measured_spread_not_the_kernel_band():
    a100 = devices.get("a100")
    modelled = costmodel.cost("topk", 0.001, a100)
    assert cost_band(modelled, "a100", "topk", 0.001, a100) == kernel_bands.compressor_band("topk", 0.001, a100)
    measured = CompressionCost(1e-5, 1e-9, 1e-6, 1e-10, (0.008,), "file mine.json: my a100")
    assert cost_band(measured, "a100", "topk", 0.001, a100) == measured_band()
