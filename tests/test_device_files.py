"""GPUs as data: every device file of profiles/devices/ loads, cites a source per field, and a new
GPU (a B200) is one file and nothing else."""

from __future__ import annotations

import json
import shutil

import pytest

from costs import costmodel, devices
from costs.devices import CPU_FILE, DEVICES_DIR, FILE_FIELDS, SPEC_FIELDS

FILES = sorted(p for p in DEVICES_DIR.glob("*.json") if p != CPU_FILE)


def test_every_device_is_a_device_file():
    assert [p.stem for p in FILES] == sorted(devices.GPUS)
    assert devices.names() == ["cpu", "v100", "a100", "h100", "h200"]  # GPUs in the order they were announced


def test_the_hosts_stated_defaults_are_a_device_file_citing_every_field():
    data = devices.read_cpu()
    default = devices.cpu_default()
    for key in devices.CPU_FIELDS:
        assert getattr(default, key) == data["defaults"][key] == devices.CPU_DEFAULTS[key]
        assert default.sources[key] == data["sources"][key] and "stated default" in data["sources"][key]
    assert default.fp16_flops == default.tf32_flops == 0.0 and default.sources["tf32_flops"] == devices.NO_TENSOR_UNITS


def test_a_bad_cpu_file_is_refused(tmp_path):
    data = json.loads(CPU_FILE.read_text())
    del data["sources"]["launch_s"]
    (tmp_path / "cpu.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="sources must cite launch_s"):
        devices.read_cpu(tmp_path / "cpu.json")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_device_file_has_its_schema_and_cites_every_field(path):
    data = json.loads(path.read_text())
    assert list(data) == list(FILE_FIELDS)
    assert devices.read_gpu(path) == data
    cited = set(FILE_FIELDS) - {"name", "kind", "label", "sources"}
    assert set(data["sources"]) == cited
    for key in cited:
        assert len(data["sources"][key]) > 10, f"{path.name}: {key} cites too little"
    spec = ("datasheet", "measured", "PCIe")
    for key in (*SPEC_FIELDS, "memory_bandwidth_Bps"):
        assert any(word in data["sources"][key] for word in spec), f"{path.name}: {key} names no spec sheet"
    device = devices.get(data["name"])
    assert device.label == data["label"] and device.fp32_flops == data["fp32_flops"]
    for key in SPEC_FIELDS:
        assert device.sources[key] == data["sources"][key]
    if data["memory_bandwidth_Bps"] is None:  # fitted to the published rows, naming the peak
        assert device.sources["memory_bandwidth_Bps"].startswith("published: fitted to the")
    else:
        assert device.memory_bandwidth_Bps == data["memory_bandwidth_Bps"]


def test_the_profilers_gpu_names_derive_from_the_files():
    profiling = pytest.importorskip("measuring.profiling")
    assert profiling.GPU_NAMES == devices.cuda_names() == {"H200": "h200", "H100": "h100", "A100": "a100",
                                                             "V100": "v100"}


B200 = {
    "name": "b200", "kind": "gpu", "label": "NVIDIA B200 SXM", "match": "B200", "announced": "2024-03",
    "memory_bandwidth_Bps": 7.2e12, "fp32_flops": 75e12, "bf16_flops": 2.25e15, "fp16_flops": 2.25e15,
    "tf32_flops": 1.125e15, "pcie_Bps": 63e9,
    "sources": {
        "match": "the part of torch.cuda.get_device_name that names this GPU",
        "announced": "NVIDIA GTC 2024 keynote, 18 March 2024: Blackwell B200 announced",
        "memory_bandwidth_Bps": "NVIDIA HGX B200 datasheet: 8 TB/s peak per GPU; 0.9 of it, as measured on an H200",
        "fp32_flops": "NVIDIA HGX B200 datasheet: 600 TFLOP/s fp32 for 8 GPUs",
        "bf16_flops": "NVIDIA HGX B200 datasheet: 36 PFLOP/s bf16 with sparsity for 8 GPUs, halved, per GPU",
        "fp16_flops": "NVIDIA HGX B200 datasheet: dense fp16 tensor-core peak",
        "tf32_flops": "NVIDIA HGX B200 datasheet: dense TF32 tensor-core peak (the datasheet's figure with sparsity "
                      "halved)",
        "pcie_Bps": "PCIe 5.0 ×16: 63 GB/s per direction",
    },
}


def test_a_new_gpu_is_one_file(tmp_path, monkeypatch):
    for path in FILES:
        shutil.copy(path, tmp_path)
    (tmp_path / "b200.json").write_text(json.dumps(B200))
    gpus = devices.load_gpus(tmp_path)
    assert list(gpus) == ["v100", "a100", "h100", "h200", "b200"]
    assert devices.cuda_names(tmp_path)["B200"] == "b200"
    monkeypatch.setattr(devices, "GPUS", gpus)
    b200 = devices.get("B200")
    assert "b200" in devices.names() and b200.label == "NVIDIA B200 SXM"
    assert b200.memory_bandwidth_Bps == 7.2e12 and b200.topk_s(0.01) == pytest.approx(20 / 7.2e12)
    assert b200.launch_s == devices.get("h100").launch_s  # no published rows: the rules' shared numbers
    assert b200.peak_flops("amp") == 2.25e15 and b200.amp_dtype == "bf16"
    assert b200.sources["fp32_flops"] == B200["sources"]["fp32_flops"]
    h200 = devices.get("h200")
    # priced like any GPU: the same work runs faster on the B200's bandwidth
    assert 0 < costmodel.call_seconds("topk", 2**24, 0.01, b200)[0] < costmodel.call_seconds("topk", 2**24, 0.01, h200)[0]


@pytest.mark.parametrize("change,message", [
    ({"fp32_flops": -1.0}, "fp32_flops must be a number >= 0"),
    ({"pcie_Bps": "fast"}, "pcie_Bps must be a number"),
    ({"name": "b100"}, "name must be the file's name"),
    ({"sources": {**B200["sources"], "tf32_flops": ""}}, "sources must cite tf32_flops"),
    ({"extra": 1}, "needs exactly the keys"),
    ({"memory_bandwidth_Bps": 0.0}, "must be > 0"),
])
def test_a_bad_device_file_is_refused_naming_the_field(tmp_path, change, message):
    (tmp_path / "b200.json").write_text(json.dumps({**B200, **change}))
    with pytest.raises(ValueError, match=message):
        devices.load_gpus(tmp_path)
