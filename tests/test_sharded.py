"""Sharded data parallelism (simulator.sharded): collectives' bytes per step against closed forms, each
collective's step program against its closed form, analytic against des, refusals, memory, the doors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costs import CompressionCost, CompressionProfile, memory
from pipeline.request import sharding
from sidco.cli import main
from simulator import Scenario, simulate
from simulator.links import Fabric, Level
from simulator.sharded import (DTYPE_BYTES, QUANTIZED_REDUCE_SCATTER, Sharding, build, group_phase, refusal,
                               replicate_group, shard_group, units, working_numel)
from simulator.workload import Layer, Workload

INT8_WIRE = 1 + 4 / 256
"""Bytes an element of ``int8``'s message takes, by hand: a code byte, a 4-byte scale per 256 elements."""
PROFILE = CompressionProfile({("topk", 0.01): CompressionCost(1e-4, 2e-10, 5e-5, 1e-10, (0.02, 0.02)),
                              ("bf16", 1.0): CompressionCost(1e-5, 1e-11, 1e-5, 1e-11, (0.5, 0.5)),
                              ("int8", 1.0): CompressionCost(2e-5, 3e-11, 1e-5, 2e-11, (INT8_WIRE,))}, "test")
INTRA = Level(300e9, 2e-6)
LINK = Level(12.5e9, 50e-6)


def toy(blocks: int = 4, width: int = 256, vocab: int = 1000, batch: int = 4) -> Workload:
    """A transformer-shaped workload: an embedding, ``blocks`` blocks of two matrices and a norm, a head."""
    layers = [Layer("model.embed_tokens.weight", 4 * vocab * width, 1e-4, (vocab, width))]
    for i in range(blocks):
        layers += [Layer(f"model.layers.{i}.attn.weight", 4 * width * width, 2e-3, (width, width)),
                   Layer(f"model.layers.{i}.mlp.weight", 4 * 4 * width * width, 6e-3, (4 * width, width)),
                   Layer(f"model.layers.{i}.norm.weight", 4 * width, 1e-5, (width,))]
    layers.append(Layer("lm_head.weight", 4 * vocab * width, 3e-3, (vocab, width)))
    return Workload(tuple(layers), forward_s=0.5 * sum(x.backward_s for x in layers), optimizer_s=1e-3,
                    batch_size=batch)


def run(wl: Workload, parallel: str, fidelity: str = "analytic", nodes: int = 4, gpus: int = 8, **kw) -> dict:
    held = Sharding(parallel, **kw)
    sc = Scenario(wl, nodes, 100e9, 50e-6, topology="hierarchical", gpus_per_node=gpus, fidelity=fidelity,
                  sharding=held)
    return simulate(sc)


def test_units_are_the_root_and_the_blocks():
    found = units(toy(blocks=3))
    assert [u.name for u in found] == ["root", "block 0", "block 1", "block 2"]
    assert found[0].numel == 2 * 1000 * 256 and found[1].numel == 5 * 256 * 256 + 256
    assert sum(u.forward_s for u in found) == pytest.approx(toy(blocks=3).forward_s)
    assert working_numel(toy(blocks=3)) == (2 * 1000 * 256 + 2 * found[1].numel, 2 * 1000 * 256 + found[1].numel)


@pytest.mark.parametrize("micro", [None, 2])
@pytest.mark.parametrize("param_dtype", ["bf16", "fp8"])
def test_fsdp_bytes_per_step_are_the_closed_form(micro, param_dtype):
    """All-gather: 2 × params × param bytes × (p−1)/p per GPU with resharding (the root, never resharded
    between forward and backward, once); reduce-scatter: params × reduce bytes × (p−1)/p; per micro-batch."""
    wl = toy()
    found = units(wl)
    psi, root = sum(u.numel for u in found), sum(u.numel for u in found if u.root)
    p, k = 32, 1 if micro is None else 4 // micro
    r = run(wl, "fsdp", micro_batch=micro, param_dtype=param_dtype)
    share = (p - 1) / p
    ag = r["collectives"]["all-gather (parameters)"]
    rs = r["collectives"]["reduce-scatter (gradients)"]
    assert ag["bytes_per_gpu"] == pytest.approx(k * (2 * psi - root) * DTYPE_BYTES[param_dtype] * share)
    assert rs["bytes_per_gpu"] == pytest.approx(k * psi * 4 * share)
    assert ag["count"] == k * (2 * len(found) - 1) and rs["count"] == k * len(found)
    assert r["micro_batches"] == k and ag["per"] == ("micro-batch" if k > 1 else "step")


