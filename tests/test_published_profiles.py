"""Published GPU kernel rows (profiles/published-<gpu>.json): they load through --profile, the
GPU rules' bandwidth, launch and sync come from them, the model meets its goals on them, and a
measured profile outranks a published one, which outranks the model."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costs import costmodel, devices, published
from costs import device_profile as dp
import profiles
from pipeline import costs
from pipeline import profile as device_profiles
from pipeline.costs import compression_profile
from results.store import Store
from sidco.cli import main

GPUS = ("v100", "a100", "h100")
SHIPPED = profiles.paths()  # read before conftest hides the shipped profiles from in-process tests


@pytest.mark.parametrize("name", GPUS)
def test_published_rows_load_through_profile_and_cite_their_source(name, tmp_path):
    path = published.path(name)
    shipped = dp.load(path)
    assert shipped.device == name and shipped.kernels and not shipped.rows
    for row in shipped.kernels:
        assert row["kernel"] in dp.KERNELS and row["seconds"] > 0 and row["numel"] >= 1
        # every row names where it was published (a repository, issue or pull request) and the GPU it ran on
        assert any(site in row["source"] for site in ("/", "#")) and len(row["source"]) > 60
    # --profile FILE accepts it: no compressor costs in it, so every pair falls to the next tier
    assert costs.read_profile_file(path, name) == {}
    with Store(tmp_path / "r.sqlite") as store:
        got = compression_profile(store, trace_id=None, device=devices.get(name), pairs=[("topk", 0.01)], profile_file=path)
    assert got.cost("topk", 0.01).source == f"model {name}"
    # and the file round-trips through the format
    again = dp.from_json(shipped.to_json(), "again")
    assert again.kernels == shipped.kernels


def test_the_gpu_rules_take_bandwidth_launch_and_sync_from_the_published_rows():
    launches = [r["seconds"] / r["launches"] for n in published.names() for r in published.profile(n).kernels
                if r["kernel"] == "launch"]
    assert launches and published.launch_s() == statistics.median(launches)
    syncs = []
    for name in GPUS:
        device, found = devices.get(name), published.numbers(name)
        assert device.memory_bandwidth_Bps == found.bandwidth_Bps == device.write_bandwidth_Bps
        assert device.launch_s == published.launch_s()
        assert "published" in device.sources["memory_bandwidth_Bps"] and found.file in device.sources["memory_bandwidth_Bps"]
        if found.sync_s is not None:
            assert device.sync_s == found.sync_s
            syncs.append(found.sync_s)
    assert devices.get("h100").sync_s == statistics.median(syncs) == devices.get("h200").sync_s
    # the H200 has no published rows: its bandwidth stays the copy measured on one
    assert devices.get("h200").memory_bandwidth_Bps == 4.3e12


@settings(max_examples=30, deadline=None)
@given(bandwidth=st.floats(1e11, 1e13), sync=st.floats(0.0, 5e-5), launch=st.floats(1e-6, 2e-5),
       sizes=st.lists(st.integers(1 << 10, 1 << 28), min_size=2, max_size=6, unique=True))
def test_fit_copies_recovers_the_bandwidth_and_sync_that_made_the_rows(bandwidth, sync, launch, sizes):
    rows = [{"kernel": "copy", "numel": n, "element_bytes": 4, "launches": 1, "syncs": 1,
             "seconds": launch + sync + 8.0 * n / bandwidth} for n in sizes]
    rows.append({"kernel": "copy", "numel": 1 << 26, "element_bytes": 8, "launches": 0, "syncs": 0,
                 "seconds": 16.0 * (1 << 26) / bandwidth})
    fitted_bw, fitted_sync = published.fit_copies(rows, launch)
    assert fitted_bw == pytest.approx(bandwidth, rel=1e-6)
    assert fitted_sync == pytest.approx(sync, rel=1e-6, abs=1e-12)


def test_kernel_seconds_is_bytes_over_bandwidth_plus_the_launches_and_syncs_timed():
    h100 = devices.get("h100")
    bw = h100.memory_bandwidth_Bps
    assert costmodel.kernel_seconds("copy", 1000, h100, element_bytes=8, launches=2, syncs=1) == pytest.approx(
        16000 / bw + 2 * h100.launch_s + h100.sync_s)
    assert costmodel.kernel_seconds("read", 1000, h100) == pytest.approx(4000 / bw)
    assert costmodel.kernel_seconds("fill", 1000, h100) == pytest.approx(4000 / h100.write_bandwidth_Bps)
    assert costmodel.kernel_seconds("launch", 1, h100, launches=1) == h100.launch_s
    # a cast reads its input and writes its output at their own sizes (bf16 -> fp32: 2 bytes in, 4 out)
    assert costmodel.kernel_seconds("cast", 1000, h100, element_bytes=2, out_bytes=4, launches=1) == pytest.approx(
        2000 / bw + 4000 / h100.write_bandwidth_Bps + h100.launch_s)
    # a radix sort of b-byte keys with v bytes of payload: b passes of 8 bits, each reading and writing key and payload
    assert costmodel.kernel_seconds("sort", 1000, h100, element_bytes=4) == pytest.approx(1000 * 4 * 2 * 4 / bw)
    assert costmodel.kernel_seconds("sort", 1000, h100, element_bytes=4, value_bytes=4) == pytest.approx(
        1000 * 4 * 2 * 8 / bw)
    # top-k: the device's rate per input element; a product: FLOPs at the fp32 rate plus operands and output
    assert costmodel.kernel_seconds("topk", 1000, h100, k=10) == pytest.approx(1000 * h100.topk_s(0.01))
    assert costmodel.kernel_seconds("matmul", 100, h100, inner=10) == pytest.approx(
        2 * 100 * 10 / h100.fp32_flops + (10 * 10 + 10 * 10) * 4 / bw + 400 / h100.write_bandwidth_Bps)
    with pytest.raises(ValueError):
        costmodel.kernel_seconds("scan", 1, h100)
    with pytest.raises(ValueError):
        costmodel.kernel_seconds("topk", 10, h100, k=11)


@pytest.mark.parametrize("name", ("v100", "a100", "h100", "h200"))
def test_the_gpu_sort_rule_is_the_radix_sort_bytes_of_int64_keys_at_the_bandwidth(name):
    device = devices.get(name)
    assert devices.radix_sort_bytes(8) == 128 and devices.radix_sort_bytes(4, 8) == 96
    assert device.sort_s(1 << 20) == pytest.approx(128 / device.memory_bandwidth_Bps)
    assert "arXiv:2206.01784" in device.sources["sort_s_per_element"]


def test_cast_and_sort_rows_check_the_model_and_are_not_fitted():
    """The bandwidth and sync are fitted to copy rows only: the published casts and sorts are
    held against the model, not folded into it."""
    shipped = published.profile("a100").kernels
    kinds = {r["kernel"] for r in shipped}
    assert {"cast", "sort"} <= kinds
    copies_only = [r for r in shipped if r["kernel"] == "copy"]
    assert published.fit_copies(shipped, published.launch_s()) == published.fit_copies(copies_only, published.launch_s())
    assert published.numbers("a100").copy_rows == len(copies_only)


def test_the_model_is_within_its_goals_on_every_published_row(tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "paths", lambda: SHIPPED)
    with Store(tmp_path / "r.sqlite") as store:
        report = {item["profile"]: item for item in device_profiles.check(store)}
    for name in GPUS:
        item = report[f"shipped published-{name}.json"]
        summary = item["kernel_summary"]
        assert summary["rows"] == len(published.profile(name).kernels)
        assert summary["median"] <= device_profiles.GOAL and summary["worst_factor"] <= device_profiles.KERNEL_FACTOR
        for row in item["kernels"]:
            assert row["model_s"] == pytest.approx(row["seconds"] * (1 + row["error"]))


def test_profile_check_prints_every_published_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(profiles, "paths", lambda: SHIPPED)
    path = published.path("v100")
    assert main(["profile", "--check", "--profile", str(path), "--store", str(tmp_path / "r.sqlite")]) == 0
    out = capsys.readouterr().out
    for name in GPUS:
        section = out[out.index(f"shipped published-{name}.json"):]
        section = section[:section.index("\nshipped", 1)] if "\nshipped" in section[1:] else section
        assert sum(section.count(f"\n  {kind} ") for kind in dp.KERNELS) == len(published.profile(name).kernels)
        assert "median |error|" in section and "(ok)" in section


@pytest.mark.parametrize("row, message", [
    ({"kernel": "copy", "numel": 10, "seconds": 1e-3}, "needs a source"),
    ({"kernel": "scan", "numel": 10, "seconds": 1e-3, "source": "x"}, "kernel must be one of"),
    ({"kernel": "topk", "numel": 10, "seconds": 1e-3, "source": "x"}, "k must be"),
    ({"kernel": "topk", "numel": 10, "k": 11, "seconds": 1e-3, "source": "x"}, "k must be at most numel"),
    ({"kernel": "matmul", "numel": 10, "seconds": 1e-3, "source": "x"}, "inner must be"),
    ({"kernel": "copy", "numel": 10, "seconds": 0, "source": "x"}, "must be > 0"),
    ({"kernel": "cast", "numel": 10, "seconds": 1e-3, "out_bytes": 0, "source": "x"}, "must be > 0"),
    ({"kernel": "sort", "numel": 10, "seconds": 1e-3, "value_bytes": -1, "source": "x"}, "value_bytes must be"),
    ({"kernel": "copy", "numel": 10, "seconds": 1e-3, "launches": 0.5, "source": "x"}, "whole number"),
    ({"kernel": "copy", "numel": 0, "seconds": 1e-3, "source": "x"}, "integer >= 1"),
    ({"compressor": "topk", "density": 0.1, "numel": 10, "compress_s": 1, "decompress_s": 1, "source": 3},
     "source must be a string"),
])
def test_bad_kernel_rows_are_one_line_errors(row, message):
    text = json.dumps({"device": "v100", "source": "s", "rows": [row]})
    with pytest.raises(ValueError, match=message) as caught:
        dp.from_json(text, "f.json")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("f.json: row 0")


def test_a_measured_profile_outranks_a_published_one_which_outranks_the_model(tmp_path, monkeypatch):
    """Item 6 of issue 20: when a GPU is lent and measured, its profile (stored by sidco profile)
    wins over a profile shipped from published numbers, which wins over the cost model."""
    def rows(per_element_s: float) -> list[dict]:
        return [{"compressor": "topk", "density": 0.01, "numel": n, "compress_s": per_element_s * n,
                 "decompress_s": per_element_s * n / 10, "source": "test"} for n in (1 << 20, 1 << 22)]

    shipped = tmp_path / "published-h100.json"
    shipped.write_text(json.dumps({"device": "h100", "source": "published (test)", "rows": rows(3e-11)}))
    monkeypatch.setattr(profiles, "paths", lambda: [shipped])
    pairs = [("topk", 0.01)]
    with Store(tmp_path / "r.sqlite") as store:
        cost = compression_profile(store, trace_id=None, device=devices.get("h100"), pairs=pairs).cost("topk", 0.01)
        assert cost.source.startswith("measured h100") and "shipped published-h100.json" in cost.source
        assert cost.compress_per_element_s == pytest.approx(3e-11)
        store.add_device_profile("h100", {"gpu": "NVIDIA H100"}, "sidco profile --device cuda", rows(5e-11))
        cost = compression_profile(store, trace_id=None, device=devices.get("h100"), pairs=pairs).cost("topk", 0.01)
        assert "profile #" in cost.source and cost.compress_per_element_s == pytest.approx(5e-11)
        monkeypatch.setattr(profiles, "paths", lambda: [])
        assert compression_profile(store, trace_id=None, device=devices.get("a100"), pairs=pairs).cost(
            "topk", 0.01).source == "model a100"
