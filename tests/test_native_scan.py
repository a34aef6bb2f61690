"""The fused kernel against float64 torch references, on one thread and on several (the parallel
parts and their merge), for the instruction set this build targets."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compressors.kernels import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler for the native kernels")


@pytest.fixture(params=[1, 2])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("n", [1, 63, 1000, 700_001])
def test_scan_matches_reference(threads, n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 2
    x[::97] = 0.0
    a = x.abs().double()
    shift, thr = float(a.median()), float(a.quantile(0.99)) if n > 1 else 0.0
    r = native.scan(x, absolute=True, shift=shift, logs=True, select=thr)
    above = a > shift
    assert r.count == int(above.sum())
    assert math.isclose(r.excess, float((a[above] - shift).sum()), rel_tol=1e-5, abs_tol=1e-9)
    assert math.isclose(r.excess_sq, float(((a[above] - shift) ** 2).sum()), rel_tol=1e-5, abs_tol=1e-9)
    positive = a > 0
    assert r.positive == int(positive.sum())
    floor = torch.finfo(torch.float32).tiny  # ln max(y, FLT_MIN) over every element
    assert math.isclose(r.total_log, float(a.clamp(min=floor).log().sum()), rel_tol=1e-6, abs_tol=1e-6)
    want = torch.nonzero(x.abs() > thr).squeeze(1)
    assert torch.equal(r.selection.indices.long(), want)
    assert torch.equal(r.selection.magnitudes, x.abs()[want])
    # a pool scan: positions carried through, plain (non-absolute) values
    pool = native.scan(r.selection.magnitudes, absolute=False, shift=thr, select=thr * 1.5,
                       positions=r.selection.indices)
    assert torch.equal(pool.selection.indices.long(), torch.nonzero(x.abs() > thr * 1.5).squeeze(1))
    assert pool.count == r.selection.indices.numel()


def test_select_above_and_stats_keep_their_contract(threads):
    x = torch.randn(600_000, generator=torch.Generator().manual_seed(1))
    a = x.abs().double()
    hits, whole = native.select_above(x, 2.0, absolute=True, with_stats=True)
    assert torch.equal(hits.indices.long(), torch.nonzero(a > 2.0).squeeze(1))
    assert math.isclose(hits.excess, float((a[a > 2] - 2).sum()), rel_tol=1e-5)
    assert math.isclose(hits.excess_sq, float(((a[a > 2] - 2) ** 2).sum()), rel_tol=1e-5)
    assert math.isclose(whole.total, float(a.sum()), rel_tol=1e-6)
    assert math.isclose(whole.total_sq, float((a * a).sum()), rel_tol=1e-6)
    plain = native.select_above(x, 2.5, absolute=False)
    assert torch.equal(plain.indices.long(), torch.nonzero(x > 2.5).squeeze(1))
    s = native.stats(x, absolute=True, logs=True)
    assert math.isclose(s.total_log, float(a.log().sum()), rel_tol=1e-6) and s.positive == x.numel()
    tail = native.stats(x, absolute=False, shift=1.0, squares=True)
    assert tail.positive == int((x > 1).sum()) and math.isclose(tail.total, float((x[x > 1] - 1).sum()), rel_tol=1e-5)


SUM_REL = 2e-5
"""Stated bound on a sum's error relative to the sum of the magnitudes of its terms: float32
partial sums (each vector lane adds at most 256 terms per chunk of 1024 elements on the scalar build, 16 on
AVX-512), float64 across."""

LOG_PER_ELEMENT = 1e-7
"""Stated bound on Σ ln's error per element (mantissa products rounded to float32, one float32
logarithm per chunk)."""


@st.composite
def scans(draw):
    """A tensor (lengths around the 16/64/1024-element blocks and chunks), one variant of the pass
    (|x| or x, shift zero or not, squares, logarithms, a selection and where it lies)."""
    n = draw(st.one_of(st.integers(0, 200), st.integers(1000, 2200), st.sampled_from([1023, 1024, 1025, 4097])))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(n, generator=gen) * torch.exp(draw(st.floats(-30.0, 30.0)) * torch.rand(n, generator=gen))
    zeros = draw(st.sampled_from([0.0, 0.1, 1.0]))
    x[torch.rand(n, generator=gen) < zeros] = 0.0
    if n and draw(st.booleans()):  # subnormals and ±0: ln counts them as FLT_MIN
        x[:: max(1, n // 7)] = draw(st.sampled_from([1e-40, -1e-42, -0.0, 1e-45]))
    absolute = draw(st.booleans())
    logs = absolute and draw(st.booleans())
    a = x.double().abs() if absolute else x.double()
    level = lambda q: float(a.quantile(q)) if n else 0.0  # noqa: E731
    shift = draw(st.sampled_from(["zero", "median", "high", "negative"]))
    shift = {"zero": 0.0, "median": level(0.5), "high": level(0.999), "negative": -1.5}[shift]
    shift = float(torch.tensor(shift, dtype=torch.float32))
    select = draw(st.sampled_from([None, "all-below", "all-above", "some", "rare", "at-shift"]))
    if select is not None:  # at the shift, the loop reuses the count's comparison
        select = {"all-below": math.inf, "all-above": -math.inf if not absolute else -1.0,
                  "some": level(0.9), "rare": level(0.995), "at-shift": shift}[select]
        select = float(torch.tensor(select, dtype=torch.float32))  # the kernel's threshold is a float32, as the shift
    return x, absolute, shift, draw(st.booleans()), logs, select


def _check(x: torch.Tensor, r: native.Scan, absolute: bool, shift: float, squares: bool, logs: bool, select):
    y = x.double().abs() if absolute else x.double()
    above = y > shift
    d = y[above] - shift
    tiny = x.numel() * 2.0**-149  # float32 underflow: at most one subnormal step per term
    assert r.count == int(above.sum())
    assert math.isclose(r.excess, float(d.sum()), rel_tol=0, abs_tol=SUM_REL * float(d.abs().sum()) + tiny)
    if squares:
        assert math.isclose(r.excess_sq, float((d * d).sum()), rel_tol=0, abs_tol=SUM_REL * float((d * d).sum()) + tiny)
    else:
        assert r.excess_sq == 0.0
    if logs:
        floor = torch.finfo(torch.float32).tiny
        assert r.positive == int((y > 0).sum())
        assert abs(r.total_log - float(y.clamp(min=floor).log().sum())) <= LOG_PER_ELEMENT * x.numel() + 1e-9
    else:
        assert r.total_log == 0.0 and r.positive == 0
    if select is None:
        assert r.selection is None
    else:
        want = torch.nonzero(y > select).squeeze(1)
        assert torch.equal(r.selection.indices.long(), want)
        assert torch.equal(r.selection.magnitudes, (x.abs() if absolute else x)[want])


@settings(max_examples=300, deadline=None)
@given(scans())
def test_every_variant_matches_float64(case):
    """Each specialised loop (|x| or x, shift 0 or not, squares or not, logarithms or not,
    selection or not) against float64 torch: counts and selections (with positions) exact, sums
    within the stated bounds; with reused buffers and carried positions too."""
    x, absolute, shift, squares, logs, select = case
    buffers = (torch.full((x.numel() + 5,), -7, dtype=torch.int32), torch.full((x.numel() + 5,), -7.0))
    r = native.scan(x, absolute=absolute, shift=shift, squares=squares, logs=logs, select=select,
                    buffers=buffers if select is not None else None)
    _check(x, r, absolute, shift, squares, logs, select)
    if select is not None:
        positions = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(x.numel())).int()
        carried = native.scan(x, absolute=absolute, shift=shift, squares=squares, logs=logs, select=select,
                              positions=positions)
        assert torch.equal(carried.selection.indices, positions[r.selection.indices.long()])


@settings(max_examples=60, deadline=None)
@given(scans(), st.sampled_from([math.nan, math.inf, -math.inf]), st.data())
def test_nan_and_inf_as_before(case, bad, data):
    """A NaN makes the sums NaN and is neither counted nor selected; ±Inf is counted, selected
    when above, and makes the sums infinite; the rest of the selection is unchanged."""
    x, absolute, shift, squares, _, select = case
    if x.numel() == 0 or not math.isfinite(shift):
        return
    x = x.clone()
    x[data.draw(st.integers(0, x.numel() - 1))] = bad
    r = native.scan(x, absolute=absolute, shift=shift, squares=squares, select=select)
    y = x.double().abs() if absolute else x.double()
    above = y > shift
    assert r.count == int(above.sum())
    reference = float((y[above] - shift).sum()) if not math.isnan(bad) else math.nan
    if math.isnan(reference):
        assert math.isnan(r.excess)
    elif math.isinf(reference):
        assert r.excess == reference
    if select is not None:
        want = torch.nonzero(y > select).squeeze(1)
        assert torch.equal(r.selection.indices.long(), want)


@pytest.mark.parametrize("absolute", [True, False])
def test_a_nan_beside_a_hit_hides_nothing(absolute):
    """A block's hit test takes the block's running maximum, which a NaN must not swallow: a
    NaN before or after a hit, in the same or another vector of its 64-element block."""
    for nan_at in (0, 5, 16, 17, 40, 63):
        for hit_at in (1, 15, 16, 33, 62):
            if nan_at == hit_at:
                continue
            x = torch.zeros(64 * 3 + 7)
            x[64 + nan_at] = math.nan
            x[64 + hit_at] = 5.0
            r = native.scan(x, absolute=absolute, shift=0.5, select=1.0)
            assert r.selection.indices.tolist() == [64 + hit_at]
            assert r.count == 1 and math.isnan(r.excess)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1e6, width=32), min_size=0, max_size=300), st.data())
def test_host_count_is_the_kernels_count(values, data):
    """``native.count_above`` (numpy on the host, what SIDCo's tries use over its pool) counts
    exactly what a count-only ``scan`` counts: strictly above the threshold as float32 sees it,
    at values of the pool itself (ties), between them, and at thresholds float32 cannot hold."""
    x = torch.tensor(values, dtype=torch.float32)
    picks = [0.0, 1e39, 3.5e38, math.nextafter(1.0, 2.0)] + values[:3]
    threshold = data.draw(st.one_of(st.sampled_from(picks), st.floats(0.0, 2e6)))
    want = int((x.double() > float(torch.tensor(threshold, dtype=torch.float32))).sum())
    assert native.count_above(x.numpy(), threshold) == want
    if values:
        assert native.count_above(x.numpy(), threshold) == native.scan(x, absolute=False, shift=threshold,
                                                                      squares=False).count
