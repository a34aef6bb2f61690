"""One request both doors fill, checked once; the modelled device looked up once and carried on it."""

from __future__ import annotations

import json
import math

import pytest

import costs.costmodel
import pipeline.project
from costs import devices
from dashboard import projection
from pipeline.costs import same_device
from pipeline.request import DEFAULT_LAYOUT_DEVICE, Cluster, Request, pairs, resolve_device
from sidco.cli import main

CLUSTER = Cluster(8, 10e9, 50e-6)


@pytest.fixture
def walk(monkeypatch):
    """Counts, with the real functions running: every ``devices.get`` (the names asked), every
    call of the one resolver, and the device object each cost-model call receives."""
    from costs import kernel_bands, throughput

    # the published evidence's fits (cached per process) look up every device they cite: made first
    throughput.fitted(), kernel_bands.kind_bands()
    seen = {"get": [], "resolved": [], "costed": []}
    real_get, real_resolve, real_cost = devices.get, pipeline.project.resolve_device, costs.costmodel.cost

    def get(name):
        seen["get"].append(name)
        return real_get(name)

    def resolve(*args, **kwargs):
        device = real_resolve(*args, **kwargs)
        seen["resolved"].append(device)
        return device

    def cost(name, density, device, *args, **kwargs):
        seen["costed"].append(device)
        return real_cost(name, density, device, *args, **kwargs)

    monkeypatch.setattr(devices, "get", get)
    monkeypatch.setattr(pipeline.project, "resolve_device", resolve)
    monkeypatch.setattr(costs.costmodel, "cost", cost)
    return seen


@pytest.mark.parametrize("device, expected", [(None, DEFAULT_LAYOUT_DEVICE), ("h100", "h100"), ("H200", "h200")])
def test_simulate_looks_the_device_up_once_and_the_cost_model_gets_that_device(tmp_path, walk, capsys, device, expected):
    argv = ["simulate", "--layout", "resnet50", "--nodes", "8", "--bandwidth", "10Gbit", "--compressor", "topk",
            "--density", "0.01", "--store", str(tmp_path / "r.sqlite"), "--json"]
    assert main(argv + (["--device", device] if device else [])) == 0
    result = json.loads(capsys.readouterr().out)
    assert [name.lower() for name in walk["get"]] == [expected]  # one look-up, by its exact name
    (resolved,) = walk["resolved"]
    assert resolved.name == expected == result["device"]
    assert walk["costed"] and all(d is resolved for d in walk["costed"])  # the very object the request resolved
    assert result["cost_source"] == f"model {expected}"


