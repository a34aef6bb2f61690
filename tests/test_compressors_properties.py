"""Property-based tests (hypothesis) over sizes, dtypes, densities and odd values, for every
compressor and both SIDCo backends. Examples are derandomized (tests/conftest.py's profile) so
CI runs are reproducible; ``HYPOTHESIS_PROFILE=explore`` and a larger ``max_examples`` search wider."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compressors
from compressors.kernels import native
from compressors.rules import keeps_count, target_count

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PROFILE = settings(max_examples=40, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])


@st.composite
def gradients(draw) -> torch.Tensor:
    """1-D gradients: random sizes and dtypes; Laplace/Gaussian bodies, zeros, constants, huge or
    tiny scales, ties, a few spikes."""
    n = draw(st.integers(1, 5000))
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["laplace", "gaussian", "zeros", "constant", "ties", "spiky"]))
    gen = np.random.default_rng(seed)
    if kind == "laplace":
        x = gen.laplace(size=n)
    elif kind == "gaussian":
        x = gen.standard_normal(n)
    elif kind == "zeros":
        x = np.zeros(n)
    elif kind == "constant":
        x = np.full(n, draw(st.sampled_from([-2.5, 1e-3, 7.0])))
    elif kind == "ties":
        x = gen.integers(-3, 4, size=n).astype(np.float64)
    else:
        x = np.zeros(n)
        x[gen.integers(0, n, size=max(1, n // 100))] = gen.standard_normal(max(1, n // 100)) * 100
    limit = {torch.float32: 1e30, torch.float16: 50.0, torch.bfloat16: 1e30}[dtype]  # stays finite
    scale = draw(st.sampled_from([1.0, 1e-6, 1e-30, limit]))
    if dtype == torch.float16 and scale < 1e-4:
        scale = 1e-4
    return torch.from_numpy(x * scale).to(dtype)


def check_selection(name: str, c: compressors.Compressor, g: torch.Tensor) -> compressors.Sparse:
    s = c.compress(g)
    assert s.numel == g.numel()
    assert s.values.dtype == g.dtype and s.values.device == g.device
    assert 1 <= s.selected <= g.numel(), "non-empty gradient, empty selection"
    assert torch.equal(s.values, g[s.indices])
    if name != "none":
        assert torch.all(s.indices[1:] > s.indices[:-1]), "indices ascending and unique"
    assert s.wire_bytes() > 0
    dense = c.decompress(s)
    assert dense.shape == g.shape and dense.dtype == g.dtype
    assert torch.equal(dense[s.indices], s.values)
    assert int(torch.count_nonzero(dense)) <= s.selected
    return s


@pytest.mark.parametrize("name", compressors.names("sparse"))
@PROFILE
@given(g=gradients(), density=st.sampled_from([1.0, 0.5, 0.1, 0.01, 0.001]))
def test_any_gradient_gives_a_valid_selection(name, g, density):
    check_selection(name, compressors.create(name, density=density), g)


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
@PROFILE
@given(g=gradients(), density=st.sampled_from([0.5, 0.1, 0.01, 0.001]), stages=st.integers(1, 4))
def test_sidco_selection_is_exactly_above_threshold(name, backend, g, density, stages):
    c = compressors.create(name, density=density, stages=stages, backend=backend)
    s = check_selection(name, c, g)
    a = g.abs().float()
    thr = s.threshold
    assert thr is not None and 1 <= s.stages <= stages
    if not s.fallback:
        assert torch.equal(torch.nonzero(a > thr).squeeze(1), s.indices), "selection is exactly {|g| > threshold}"
        assert keeps_count(s.selected, target_count(density, g.numel()), g.numel())
    else:
        # the threshold missed the count rule (nothing above it, the whole vector, far from k):
        # the exact top-k is sent, no unsent magnitude above a sent one
        k = target_count(density, g.numel())
        assert s.selected == k and thr == float(a[s.indices].min())
        rest = torch.ones_like(a, dtype=torch.bool)
        rest[s.indices] = False
        assert not rest.any() or float(a[rest].max()) <= thr


@pytest.mark.skipif(native.library() is None, reason="no C compiler for the native kernels")
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300_000), seed=st.integers(0, 10_000), density=st.sampled_from([0.1, 0.01, 0.001]),
       stages=st.integers(1, 4), name=st.sampled_from(["sidco-e", "sidco-p", "sidco-gp"]))
def test_native_and_torch_backends_agree(n, seed, density, stages, name):
    """Same statistics up to summation order (float32 blocks vs torch's sum): stage 1 agrees to
    1e-4; later stages refit on exceedance sets that may differ by an element at the boundary,
    so they agree more loosely; equal thresholds must give equal selections."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 3
    fast = compressors.create(name, density=density, stages=stages).compress(g)
    slow = compressors.create(name, density=density, stages=stages, backend="torch").compress(g)
    if stages == 1 or density >= 0.25:
        assert math.isclose(fast.threshold, slow.threshold, rel_tol=1e-4)
    else:
        assert math.isclose(fast.threshold, slow.threshold, rel_tol=2e-2)
        assert abs(fast.selected - slow.selected) <= 0.05 * slow.selected + 2
    if fast.threshold == slow.threshold and fast.stages == slow.stages:
        assert torch.equal(fast.indices, slow.indices)


@pytest.mark.parametrize("name", compressors.names())
@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 3000), position=st.integers(0, 10**6), bad=st.sampled_from(["nan", "inf", "-inf"]),
       dtype=st.sampled_from(sorted(DTYPES)))
