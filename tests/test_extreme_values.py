"""Compressors at the edges of fp32's range: every finite value bf16 can hold is sent by ``bf16``;
Gaussian-k's threshold beyond the dtype's range comes back into range, so it selects the same
elements on ``g`` and on ``g·2^k`` (a power of two changes no comparison)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors

BF16_MAX = float(torch.finfo(torch.bfloat16).max)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-BF16_MAX, max_value=BF16_MAX, width=32), min_size=1, max_size=40))
def test_bf16_sends_every_value_inside_its_range(values):
    g = torch.tensor(values, dtype=torch.float32)
    message = compressors.create("bf16", density=1.0).compress(g)
    back = compressors.create("bf16", density=1.0).decompress(message)
    assert torch.equal(back, g.to(torch.bfloat16).float())  # exactly PyTorch's own cast
    assert bool(torch.isfinite(back).all())


def test_bf16_of_the_issue_and_beyond_its_range():
    back = compressors.create("bf16", density=1.0).compress(torch.tensor([3e38, -3e38]))
    assert back.values.float().tolist() == torch.tensor([3e38, -3e38]).to(torch.bfloat16).float().tolist()
    try:
        compressors.create("bf16", density=1.0).compress(torch.tensor([3.4e38, -1.0]))  # rounds to Inf in bf16
    except ValueError as exc:
        assert "beyond the range of torch.bfloat16" in str(exc)
    else:
        raise AssertionError("a value that bf16 rounds to Inf was sent")


def test_gaussiank_threshold_beyond_the_range_is_scale_invariant():
    """Uniform data on [-2, 2) at δ = 0.001: the normal fit's threshold (μ + 3.29σ ≈ 3.8) times
    2^127 is beyond fp32's largest value; it must select nothing (not clamp to the largest value,
    which made the corrections end elsewhere) and the corrections bring it back."""
    torch.manual_seed(0)
    g = torch.rand(100_000) * 4 - 2
    huge = g * 2.0 ** 127
    assert bool(torch.isfinite(huge).all())
    for density in (0.001, 0.01, 0.1):
        small = compressors.create("gaussiank", density=density).compress(g)
        large = compressors.create("gaussiank", density=density).compress(huge)
        assert torch.equal(small.indices, large.indices), density
        assert bool(torch.isfinite(large.threshold_tensor))
