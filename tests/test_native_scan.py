"""The fused kernel against float64 torch references, on one thread and on several (the parallel
parts and their merge), for the instruction set this build targets."""

from __future__ import annotations

import math

import pytest
import torch

from compressors import native

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