def test_non_finite_values_always_raise(name, n, position, bad, dtype):
    g = torch.randn(n).to(DTYPES[dtype])
    g[position % n] = float(bad)
    with pytest.raises(ValueError, match="NaN|Inf"):
        compressors.create(name, density=0.1).compress(g)


@settings(max_examples=30, deadline=None)
@given(steps=st.integers(1, 6), n=st.integers(1, 2000), density=st.sampled_from([0.5, 0.05, 0.01]),
       name=st.sampled_from(compressors.names()), seed=st.integers(0, 1000))
def test_error_feedback_conservation_property(steps, n, density, name, seed):
    gen = torch.Generator().manual_seed(seed)
    ef = compressors.ErrorFeedback(compressors.create(name, density=density))
    total_in = torch.zeros(n, dtype=torch.float64)
    total_out = torch.zeros(n, dtype=torch.float64)
    for _ in range(steps):
        g = torch.randn(n, generator=gen, dtype=torch.float64)
        total_in += g
        total_out += ef.decompress(ef.compress(g, key="k"))
    assert torch.allclose(total_out + ef.residual("k"), total_in, atol=1e-9)


@pytest.mark.skipif(native.library() is None, reason="no C compiler for the native kernels")
@settings(max_examples=30, deadline=None)
@given(scales=st.lists(st.sampled_from([1.0, 0.5, 2.0, 1e-3, 10.0]), min_size=2, max_size=6),
       n=st.integers(2, 200_000), name=st.sampled_from(["sidco-e", "sidco-p"]), stages=st.integers(1, 3))
def test_speculative_first_stage_is_exact(scales, n, name, stages):
    """Both paths reuse the previous call's threshold for a pool of candidates (and take a
    correction's try below a pool of more than (1 + band)·k elements as selecting too many,
    without counting it); whatever the scale does between calls, every call must select exactly
    {|g| > threshold}, the same on both paths."""
    gen = torch.Generator().manual_seed(n)
    warm = compressors.create(name, density=0.01, stages=stages)
    torch_path = compressors.create(name, density=0.01, stages=stages, backend="torch")
    for scale in scales:
        g = torch.randn(n, generator=gen) * scale
        s = warm.compress(g)
        t = torch_path.compress(g)
        assert math.isclose(s.threshold, t.threshold, rel_tol=1e-5)
        assert torch.equal(s.indices, torch.nonzero(g.abs() > s.threshold).squeeze(1)) or s.selected == 1
        assert torch.equal(t.indices, torch.nonzero(g.abs() > t.threshold).squeeze(1)) or t.selected == 1
        if s.threshold == t.threshold:
            assert torch.equal(s.indices, t.indices)


@pytest.mark.skipif(native.library() is None, reason="no C compiler for the native kernels")
@pytest.mark.parametrize("name", ["sidco-e", "sidco-p"])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_speculative_path_on_large_tensors(name, stages):
    gen = torch.Generator().manual_seed(stages)
    warm = compressors.create(name, density=0.001, stages=stages)
    for scale in (1.0, 1.0, 0.3, 3.0, 3.0):
        g = torch.distributions.Laplace(0.0, scale).sample((300_000,))
        g = g * (1 + torch.rand(300_000, generator=gen))
        s = warm.compress(g)
        fresh = compressors.create(name, density=0.001, stages=stages, backend="torch").compress(g)
        assert s.stages == fresh.stages
        assert math.isclose(s.threshold, fresh.threshold, rel_tol=1e-4)
        assert torch.equal(s.indices, torch.nonzero(g.abs() > s.threshold).squeeze(1))
