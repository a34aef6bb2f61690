"""The wire format and the all-reduce rule: one definition (compressors.messages.wire) that the
compressors' byte counts, the DDP hook's buffers and the simulator's charges all follow."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
import compressors.ddp
from compressors.messages import wire
from compressors.work import REGISTRY
from compressors.ddp.exchange import index_dtype_for, pack
from simulator import CompressionCost, CompressionProfile, Layer, Scenario, Workload, simulate
from simulator.collectives import collective_time
from simulator.iteration import prepare

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def test_sizes_are_what_the_hook_puts_in_its_tensors():
    # the count all-gathered in phase 1 is one int64 per rank
    assert wire.COUNT_BYTES == torch.empty(1, dtype=torch.int64).element_size() == 8
    for dtype in DTYPES:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        assert wire.index_bytes(itemsize) == torch.empty(0, dtype=index_dtype_for(dtype)).element_size()
    assert [wire.index_bytes(n) for n in (2, 4, 8)] == [4, 4, 8]
    assert wire.sparse_bytes(100, 4) == 800 and wire.sparse_bytes(100, 2) == 600 and wire.sparse_bytes(100, 8) == 1600


@settings(max_examples=60, deadline=None)
@given(count=st.integers(0, 300), extra=st.integers(0, 50), dtype=st.sampled_from(DTYPES))
def test_packed_buffer_length_is_the_wire_formula(count, extra, dtype):
    padded = count + extra
    values = torch.ones(count, dtype=dtype)
    indices = torch.arange(count, dtype=torch.int64)
    buffer = pack(values, indices, padded)
    itemsize = buffer.element_size()
    assert buffer.numel() == wire.packed_slots(padded, itemsize)
    assert wire.allgather_bytes(padded, itemsize) == wire.COUNT_BYTES + buffer.numel() * itemsize
    # the closed form: indices, then values rounded up to whole index slots
    idx = wire.index_bytes(itemsize)
    ratio = idx // itemsize
    assert buffer.numel() * itemsize == padded * idx + -(-padded // ratio) * ratio * itemsize


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_wire_bytes_follow_the_format(dtype):
    g = torch.randn(10_000, dtype=dtype)
    s = compressors.create("topk", density=0.01).compress(g)
    assert s.wire_bytes() == wire.sparse_bytes(100, g.element_size())
    shared = compressors.create("randomk", density=0.01, seed=1).compress(g)
    assert shared.wire_bytes() == 100 * g.element_size()


def test_one_rule_for_which_compressors_all_reduce():
    assert wire.collective("none") == "allreduce"
    assert wire.collective("randomk") == "allgather"
    assert wire.collective("randomk", {"seed": None}) == "allgather"
    assert wire.collective("randomk", {"seed": 0}) == "allreduce"
    for name in compressors.names():
        if name not in ("none", "randomk"):
            # identical layouts (dense casts, low-rank factors) are summed by the network; the rest gathered
            expected = "allreduce" if compressors.message_kind(name) in ("dense", "lowrank") else "allgather"
            assert wire.collective(name) == wire.collective(name, {"seed": 0}) == expected, name
            assert compressors.exchange(name) == expected, name
    assert {n for n in compressors.names() if compressors.message_kind(n) in ("dense", "lowrank")} | {"none"} == {
        c.name for c in REGISTRY if c.collective == "allreduce"}
    # the hook follows it
    for name, options, shared in (("randomk", {}, False), ("randomk", {"seed": 3}, True), ("topk", {}, False)):
        state, _ = compressors.ddp.comm_hook(name, 0.01, **options)
        assert state.shared_indices is shared
    assert wire.allreduce_bytes("none", 1000, None, 4) == 4000
    assert wire.allreduce_bytes("randomk", 1000, 0.01, 4, {"seed": 0}) == (10 + 1) * 4
    assert wire.allreduce_bytes("randomk", 1000, 0.01, 4) is None
    assert wire.allreduce_bytes("topk", 1000, 0.01, 4) is None
    assert wire.allreduce_bytes("fp16", 1000, None, 4) == wire.allreduce_bytes("bf16", 1000, None, 4) == 2000


BW = 8e9  # bits/s: one byte per ns
LAT = 1e-5


def _scenario(options: dict, wire_per_element=(0.08, 0.08)) -> Scenario:
    wl = Workload((Layer("a", 4_000_000, 0.0),), 0.0, 0.0, 1)
    profile = CompressionProfile({("randomk", 0.01): CompressionCost(0.0, 0.0, 0.0, 0.0, wire_per_element)}, "test")
    return Scenario(wl, 4, BW, LAT, "randomk", 0.01, profile=profile, bucket_mode="single",
                    compressor_options=options)


def test_simulator_sends_randomk_by_the_rule():
    """Random-k without a shared seed all-gathers values + indices (count phase of 8 bytes, then
    the padded payload); with one it all-reduces k values and the flag, as the hook does."""
    numel = 1_000_000
    gather = prepare(_scenario({}))
    assert gather.op_name == "all-gather"
    payload = 0.08 * numel
    expected = collective_time("allgather", wire.COUNT_BYTES, 4, BW, LAT, "ring", "analytic") + collective_time(
        "allgather", payload, 4, BW, LAT, "ring", "analytic")
    assert sum(phase.analytic_s for phase in gather.phases[0]) == pytest.approx(expected, rel=1e-12)
    reduce = prepare(_scenario({"seed": 0}))
    assert reduce.op_name == "all-reduce (values)"
    k = round(0.01 * numel)
    assert np.all(reduce.wire_bytes[0] == (k + 1) * 4)
    (phase,) = reduce.phases[0]
    assert phase.analytic_s == pytest.approx(collective_time("allreduce", (k + 1) * 4, 4, BW, LAT, "ring", "analytic"))
    for fidelity in ("analytic", "des"):
        assert simulate(replace(_scenario({"seed": 0}), fidelity=fidelity))["wire_bytes"] == pytest.approx((k + 1) * 4)


def test_a_quantized_message_is_gathered_without_counts():
    """The hook gathers a block-quantized message in one all-gather (its size is set by the bucket),
    the selections in the padded two-phase one: the simulator charges the counts by the same rule."""
    from compressors.ddp.exchange import PaddedAllGather, QuantizedAllGather
    from compressors.ddp.hooks import _exchange_for

    for name in compressors.names():
        if wire.collective(name) == "allgather":
            exchange = _exchange_for(name, 0.01, {}, "single")
            assert isinstance(exchange, PaddedAllGather if wire.counts_first(name) else QuantizedAllGather), name
    assert not wire.counts_first("int8") and not wire.counts_first("int4") and wire.counts_first("topk")
    numel, per = 4_000_000, 1 + 4 / 256
    profile = CompressionProfile({("int8", 1.0): CompressionCost(0.0, 0.0, 0.0, 0.0, (per,))}, "test")
    wl = Workload((Layer("a", 4 * numel, 0.0),), 0.0, 0.0, 1)
    sc = Scenario(wl, 4, BW, LAT, "int8", 1.0, profile=profile, bucket_mode="single")
    (phase,) = prepare(sc).phases[0]
    assert phase.analytic_s == pytest.approx(collective_time("allgather", per * numel, 4, BW, LAT, "ring", "analytic"))
    for fidelity in ("analytic", "des"):
        assert simulate(replace(sc, fidelity=fidelity))["comm_s"] == pytest.approx(phase.analytic_s, rel=1e-9)