def test_hsdp_replicate_all_reduce_is_the_gradient_shard():
    wl = toy()
    psi = sum(u.numel for u in units(wl))
    r = run(wl, "hsdp", reduce_dtype="bf16")  # shard group: one node of 8, 4 replicas
    ar = r["collectives"]["all-reduce (replicate, gradient shard)"]
    assert ar["bytes_per_gpu"] == pytest.approx(2 * 3 / 4 * psi / 8 * 2)
    rs = r["collectives"]["reduce-scatter (gradients)"]
    assert rs["bytes_per_gpu"] == pytest.approx(psi * 2 * 7 / 8)
    assert r["shard_size"] == 8 and r["collective"] == "all-reduce (replicate, gradient shard)"



def test_a_group_collective_takes_the_calibration_of_its_node_count():
    """HSDP on 4 nodes of one GPU with shard groups of 2: every collective is a ring on 2 nodes, so it
    takes the ``@2`` fits (α 1 ms, efficiency 0.5 here), not the ``@4`` ones; its time is the ring's
    closed form on 2 ranks at that rate: 2·α + n/2 at half the link for an all-gather of n bytes."""
    from simulator.calibration import Calibration, OpFit

    wl = toy(blocks=2)
    fits = {"allgather@2": OpFit(1e-3, 0.5), "allgather@4": OpFit(0.0, 1.0),
            "allreduce@2": OpFit(1e-3, 0.5), "allreduce@4": OpFit(0.0, 1.0)}
    bandwidth = 1e9
    sc = Scenario(wl, 4, bandwidth, 0.0, topology="ring", gpus_per_node=1, sharding=Sharding("hsdp", shard_size=2),
                  calibration=Calibration(0.0, 0.0, 1.0, fits))
    r = simulate(sc)
    ag = r["collectives"]["all-gather (parameters)"]
    gathered = 2 * sum(u.numel for u in units(wl)) * 2 - sum(u.numel for u in units(wl) if u.root) * 2
    assert ag["total_s"] == pytest.approx(ag["count"] * 1e-3 + gathered / 2 * 8 / (0.5 * bandwidth))
    ar = r["collectives"]["all-reduce (replicate, gradient shard)"]
    psi = sum(u.numel for u in units(wl))
    assert ar["total_s"] == pytest.approx(ar["count"] * 2e-3 + psi * 4 / 2 * 8 / (0.5 * bandwidth))

@pytest.mark.parametrize("parallel", ["zero1", "zero2"])
def test_zero_reduces_and_gathers_the_updated_parameters_once(parallel):
    wl = toy()
    psi = sum(u.numel for u in units(wl))
    r = run(wl, parallel, micro_batch=1)  # 4 micro-batches
    share = 31 / 32
    gather = r["collectives"]["all-gather (updated parameters)"]
    assert gather["count"] == 1 and gather["bytes_per_gpu"] == pytest.approx(psi * 2 * share)
    if parallel == "zero1":
        ar = r["collectives"]["all-reduce (gradients)"]
        assert ar["per"] == "step" and ar["bytes_per_gpu"] == pytest.approx(2 * share * psi * 4)
    else:
        rs = r["collectives"]["reduce-scatter (gradients)"]
        assert rs["per"] == "micro-batch" and rs["bytes_per_gpu"] == pytest.approx(4 * psi * 4 * share)


@pytest.mark.parametrize("parallel", ["fsdp", "hsdp", "zero1", "zero2"])
def test_the_breakdown_sums_to_the_step_and_exposed_is_within_total(parallel):
    r = run(toy(), parallel, checkpointing=True)
    parts = r["forward_s"] + r["backward_s"] + r["compress_s"] + r["exposed_comm_s"] + r["idle_s"] + r["optimizer_s"]
    assert parts == pytest.approx(r["iteration_s"], rel=1e-9)
    for c in r["collectives"].values():
        assert 0 <= c["exposed_s"] <= c["total_s"] + 1e-12


def test_checkpointing_recomputes_each_block_forward():
    wl = toy()
    blocks = sum(u.forward_s for u in units(wl) if not u.root)
    assert run(wl, "fsdp", checkpointing=True)["backward_s"] == pytest.approx(
        run(wl, "fsdp")["backward_s"] + blocks)