def test_a_trace_projected_onto_a_gpu_looks_up_that_gpu_once_and_its_capture_host_for_the_ratio(tmp_path, walk,
                                                                                                 capsys):
    from test_sweep import make_trace

    trace = make_trace(tmp_path)
    argv = ["simulate", "--trace", str(trace), "--nodes", "4", "--bandwidth", "1Gbit", "--compressor", "dgc",
            "--density", "0.01", "--store", str(tmp_path / "r.sqlite"), "--json"]
    assert main(argv + ["--device", "h200"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "h200"
    assert walk["get"] == ["h200", "cpu"]  # the modelled device, then the host the trace was captured on
    assert [d.name for d in walk["resolved"]] == ["h200"]
    assert all(d is walk["resolved"][0] for d in walk["costed"])
    for key in walk:
        walk[key].clear()
    assert main(argv) == 0  # no --device: the device the trace was captured on, looked up once
    assert json.loads(capsys.readouterr().out)["device"] == "cpu"
    assert walk["get"] == ["cpu"] and [d.name for d in walk["resolved"]] == ["cpu"]


def test_one_default_rule():
    assert resolve_device(None, layout=True).name == DEFAULT_LAYOUT_DEVICE
    assert resolve_device(None, layout=False, captured="cpu").name == "cpu"
    unrecorded = resolve_device(None, layout=False, captured="cuda:0")  # its GPU model is not recorded
    assert unrecorded.name == "cuda" and not unrecorded.modelled and math.isnan(unrecorded.memory_bandwidth_Bps)
    assert resolve_device("V100", layout=True).name == "v100"
    with pytest.raises(ValueError, match="unknown device 'a10'"):  # no prefix or substring matching
        resolve_device("a10", layout=True)


def test_stored_devices_match_by_whole_name_never_by_substring():
    assert same_device("cuda: NVIDIA H200 SXM", "h200") and same_device("cuda: NVIDIA A100-SXM4-80GB", "a100")
    assert same_device("cpu: AMD EPYC 9654 (avx512)", "cpu") and same_device("cuda: NVIDIA H100", "cuda")
    assert not same_device("cuda: NVIDIA GH200", "h200")
    assert not same_device("cuda: NVIDIA H100", "h10")
    assert not same_device("cpu: AMD EPYC (avx512)", "epyc")


@pytest.mark.parametrize("fields, message", [
    ({}, "give one workload"),
    ({"layout": "resnet50", "trace": "t"}, "give one workload"),
    ({"layout": "resnet5"}, "unknown layout"),
    ({"layout": "resnet50", "compressors": ("zip",)}, "unknown compressor 'zip'"),
    ({"layout": "resnet50", "compressors": ()}, "choose at least one compressor"),
    ({"layout": "resnet50", "compressors": ("topk",)}, "--density is needed with --compressor topk"),
    ({"layout": "resnet50", "compressors": ("topk",), "densities": (0.0,)}, r"density must be in \(0, 1\]"),
    ({"layout": "resnet50", "compressors": ("topk",), "densities": (float("nan"),)}, r"density must be in \(0, 1\]"),
    ({"layout": "resnet50", "precision": "fp8"}, "precision"),
    ({"layout": "resnet50", "device_flops_per_s": -1.0}, "device FLOP/s must be"),
    ({"trace": "t", "device_flops_per_s": 1e12}, "--device-flops applies to layouts"),
    ({"layout": "resnet50", "batch_size": 0}, "batch size"),
    ({"layout": "resnet50", "calibration": "newest"}, "invalid --calibration"),
])
def test_the_request_checks_every_rule_once(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        Request(CLUSTER, **fields)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("args, message", [
    ((0, 1e9, 0.0), "nodes must be an integer >= 1"),
    ((2, 0.0, 0.0), "bandwidth"),
    ((2, float("inf"), 0.0), "bandwidth"),
    ((2, "10Gbit", 0.0), "bandwidth must be a number"),
    ((2, 1e9, -1e-6), "latency"),
])
def test_the_cluster_checks_its_numbers(args, message):
    with pytest.raises(ValueError, match=message):
        Cluster(*args)
    with pytest.raises(ValueError, match="unknown topology 'mesh'"):
        Cluster(2, 1e9, 0.0, "mesh")


def test_pairs_give_density_free_compressors_once_and_sparsifiers_at_every_density():
    assert pairs(["none", "topk", "fp16", "topk"], [0.1, 0.01, 0.1]) == [
        ("none", None), ("fp16", None), ("topk", 0.1), ("topk", 0.01)]
    request = Request(CLUSTER, ("none", "fp16"), layout="gpt2")  # no sparsifier: no density needed
    assert request.pairs() == [("none", None), ("fp16", None)] and request.calibration == "none"
    assert Request(CLUSTER, layout="gpt2", calibration="3").calibration == 3


def test_both_doors_fill_the_same_request():
    from sidco.cli import build_parser
    from sidco.commands.simulate import cluster, workload_fields

    args = build_parser().parse_args(["simulate", "--layout", "resnet50", "--nodes", "8", "--bandwidth", "10Gbit",
                                      "--compressor", "topk", "--density", "0.01", "--device", "h100",
                                      "--fidelity", "analytic", "--calibration", "latest"])
    from_cli = Request(cluster(args), ("topk",), (0.01,), **workload_fields(args))
    from_page = projection.parse_controls("layout:resnet50", ["topk"], "0.01", "8", "10Gbit", "50us", "ring",
                                          calibrated=True, device="h100")
    page_cluster = from_page.cluster
    assert (page_cluster.nodes, page_cluster.bandwidth_bps, page_cluster.latency_s, page_cluster.topology) == (
        from_cli.cluster.nodes, from_cli.cluster.bandwidth_bps, from_cli.cluster.latency_s, from_cli.cluster.topology)
    same = ("compressors", "densities", "layout", "trace_id", "device", "precision", "device_flops_per_s",
            "batch_size", "calibration")
    assert {k: getattr(from_page, k) for k in same} == {k: getattr(from_cli, k) for k in same}


def test_more_than_one_gpu_per_node_defaults_to_the_hierarchical_topology(capsys):
    """``--gpus-per-node 8`` alone projects on the hierarchical topology (the one model with an
    intra-node level); a flat topology named with it is refused in one line."""
    from pipeline.request import Cluster, default_topology
    from sidco.cli import main

    assert Cluster(4, 1e10, 5e-5).topology == "ring"
    assert Cluster(4, 1e10, 5e-5, options={"gpus_per_node": 8}).topology == "hierarchical"
    assert Cluster(4, 1e10, 5e-5, "tree").topology == "tree"
    assert default_topology(1) == "ring" and default_topology(2) == "hierarchical"
    base = ["simulate", "--layout", "resnet50", "--nodes", "4", "--bandwidth", "10Gbit", "--fidelity", "analytic",
            "--gpus-per-node", "8"]
    assert main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"] == 32
    assert main(base) == 0
    assert "on 4 nodes (32 workers), hierarchical," in capsys.readouterr().out.splitlines()[0]
    assert main([*base, "--topology", "ring"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8 GPUs per node need the hierarchical topology" in err[0]


@pytest.mark.parametrize("fields, message", [
    ({"trace_id": 2**63}, f"unknown trace {2**63}"),
    ({"trace_id": 0}, "unknown trace 0"),
    ({"trace_id": True}, "unknown trace True"),
    ({"layout": "resnet50", "profile_id": 2**70}, f"unknown device profile {2**70}"),
    ({"layout": "resnet50", "profile_id": 0}, "unknown device profile 0"),
])
def test_a_stored_id_no_row_can_have_is_refused_by_the_request(fields, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Request(CLUSTER, **fields)
