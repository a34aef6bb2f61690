"""Memory per GPU under DDP (costs.memory): the closed forms, PowerSGD's and error feedback's state
against PyTorch's own hook state after real DDP steps, and memory_gib on every compare row."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from costs import memory
from traces import llm


def test_model_states_are_twenty_bytes_a_parameter():
    """fp32 parameters 4, gradients 4, DDP's buckets 4, Adam's moments 8 (ZeRO's 16Ψ plus the buckets)."""
    assert sum(memory.model_state_bytes(1000).values()) == 20_000
    found = memory.per_gpu("none", 8_030_261_248, [], "h100")
    assert found["memory_gib"] == pytest.approx(20 * 8_030_261_248 / 2**30)
    assert found["fits"] is False and found["memory_capacity_gib"] == pytest.approx(80e9 / 2**30)
    small = memory.per_gpu("none", llm.parameter_count(llm.load("llama-3.2-1b")), [], "h100@pytorch-1.3")
    assert small["fits"] is True and memory.per_gpu("none", 10, [], "cpu")["fits"] is None


def test_error_feedback_adds_the_residual_and_casts_nothing():
    shapes = [(64, 32), (32,)]
    assert memory.compressor_bytes("fp16", 2080, shapes) == memory.compressor_bytes("none", 2080, shapes) == 0
    for name in ("topk", "sidco-e", "dgc", "randomk"):
        assert memory.compressor_bytes(name, 2080, shapes) == 4 * 2080
    assert memory.compressor_bytes("powersgd", 2080, shapes, rank=4) == 4 * 2080 + 4 * (64 + 32) * 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=4).map(tuple), max_size=6), st.integers(1, 8))
def test_powersgd_factors_never_exceed_the_tensors(shapes, rank):
    total = memory.powersgd_factor_bytes(shapes, rank)
    assert 0 <= total <= 4 * sum(int(torch.Size(s).numel()) for s in shapes if len(s) >= 2) // 2


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc1 = nn.Linear(8 * 6 * 6, 96)
        self.fc2 = nn.Linear(96, 3)  # 3 × 96 at rank 4: not worth compressing (PyTorch keeps no factors)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(torch.relu(self.conv(x)).flatten(1))))


@pytest.mark.parametrize("rank", [1, 4])
def test_powersgd_state_is_what_pytorchs_hook_keeps(rank):
    """A real DDP (one gloo rank) with PyTorch's PowerSGD hook, three steps past its warm-up: the
    residual and the warm-started P and Q it holds, in bytes, are the closed forms."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = Small()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                                            use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        for _ in range(4):
            ddp(torch.randn(2, 3, 8, 8)).sum().backward()
        held = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
        numel = sum(p.numel() for p in model.parameters())
        shapes = [tuple(p.shape) for p in model.parameters()]
        assert held(state.error_dict.values()) == memory.RESIDUAL_BYTES_PER_PARAMETER * numel
        factors = held(state.p_memory_dict.values()) + held(state.q_memory_dict.values())
        assert factors == memory.powersgd_factor_bytes(shapes, rank) > 0
        assert memory.compressor_bytes("powersgd", numel, shapes, rank) == held(state.error_dict.values()) + factors
    finally:
        dist.destroy_process_group()


def test_every_compare_row_carries_its_memory(tmp_path):
    from pipeline import project
    from pipeline.compare import compare, with_baselines
    from pipeline.request import Cluster, Request
    from results.store import Store

    request = with_baselines(Request(Cluster(2, 100e9, 50e-6, options={"gpus_per_node": 8}), model="llama-3.2-1b",
                                     device="h100", compressors=("topk",), densities=(0.01,), batch_size=1))
    with Store(tmp_path / "r.sqlite") as store:
        _, rows = compare(store, project.resolve(request))
    config = llm.load("llama-3.2-1b")
    numel = llm.parameter_count(config)
    activations = memory.activation_bytes(config.layers, config.hidden, config.vocab, 4096, 1)
    by = {r["label"]: r for r in rows}
    assert by["none"]["memory_gib"] == by["fp16"]["memory_gib"] == pytest.approx((20 * numel + activations) / 2**30)
    assert by["topk@0.01"]["memory_gib"] == pytest.approx((24 * numel + activations) / 2**30)
    assert by["none"]["activations_counted"] is True
    assert by["powersgd"]["memory_gib"] > by["topk@0.01"]["memory_gib"]
    assert all(r["fits"] is True for r in rows)