@pytest.mark.parametrize("parallel", ["zero1", "zero2", "hsdp", "fsdp"])
def test_analytic_and_des_model_the_same_plan(parallel):
    """Same plan, same collectives: equal where the streams do not meet on a link (ZeRO), and where they
    do (FSDP's all-gather and reduce-scatter on one NIC) des queues them, so it is never faster."""
    wl = toy()
    a, d = run(wl, parallel), run(wl, parallel, "des")
    assert {k: v["bytes_per_gpu"] for k, v in a["collectives"].items()} == {
        k: v["bytes_per_gpu"] for k, v in d["collectives"].items()}
    if parallel.startswith("zero"):
        assert d["iteration_s"] == pytest.approx(a["iteration_s"], rel=1e-6)
    else:
        assert a["iteration_s"] * (1 - 1e-9) <= d["iteration_s"] <= 1.5 * a["iteration_s"]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(1, 1), (4, 1), (2, 4), (4, 8), (3, 2)]), st.sampled_from(["allreduce", "reduce_scatter",
       "allgather", "alltoall"]), st.integers(0, 3), st.floats(1e3, 1e9), st.booleans())
def test_a_collective_on_its_groups_runs_as_its_closed_form(cluster, kind, which, nbytes, replicate):
    """Every group shape's step program on the link engine (all groups at once) takes its closed form."""
    nodes, gpus = cluster
    sizes = sorted({s for s in (1, 2, gpus, 2 * gpus, nodes * gpus) if s <= gpus and gpus % s == 0
                    or s % gpus == 0 and (nodes * gpus) % s == 0})
    size = sizes[which % len(sizes)]
    group = replicate_group(size, gpus, nodes) if replicate else shard_group(size, gpus)
    phase = group_phase(kind, nbytes, group, nodes, gpus, LINK, INTRA)
    fabric = Fabric(nodes * gpus, LINK, gpus=gpus, intra=INTRA)
    finish = fabric.run(phase.plan, phase.nbytes, np.zeros(nodes * gpus), phase.sizes, link=phase.link)
    assert float(finish.max()) == pytest.approx(phase.analytic_s, rel=1e-9, abs=1e-12)


def test_sparsifiers_are_refused_where_they_cannot_be_summed():
    assert refusal("fsdp", "topk") and "reduce-scatter" in refusal("fsdp", "topk")
    assert refusal("fsdp", "powersgd") and refusal("zero2", "sidco-e") and refusal("zero1", "topk")
    assert refusal("hsdp", "topk") is None and refusal("fsdp", "bf16") is None and refusal("ddp", "topk") is None
    assert all(refusal(parallel, q) is None for parallel in ("fsdp", "hsdp") for q in ("int8", "fp8", "int4"))
    assert "stage 3" in refusal("zero2", "int8") and "stage 3" in refusal("zero1", "int4")
    wl = toy()
    with pytest.raises(ValueError, match="fsdp"):
        Scenario(wl, 4, 100e9, 50e-6, "topk", 0.01, topology="hierarchical", gpus_per_node=8,
                 profile=PROFILE, sharding=Sharding("fsdp"))


def test_a_quantizer_halves_the_reduce_scatter_and_a_sparsifier_the_replicate_all_reduce():
    wl = toy()

    def one(compressor, density=None):
        return simulate(Scenario(wl, 4, 100e9, 50e-6, compressor, density, topology="hierarchical", gpus_per_node=8,
                                 profile=None if compressor == "none" else PROFILE, sharding=Sharding("hsdp")))

    none, bf16, topk = one("none"), one("bf16", 1.0), one("topk", 0.01)
    rs = "reduce-scatter (gradients)"
    ar = "all-reduce (replicate, gradient shard)"
    assert bf16["collectives"][rs]["bytes_per_gpu"] == pytest.approx(none["collectives"][rs]["bytes_per_gpu"] / 2)
    assert bf16["collectives"][rs]["compressed"] and not topk["collectives"][rs]["compressed"]
    assert topk["collectives"][rs]["bytes_per_gpu"] == none["collectives"][rs]["bytes_per_gpu"]
    assert topk["collectives"][ar]["compressed"]
    assert topk["collectives"][ar]["bytes_per_gpu"] < none["collectives"][ar]["bytes_per_gpu"] / 10


