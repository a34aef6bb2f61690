"""The dense and low-rank baselines: fp16/bf16 casts and PowerSGD, and the message contract
every compressor shares (numel, selected, density, wire bytes, exchange)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
from compressors.powersgd import plan

ALL = compressors.names()


def laplace(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


@pytest.mark.parametrize("name", ALL)
def test_every_message_answers_the_same_questions(name):
    g = laplace(4_096)
    c = compressors.create(name, density=0.01)
    m = c.compress(g)
    assert m.numel == g.numel()
    assert 1 <= m.selected
    assert m.density == m.selected / m.numel
    assert sum(m.phase_bytes()) == m.wire_bytes() > 0
    assert m.exchange == compressors.exchange(name)
    out = c.decompress(m)
    assert out.shape == g.shape and out.dtype == g.dtype
    assert c.backend in ("native", "torch", "cuda")


@pytest.mark.parametrize("name", ALL)
def test_inputs_that_require_grad_are_detached(name):
    g = laplace(3_000).requires_grad_(True)
    options = {"seed": 0} if name in ("dgc", "randomk") else {}
    c = compressors.create(name, density=0.01, **options)
    restored = c.decompress(c.compress(g))
    assert not restored.requires_grad
    twin = compressors.create(name, density=0.01, **options)
    assert torch.equal(restored, twin.decompress(twin.compress(g.detach())))
    ef = compressors.ErrorFeedback(compressors.create(name, density=0.01, **options))
    ef.compress(g, key=0)
    assert not ef.residual(0).requires_grad


@pytest.mark.parametrize("name,bits", [("fp16", 11), ("bf16", 8)])
def test_dense_cast_round_trip_error_bound(name, bits):
    gen = torch.Generator().manual_seed(1)
    exponent = 14 if name == "fp16" else 100   # stay in fp16's normal range for the relative bound
    g = torch.randn(100_000, generator=gen) * torch.exp2(torch.randint(-exponent + 2, 14, (100_000,), generator=gen).float())
    c = compressors.create(name)
    m = c.compress(g)
    assert m.values.dtype == c.wire_dtype and m.wire_bytes() == 2 * g.numel() and m.selected == g.numel()
    back = c.decompress(m)
    assert back.dtype == torch.float32
    # round to nearest: half an ulp, ulp = 2^(1 - bits) relative; fp16's subnormals (|x| < 2^-14)
    # have a fixed spacing of 2^-24, so half of it absolutely
    floor = 2.0 ** -25 if name == "fp16" else 0.0
    assert torch.all((back - g).abs() <= torch.clamp(g.abs() * 2.0 ** -bits, min=floor))
    assert torch.equal(back, g.to(c.wire_dtype).float())
    fp64 = c.decompress(c.compress(g.double()))
    assert fp64.dtype == torch.float64


def test_fp16_refuses_values_beyond_its_range():
    g = torch.ones(100)
    g[3] = 1e6
    with pytest.raises(ValueError, match="range"):
        compressors.create("fp16").compress(g)
    assert compressors.create("bf16").compress(g).values[3] == 999424.0


def test_dense_cast_error_feedback_keeps_the_rounding_error():
    ef = compressors.ErrorFeedback(compressors.create("fp16"))
    g = laplace(1_000) * 1e-3
    m = ef.compress(g, key="w")
    assert torch.equal(ef.residual("w"), g - m.values.float())


def test_powersgd_plan_follows_pytorch_rule():
    blocks, rest, padded = plan([(64, 3, 3, 3), (64,), (10, 10), (100, 100)], 64 * 27 + 64 + 100 + 10_000, 4, 2.0)
    # (64, 27) at rank 4: (64 + 27)·4·2 = 728 < 1728 -> compressed; (10, 10): 160 > 100 -> rest
    assert [(b.rows, b.cols, b.rank) for b in blocks] == [(64, 27, 4), (100, 100, 4)]
    assert rest == ((64 * 27, 64), (64 * 27 + 64, 100)) and padded == 64 * 27 + 64 + 100 + 10_000
    blocks, rest, padded = plan(None, 1_000, 2, 2.0)
    assert [(b.rows, b.cols) for b in blocks] == [(32, 32)] and padded == 1_024 and not rest
    with pytest.raises(ValueError, match="shapes hold"):
        plan([(3, 3)], 10, 1, 2.0)


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_recovers_an_exactly_low_rank_matrix(rank):
    gen = torch.Generator().manual_seed(rank)
    a = torch.randn(200, rank, generator=gen) @ torch.randn(rank, 150, generator=gen)
    bias = torch.randn(200, generator=gen)
    g = torch.cat([a.flatten(), bias])
    c = compressors.create("powersgd", density=1.0, rank=rank, shapes=[(200, 150), (200,)])
    for _ in range(2):                                      # warm-up call, then the measured one
        m = c.compress(g)
    restored = c.decompress(m)
    rel = float((restored[:30_000] - a.flatten()).norm() / a.norm())
    assert rel < 1e-3
    assert torch.equal(restored[30_000:], bias)             # 1-D layers travel uncompressed
    assert m.selected == (200 + 150) * rank + 200
    assert m.phase_bytes() == (800, 200 * rank * 4, 150 * rank * 4)


def test_powersgd_error_feedback_conserves_mass():
    shapes = [(40, 30), (40,), (16, 8, 3, 3)]
    n = sum(math.prod(s) for s in shapes)
    ef = compressors.ErrorFeedback(compressors.create("powersgd", rank=2, shapes=shapes))
    total_in = torch.zeros(n, dtype=torch.float64)
    total_sent = torch.zeros(n, dtype=torch.float64)
    for step in range(8):
        g = laplace(n, seed=step).double()
        total_in += g
        m = ef.compress(g, key="bucket")
        total_sent += ef.decompress(m)
        assert torch.allclose(total_sent + ef.residual("bucket"), total_in, atol=1e-10)
    assert float(ef.residual("bucket").norm()) > 0            # rank 2 is lossy: something is kept back


def test_powersgd_warm_start_reuses_q_and_converges_to_the_top_subspace():
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(100, 100, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(80, 80, generator=gen, dtype=torch.float64))
    s = torch.tensor([10.0, 5.0] + [0.1] * 78, dtype=torch.float64)
    m = (u[:, :80] * s) @ v.T
    best = torch.linalg.matrix_norm(m - (u[:, :2] * s[:2]) @ v[:, :2].T)
    warm = compressors.create("powersgd", rank=2, shapes=[(100, 80)])
    cold = compressors.create("powersgd", rank=2, shapes=[(100, 80)], warm_start=False)
    for _ in range(6):
        warm_err = torch.linalg.matrix_norm(warm.decompress(warm.compress(m.flatten())).view(100, 80) - m)
        cold_err = torch.linalg.matrix_norm(cold.decompress(cold.compress(m.flatten())).view(100, 80) - m)
    assert float(warm_err) < 1.0001 * float(best)            # power iteration converged
    assert float(cold_err) >= float(warm_err)


def test_powersgd_zero_gradient_sends_zeros_not_nan():
    c = compressors.create("powersgd", rank=1, shapes=[(50, 40)])
    m = c.compress(torch.zeros(2_000))
    assert torch.equal(c.decompress(m), torch.zeros(2_000))


def test_powersgd_bad_options():
    for bad in ({"rank": 0}, {"rank": 1.5}, {"shapes": [("a",)]}, {"min_compression_rate": -1}, {"seed": "x"}):
        with pytest.raises(ValueError):
            compressors.create("powersgd", **bad)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), extra=st.integers(0, 30), rank=st.integers(1, 5),
       seed=st.integers(0, 1000))
def test_powersgd_any_layout_round_trips_shapes_and_rest(rows, cols, extra, rank, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(extra,), (rows, cols)]
    g = torch.randn(extra + rows * cols, generator=gen)
    c = compressors.create("powersgd", rank=rank, shapes=shapes)
    m = c.compress(g)
    out = c.decompress(m)
    assert out.shape == g.shape and bool(torch.isfinite(out).all())
    assert torch.equal(out[:extra], g[:extra])
    if not m.blocks:
        assert torch.equal(out, g)
    assert m.wire_bytes() == 4 * m.selected <= 4 * g.numel() + 4 * (rows + cols) * rank


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_the_gpu_path_is_one_cast_each_way_without_a_sync(name):
    """As PyTorch's fp16/bf16 hooks: compress is the cast, decompress the cast back; no sync
    (counted op by op), and the declared work of the ``cuda`` path says the same. The result is
    the checked path's, bit for bit."""
    from compressors import work as declared
    from opcount import OpCounter

    g = torch.randn(1 << 16, generator=torch.Generator().manual_seed(0))
    fast = compressors.create(name, check_finite=False)
    with OpCounter(g.numel()) as seen:
        message = fast.compress(g)
    out = torch.empty_like(g)
    with OpCounter(g.numel()) as back:
        fast.decompress(message, out=out)
    assert seen.counts["launches"] == back.counts["launches"] == 1 and seen.counts["syncs"] == back.counts["syncs"] == 0
    assert seen.counts["passes"] == back.counts["passes"] == 1
    work = declared.work(name, g.numel(), 1.0, backend="cuda", error_feedback=False)
    assert (work.compress.launches, work.compress.syncs, work.compress.passes) == (1, 0, 1)
    assert (work.decompress.launches, work.decompress.syncs) == (1, 0)
    checked = compressors.create(name).compress(g)
    assert torch.equal(checked.values, message.values) and torch.equal(out, checked.values.float())
    with pytest.raises(ValueError, match="check_finite"):
        compressors.create(name, check_finite="yes")


def test_the_finiteness_check_is_on_off_the_gpu_and_on_request():
    g = torch.tensor([1.0, float("nan")])
    with pytest.raises(ValueError):
        compressors.create("fp16").compress(g)  # a CPU tensor: checked by default
    assert compressors.create("fp16", check_finite=False).compress(g).values.isnan().any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_fp16_compress_issues_one_kernel_and_no_sync_by_default():
    from opcount import OpCounter

    g = torch.randn(1 << 20, device="cuda")
    fp16 = compressors.create("fp16")
    fp16.compress(g)
    with OpCounter(g.numel()) as seen:
        fp16.compress(g)
    assert seen.counts["launches"] == 1 and seen.counts["syncs"] == 0
