"""The compressors contract: names, create, Sparse fields, wire bytes, bad input, memories."""

from __future__ import annotations

import pytest
import torch

import compressors

ALL = compressors.names()
SPARSE = compressors.names("sparse")


def laplace(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def test_names_cover_the_contract():
    assert ALL == ["none", "topk", "randomk", "dgc", "gaussiank", "redsync", "sidco-e", "sidco-p", "sidco-gp",
                   "fp16", "bf16", "powersgd", "int8", "fp8", "int4"]
    assert SPARSE == ALL[:9]
    assert compressors.names("dense") == ["fp16", "bf16"] and compressors.names("lowrank") == ["powersgd"]
    assert compressors.names("quantized") == ["int8", "fp8", "int4"]
    assert [compressors.exchange(n) for n in ALL] == ["allreduce"] + ["allgather"] * 8 + ["allreduce"] * 3 + [
        "allgather"] * 3
    assert compressors.exchange("randomk", seed=0) == "allreduce"


@pytest.mark.parametrize("name", SPARSE)
def test_compress_decompress_roundtrip(name):
    g = laplace(50_000)
    c = compressors.create(name, density=0.01)
    s = c.compress(g)
    assert s.numel == g.numel()
    assert s.values.dtype == g.dtype and s.values.device == g.device
    assert s.indices.dtype in (torch.int64, torch.int32)
    assert s.values.numel() == s.indices.numel() > 0
    assert torch.equal(s.values, g[s.indices])
    dense = c.decompress(s)
    assert dense.shape == g.shape and dense.dtype == g.dtype
    assert torch.equal(dense[s.indices], s.values)
    mask = torch.ones_like(g, dtype=torch.bool)
    mask[s.indices] = False
    assert torch.count_nonzero(dense[mask]) == 0
    if name != "none":
        assert torch.equal(torch.unique(s.indices), s.indices)
        assert 0.3 < s.selected / 500 < 3.0, s.selected


def test_wire_bytes():
    g = laplace(10_000)
    assert compressors.create("none").compress(g).wire_bytes() == 40_000
    assert compressors.create("none").compress(g.half()).wire_bytes() == 20_000
    s = compressors.create("topk", density=0.01).compress(g)
    assert s.wire_bytes() == 100 * (4 + 4)
    s = compressors.create("topk", density=0.01).compress(g.half())
    assert s.wire_bytes() == 100 * (2 + 4)
    s = compressors.create("randomk", density=0.01, seed=3).compress(g)
    assert s.shared_indices and s.wire_bytes() == 100 * 4
    assert compressors.create("randomk", density=0.01).compress(g).wire_bytes() == 800


def test_topk_is_exact():
    g = laplace(20_000, seed=4)
    s = compressors.create("topk", density=0.005).compress(g)
    assert s.selected == 100
    expected = torch.topk(g.abs(), 100).indices
    assert set(s.indices.tolist()) == set(expected.tolist())
    rest = torch.ones_like(g, dtype=torch.bool)
    rest[s.indices] = False
    assert s.values.abs().min() >= g[rest].abs().max()
    assert s.threshold == pytest.approx(float(s.values.abs().min()))


def test_randomk_shared_seed_gives_identical_indices():
    a = compressors.create("randomk", density=0.01, seed=7)
    b = compressors.create("randomk", density=0.01, seed=7)
    other = compressors.create("randomk", density=0.01, seed=8)
    for step in range(3):
        ga, gb = laplace(30_000, seed=step), laplace(30_000, seed=100 + step)
        sa, sb, so = a.compress(ga), b.compress(gb), other.compress(ga)
        assert torch.equal(sa.indices, sb.indices)
        assert not torch.equal(sa.indices, so.indices)
        assert sa.selected == 300 and torch.unique(sa.indices).numel() == 300


@pytest.mark.parametrize("density", [0.0, -0.1, 1.5, float("nan"), "0.1", True])
def test_bad_density(density):
    with pytest.raises(ValueError, match="density"):
        compressors.create("sidco-e", density=density)


@pytest.mark.parametrize("name", ALL)
def test_bad_tensors(name):
    c = compressors.create(name, density=0.1)
    with pytest.raises(ValueError, match="1-D"):
        c.compress(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="floating"):
        c.compress(torch.arange(10))
    for bad, word in ((float("nan"), "NaN"), (float("inf"), "Inf"), (float("-inf"), "Inf")):
        g = laplace(1000)
        g[17] = bad
        with pytest.raises(ValueError, match=word):
            c.compress(g)


def test_unknown_name_and_option():
    with pytest.raises(ValueError, match="unknown compressor"):
        compressors.create("nope", density=0.1)
    with pytest.raises(ValueError, match="bad options"):
        compressors.create("topk", density=0.1, stages=3)
    with pytest.raises(ValueError, match="stages"):
        compressors.create("sidco-e", density=0.1, stages=0)
    with pytest.raises(ValueError, match="first_ratio"):
        compressors.create("sidco-p", density=0.1, first_ratio=1.0)


@pytest.mark.parametrize("name", ALL)
def test_error_feedback_conserves(name):
    ef = compressors.ErrorFeedback(compressors.create(name, density=0.01))
    total_in = torch.zeros(5_000, dtype=torch.float64)
    total_sent = torch.zeros(5_000, dtype=torch.float64)
    for step in range(6):
        g = laplace(5_000, seed=step)
        total_in += g.double()
        s = ef.compress(g, key="layer")
        total_sent += ef.decompress(s).double()
    assert torch.allclose(total_sent + ef.residual("layer").double(), total_in, atol=1e-5)
    assert ef.residual("other") is None


@pytest.mark.parametrize("name", ["topk", "sidco-e", "fp16", "powersgd"])
def test_a_compress_that_raises_leaves_the_residual_as_it_was(name):
    """Error feedback builds ``grad + residual`` in a spare buffer, never in the residual itself:
    a gradient that is refused (NaN) loses nothing, and the next call goes on from the residual."""
    ef = compressors.ErrorFeedback(compressors.create(name, 0.1))
    g = torch.randn(400, generator=torch.Generator().manual_seed(1))
    ef.compress(g, "k")
    before = ef.residual("k").clone()
    bad = g.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError):
        ef.compress(bad, "k")
    assert torch.equal(ef.residual("k"), before)
    sent = ef.compress(g, "k")
    assert torch.allclose(ef.compressor.decompress(sent) + ef.residual("k"), g + before, atol=1e-6)