def _quantized(topology: str, nodes: int, gpus: int, parallel: str = "fsdp", fidelity: str = "analytic", **kw):
    return Scenario(toy(), nodes, 100e9, 50e-6, "int8", 1.0, topology=topology, gpus_per_node=gpus, fidelity=fidelity,
                    intra_bandwidth_bps=INTRA.bandwidth_Bps * 8, intra_latency_s=INTRA.latency_s, profile=PROFILE,
                    sharding=Sharding(parallel, **kw))


@pytest.mark.parametrize("nodes, gpus", [(4, 1), (4, 8), (2, 4), (1, 8)])
def test_a_block_quantizer_reduce_scatters_as_a_quantized_all_to_all(nodes, gpus):
    """ZeRO++'s qgZ by hand, per unit of n elements over N nodes × g GPUs (p = N·g) at w bytes an
    element: quantize n; an all-to-all inside the node, (g−1)(α_i + n·w/(g·B_i)); dequantize the g
    chunks of n/g, sum, quantize n/g; an all-to-all across the nodes, (N−1)(α + n·w/(N·B)) (the NIC
    carries its g GPUs' n/g each); dequantize the N chunks of n/(g·N). A GPU sends (p−1)/p·n·w."""
    cost = PROFILE.cost("int8", 1.0)
    a, B, ai, Bi = 50e-6, 100e9 / 8, INTRA.latency_s, INTRA.bandwidth_Bps
    sc = _quantized("hierarchical" if gpus > 1 else "ring", nodes, gpus)
    plan = build(sc)
    p = nodes * gpus
    ops = [o for o in plan.ops if o.collective == QUANTIZED_REDUCE_SCATTER]
    assert len(ops) == len(units(toy())) and plan.collective == QUANTIZED_REDUCE_SCATTER
    for o, unit in zip(ops, [*reversed([u for u in units(toy()) if not u.root]), *(u for u in units(toy()) if u.root)]):
        n = unit.numel
        intra = (gpus - 1) * (ai + n * INT8_WIRE / (gpus * Bi))
        inter = (nodes - 1) * (a + n * INT8_WIRE / (nodes * B))
        middle = gpus * cost.decompress_s(n / gpus) + cost.compress_s(n / gpus) if gpus > 1 and nodes > 1 else 0.0
        last = nodes if nodes > 1 else gpus
        hand = cost.compress_s(n) + intra + middle + inter + last * cost.decompress_s(n / p)
        assert o.analytic_s == pytest.approx(hand, rel=1e-12)
        assert o.bytes_per_gpu == pytest.approx((p - 1) / p * n * INT8_WIRE, rel=1e-12)
        assert o.stream == "reduce-scatter" and o.compressed
        for phase in o.phases:  # each hop's step program on the link engine takes its closed form
            fabric = Fabric(p, LINK if phase.link is None else phase.link, gpus=gpus, intra=INTRA)
            finish = fabric.run(phase.plan, phase.nbytes, np.zeros(p), phase.sizes, link=phase.link)
            assert float(finish.max()) == pytest.approx(phase.analytic_s, rel=1e-9, abs=1e-15)
    r = simulate(sc)
    assert r["compress_total_s"] == pytest.approx(sum(o.pre_s + sum(ph.gap_s for ph in o.phases) for o in plan.ops))
    assert r["collectives"][QUANTIZED_REDUCE_SCATTER]["bytes_per_gpu"] == pytest.approx(
        (p - 1) / p * sum(u.numel for u in units(toy())) * INT8_WIRE)


@pytest.mark.parametrize("parallel", ["fsdp", "hsdp"])
def test_the_quantized_all_to_all_agrees_at_both_fidelities(parallel):
    """Same plan at both fidelities: the same bytes; des, where the streams meet on a link (the
    parameters' all-gather and the gradients' all-to-all on one NIC), never faster. Alone on its links
    each hop takes its closed form (the test above)."""
    a, d = (simulate(_quantized("hierarchical", 4, 8, parallel, fidelity)) for fidelity in ("analytic", "des"))
    assert {k: v["bytes_per_gpu"] for k, v in a["collectives"].items()} == {
        k: v["bytes_per_gpu"] for k, v in d["collectives"].items()}
    assert a["iteration_s"] * (1 - 1e-9) <= d["iteration_s"] <= 1.5 * a["iteration_s"]