@pytest.mark.parametrize("name", compressors.names())
def test_error_feedback_takes_an_empty_gradient(name):
    """An empty gradient (a layer with no elements) goes through error feedback call after call:
    nothing is sent and the residual stays empty."""
    ef = compressors.ErrorFeedback(compressors.create(name, 0.01))
    for _ in range(3):
        message = ef.compress(torch.empty(0), "empty")
        assert message.numel == 0 and message.wire_bytes() >= 0
    assert ef.residual("empty").numel() == 0


def test_error_feedback_keeps_keys_apart():
    ef = compressors.ErrorFeedback(compressors.create("topk", density=0.1))
    ef.compress(laplace(100, seed=1), key="a")
    ef.compress(laplace(50, seed=2), key="b")
    assert ef.residual("a").shape == (100,) and ef.residual("b").shape == (50,)


def test_dgc_memory_masks_momentum():
    mem = compressors.DGCMemory(compressors.create("dgc", density=0.01, seed=0), momentum=0.9)
    g = laplace(20_000)
    s = mem.compress(g, key=0)
    u, v = mem.state[0]["momentum"], mem.state[0]["velocity"]
    assert torch.count_nonzero(u[s.indices]) == 0 and torch.count_nonzero(v[s.indices]) == 0
    rest = torch.ones_like(g, dtype=torch.bool)
    rest[s.indices] = False
    assert torch.equal(v[rest], g[rest])
    s2 = mem.compress(g, key=0)
    unsent_twice = rest.clone()
    unsent_twice[s2.indices] = False
    # unsent twice: u = 0.9·g + g, v = g + u = 2.9·g
    assert torch.allclose(mem.state[0]["velocity"][unsent_twice], 2.9 * g[unsent_twice])
    with pytest.raises(ValueError, match="momentum"):
        compressors.DGCMemory(compressors.create("dgc", density=0.01), momentum=1.0)


@pytest.mark.parametrize("name", SPARSE)
def test_empty_and_degenerate_inputs(name):
    c = compressors.create(name, density=0.01)
    s = c.compress(torch.zeros(0))
    assert s.selected == 0 and c.decompress(s).numel() == 0
    for g in (torch.zeros(1000), torch.full((1000,), 0.5), torch.tensor([3.0])):
        s = c.compress(g)
        assert s.selected >= 1
        assert torch.equal(c.decompress(s)[s.indices], g[s.indices])