def test_hsdp_gathers_a_quantized_shard_without_counts():
    """Under HSDP a block quantizer goes into the reduce-scatter (the quantized all-to-all) and its
    replicate exchange is one all-gather of every replica's codes and scales of the shard, no counts."""
    r = simulate(_quantized("hierarchical", 4, 8, "hsdp"))
    shard = sum(-(-u.numel // 8) for u in units(toy()))
    ar = r["collectives"]["all-reduce (replicate, gradient shard)"]
    assert ar["compressed"] and ar["bytes_per_gpu"] == pytest.approx(3 / 4 * 4 * INT8_WIRE * shard)
    rs = r["collectives"][QUANTIZED_REDUCE_SCATTER]
    assert rs["compressed"] and rs["bytes_per_gpu"] == pytest.approx(7 / 8 * sum(u.numel for u in units(toy()))
                                                                      * INT8_WIRE)
    assert r["collective"] == "all-reduce (replicate, gradient shard)"
    assert "reduce-scatter (gradients)" not in r["collectives"]


def test_timeline_shows_each_collective():
    sc = Scenario(toy(blocks=2), 2, 100e9, 50e-6, topology="hierarchical", gpus_per_node=4, timeline=True,
                  sharding=Sharding("hsdp"))
    names = {e["name"] for e in simulate(sc)["timeline"] if e["stream"] == "comm"}
    assert {"all-gather block 1 fwd m0", "all-gather block 0 bwd m0", "reduce-scatter root m0",
            "all-reduce block 0 m0"} <= names


def test_ddp_with_every_default_is_no_sharding():
    assert sharding() is None
    assert sharding("ddp", micro_batch=4, batch_size=8) == Sharding(micro_batch=4)
    with pytest.raises(ValueError, match="--shard-size"):
        sharding("fsdp", shard_size=4)
    with pytest.raises(ValueError, match="divide"):
        sharding("fsdp", micro_batch=3, batch_size=8)


def test_sharded_memory_is_zeros_accounting():
    psi, n = 10**9, 32
    assert sum(memory.sharded_state_bytes("zero1", psi, n).values()) == pytest.approx(4 * psi + 12 * psi / n)
    assert sum(memory.sharded_state_bytes("zero2", psi, n).values()) == pytest.approx(2 * psi + 14 * psi / n)
    assert sum(memory.sharded_state_bytes("fsdp", psi, n, 7, 5).values()) == pytest.approx(16 * psi / n + 12)
    s, b, h, layers, vocab = 4096, 2, 4096, 32, 128256
    full = memory.activation_bytes(layers, h, vocab, s, b)
    assert full == 34 * s * b * h * layers + 4 * s * b * vocab
    assert memory.activation_bytes(layers, h, vocab, s, b, True) == (2 * layers + 34) * s * b * h + 4 * s * b * vocab
    hsdp = memory.per_gpu("topk", psi, [(psi,)], "h100", parallel="hsdp", shard=8)
    assert hsdp["memory_parts_gib"]["compressor"] == pytest.approx(4 * psi / 8 / 2**30)
    assert memory.per_gpu("int8", psi, [(psi,)], "h100", parallel="hsdp", shard=8)["memory_parts_gib"][
        "compressor"] == pytest.approx(4 * psi / 8 / 2**30)  # the replicate exchange's residual on the shard
    fsdp = memory.per_gpu("int8", psi, [(psi,)], "h100", parallel="fsdp", shard=32)
    assert fsdp["memory_parts_gib"]["compressor"] == 0  # ZeRO++'s qgZ keeps no residual


DONE = ["compare", "--model", "llama-3.1-8b", "--device", "h100", "--nodes", "4", "--gpus-per-node", "8",
        "--topology", "hierarchical", "--bandwidth", "100Gbit", "--compressors", "none,bf16,powersgd,topk,sidco-e",
        "--densities", "0.01", "--batch-size", "2", "--micro-batch", "1", "--checkpointing", "--json"]


def test_compare_hsdp_rows_carry_collective_exposed_and_memory(capsys, tmp_path):
    assert main([*DONE, "--parallel", "hsdp", "--store", str(tmp_path / "r.sqlite")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["label"] for r in out["rows"]} >= {"none", "bf16", "powersgd", "topk@0.01", "sidco-e@0.01"}
    for r in out["rows"]:
        assert r["collective"] and r["collectives"][r["collective"]]["exposed_s"] >= 0
        assert r["memory_gib"] > 0 and r["fits"] is True
    assert out["refused"] == [] and "saves at most" in out["headroom"]


QUANTIZERS = [*DONE[:DONE.index("--compressors") + 1], "none,bf16,int8,fp8,int4,topk,powersgd",
              *DONE[DONE.index("--compressors") + 2:]]


def test_compare_fsdp_ranks_the_block_quantizers_and_refuses_the_rest_with_a_reason(capsys, tmp_path):
    assert main([*QUANTIZERS, "--parallel", "fsdp", "--store", str(tmp_path / "r.sqlite")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["label"] for r in out["rows"]} == {"none", "fp16", "bf16", "int8", "fp8", "int4"}
    assert sorted(r["rank"] for r in out["rows"]) == [1, 2, 3, 4, 5, 6]
    for r in out["rows"]:
        quantized = r["compressor"] in ("int8", "fp8", "int4")
        assert r["collective"] == (QUANTIZED_REDUCE_SCATTER if quantized else "reduce-scatter (gradients)")
        assert r["collectives"][r["collective"]]["exposed_s"] >= 0 and r["fits"] is True
        assert r["memory_parts_gib"]["compressor"] == 0
    assert {r["label"] for r in out["refused"]} == {"powersgd", "topk@0.01"}
    assert all("--parallel fsdp" in r["refused"] and "sparse or low-rank" in r["refused"] for r in out["refused"])
    assert main([*QUANTIZERS, "--parallel", "hsdp", "--store", str(tmp_path / "r.sqlite")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 8 and out["refused"] == []
    for r in out["rows"]:
        assert r["collective"] == "all-reduce (replicate, gradient shard)"
        assert r["collectives"][r["collective"]]["exposed_s"] >= 0


def test_compare_fsdp_refuses_the_sparsifiers_and_ranks_the_quantizers(capsys, tmp_path):
    assert main([*DONE, "--parallel", "fsdp", "--store", str(tmp_path / "r.sqlite")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["label"] for r in out["rows"]} == {"none", "fp16", "bf16"}
    assert {r["label"] for r in out["refused"]} == {"powersgd", "topk@0.01", "sidco-e@0.01"}
    assert all("fsdp" in r["refused"] for r in out["refused"])
    assert [r["rank"] for r in out["rows"]] == [1, 2, 3]


@pytest.mark.parametrize("extra, words", [(["--parallel", "hsdp", "--shard-size", "3"], "--shard-size 3"),
                                          (["--parallel", "fsdp", "--topology", "tree", "--gpus-per-node", "1"], "ring"),
                                          (["--parallel", "fsdp", "--compressor", "topk", "--density", "0.01"],
                                           "reduce-scatter"),
                                          (["--micro-batch", "3"], "--micro-batch 3"),
                                          (["--parallel", "hsdp", "--sites", "2", "--wan-bandwidth", "1Gbit",
                                            "--wan-rtt", "30ms"], "--parallel ddp only")])
def test_simulate_bad_parallel_input_is_one_line(capsys, tmp_path, extra, words):
    args = ["simulate", "--model", "llama-3.2-1b", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8",
            "--bandwidth", "100Gbit", "--batch-size", "8", "--store", str(tmp_path / "r.sqlite"), *extra]
    if "--topology" in extra:
        args.remove("--gpus-per-node")
        args.remove("8")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_hsdp_all_reduces_once_per_step_and_reduce_scatters_every_micro_batch():
    one, four = run(toy(), "hsdp"), run(toy(), "hsdp", micro_batch=1)
    ar, rs = "all-reduce (replicate, gradient shard)", "reduce-scatter (gradients)"
    assert four["collectives"][ar]["bytes_per_gpu"] == pytest.approx(one["collectives"][ar]["bytes_per_gpu"])
    assert four["collectives"][ar]["per"] == "step" and four["collectives"][rs]["per"] == "micro-batch"
    assert four["collectives"][rs]["bytes_per_gpu"] == pytest.approx(4 * one["collectives"][rs]["bytes_per_gpu"])


def test_what_would_settle_it_is_asked_under_the_same_plan():
    from pipeline.request import sharding_flags

    assert sharding_flags(None) == ""
    assert sharding_flags(Sharding("hsdp", 16, micro_batch=1, checkpointing=True)) == (
        " --parallel hsdp --shard-size 16 --micro-batch 1 --checkpointing")
    assert sharding_flags(Sharding("fsdp", param_dtype="fp8")) == " --parallel fsdp --param-dtype fp8"
