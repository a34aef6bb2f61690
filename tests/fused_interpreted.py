"""The fused kernels (compressors/kernels/fused.py) under the Triton interpreter, against the eager torch
path. Run by tests/test_fused_kernels.py in a child process with ``TRITON_INTERPRET=1`` (it must be
set before Triton is imported); not collected by itself (its name does not start with ``test_``)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
from compressors.work import counting
from compressors.kernels import fused
from compressors.numerics import estimators
from compressors.memory import pending_residual
from measuring.samples import gradient_like
from compressors.numerics.selection import Workspace, select_above

assert fused.interpreted(), "run with TRITON_INTERPRET=1"

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, fused.BLOCK, fused.BLOCK + 1, 3 * fused.BLOCK - 5]


def gradient(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=gen) * 0.01).to(dtype)


def close(a: torch.Tensor, b: float) -> bool:
    return math.isclose(float(a), b, rel_tol=1e-5, abs_tol=1e-30)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_statistics_match_the_eager_path(dtype, n, with_residual):
    g = gradient(n, dtype, 1)
    r = gradient(n, dtype, 2) if with_residual else None
    s = fused.statistics(g, r)
    x = g if r is None else g + r  # the eager error feedback: in the gradient's dtype
    assert torch.equal(s.x, x)
    wide = x.double()
    assert close(s.abs_sum, float(wide.abs().sum()))
    assert close(s.square_sum, float((wide * wide).sum()))
    assert float(s.abs_max) == (float(wide.abs().max()) if n else 0.0)
    assert float(s.nonzero) == float(torch.count_nonzero(x))
    assert close(s.log_sum, float(wide.abs().clamp(min=estimators.LOG_FLOOR).log().sum()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_compaction_selects_what_the_eager_path_selects(dtype, n):
    x = gradient(n, dtype, 3)
    threshold = 0.02
    found = fused.compact(x, threshold)
    eager = select_above(x, threshold, Workspace(), backend="torch")
    assert found.count == eager.count
    assert torch.equal(found.indices, eager.indices)
    assert torch.equal(found.values, x.index_select(0, eager.indices))
    t = float(torch.tensor(threshold, dtype=dtype))
    excess = x.index_select(0, eager.indices).double().abs() - t
    assert close(found.excess_sum, float(excess.sum()))
    assert close(found.excess_square_sum, float((excess * excess).sum()))


def test_the_tie_rule_is_strictly_greater_after_rounding_to_the_dtype():
    x = torch.tensor([0.5, -0.5, 0.25, 0.75, -1.0] * 1000, dtype=torch.float16)
    found = fused.compact(x, 0.5)
    assert found.count == 2000 and set(found.values.abs().tolist()) == {0.75, 1.0}
    # 0.50001 rounds to 0.5 in float16: the same selection
    assert torch.equal(fused.compact(x, 0.50001).indices, found.indices)


def test_nan_and_inf_show_in_the_statistics_and_are_never_selected():
    """The documented rule: a non-finite Σ|x| is what the caller raises ValueError on; NaN fails
    every comparison (as torch.gt), Inf exceeds every finite threshold."""
    x = torch.randn(2 * fused.BLOCK)
    x[7] = math.nan
    assert not math.isfinite(float(fused.statistics(x).abs_sum))
    assert 7 not in fused.compact(x, 0.0).indices.tolist()
    x[7] = math.inf
    assert float(fused.statistics(x).abs_sum) == math.inf
    assert 7 in fused.compact(x, 1e30).indices.tolist()


def test_error_feedback_over_several_calls_matches_the_eager_loop():
    """x = g + residual; send |x| > t; the residual keeps what was not sent: three calls fused
    and eager give the same messages and residuals, bit for bit."""
    fused_r = torch.zeros(2 * fused.BLOCK + 9)
    eager_r = fused_r.clone()
    for call in range(3):
        g = gradient(fused_r.numel(), torch.float32, 10 + call)
        x = fused.statistics(g, fused_r).x
        sent = fused.compact(x, 0.015)
        fused_r = x.index_fill(0, sent.indices, 0.0)
        ex = g + eager_r
        chosen = select_above(ex, 0.015, Workspace(), backend="torch")
        eager_r = ex.index_fill(0, chosen.indices, 0.0)
        assert torch.equal(sent.indices, chosen.indices) and torch.equal(fused_r, eager_r)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(0, 3 * fused.BLOCK), seed=st.integers(0, 1000), threshold=st.floats(0.0, 0.05),
       dtype=st.sampled_from(DTYPES))
def test_any_gradient_compacts_as_the_eager_path(n, seed, threshold, dtype):
    x = gradient(n, dtype, seed)
    found = fused.compact(x, threshold)
    eager = select_above(x, threshold, Workspace(), backend="torch")
    assert found.count == eager.count and torch.equal(found.indices, eager.indices)


@pytest.mark.parametrize("dtype", DTYPES)
def test_statistics_read_a_pending_residual_as_the_eager_residual(dtype):
    """The lazy residual: the kernel zeroes ``|r| > η`` as it reads ``r`` (ties stay, NaN stays),
    which is compressors.memory.pending_residual, bit for bit."""
    n = 2 * fused.BLOCK + 7
    g, r = gradient(n, dtype, 6), gradient(n, dtype, 7)
    eta = float(torch.tensor(0.012, dtype=dtype))
    r[5], r[6], r[8] = eta, -eta, math.nan
    x = fused.statistics(g, r, pending=eta).x
    assert torch.equal(x[:8], (g + pending_residual(r.clone(), eta))[:8])
    assert torch.equal(x[9:], (g + pending_residual(r.clone(), eta))[9:]) and math.isnan(float(x[8]))
    assert torch.equal(fused.statistics(g, r).x[9:], (g + r)[9:])  # none pending: the residual as it is


def test_the_lazy_residual_is_the_eager_residual_wherever_it_is_read():
    """Fused SIDCo leaves each call's residual update pending; every read of the residual from
    outside (residual(), the state dict), a switch to the eager path and back, and a new size see
    the eager residual bit for bit, and the messages stay the eager path's."""
    fast = compressors.ErrorFeedback(compressors.create("sidco-e", 0.001, backend="fused"))
    slow = compressors.ErrorFeedback(compressors.create("sidco-e", 0.001, backend="torch"))
    n = 8 * fused.BLOCK + 3
    plan = ["fused", "fused", "torch", "fused", "fused", "size", "fused"]
    for call, step in enumerate(plan):
        fast.compressor.backend_choice = "torch" if step == "torch" else "fused"
        g = gradient_like(n // 2 if step == "size" else n, seed=60 + call)
        a, b = fast.compress(g.clone()), slow.compress(g.clone())
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values), (call, step)
        assert fast.compressor.backend == ("torch" if step == "torch" else "fused")
        if call % 2:
            assert torch.equal(fast.residual(), slow.residual()), call
        else:
            assert torch.equal(fast.state[None]["residual"], slow.state[None]["residual"]), call


def test_a_nan_in_a_bfloat16_error_feedback_stays_nan():
    g = gradient(fused.BLOCK, torch.bfloat16, 4)
    r = torch.zeros_like(g)
    r[3] = math.nan
    x = fused.statistics(g, r).x
    assert math.isnan(float(x[3])) and torch.equal(x[4:], (g + r)[4:])


SIDCOS = ["sidco-e", "sidco-p", "sidco-gp"]


def inputs(kind: str, n: int, dtype: torch.dtype, call: int) -> torch.Tensor:
    """Gradient-like and adversarial inputs of ``n`` elements for call ``call``."""
    if kind == "gradient":
        return gradient_like(n, seed=20 + call).to(dtype)
    if kind == "constant":
        return torch.full((n,), 0.01, dtype=dtype)
    x = gradient(n, dtype, 30 + call)
    x[n // 3] = 1e4 if dtype == torch.float16 else 1e30  # float32's Σx² overflows: the eager path decides
    return x


def same_messages(name: str, kind: str, dtype: torch.dtype, n: int = 8 * fused.BLOCK + 3, calls: int = 3,
                  **options) -> list[str]:
    """Three calls with error feedback, fused and eager, give the same messages bit for bit;
    returns the backends the fused compressor reported."""
    pair = [compressors.ErrorFeedback(compressors.create(name, 0.001, backend=b, **options)) for b in ("fused", "torch")]
    backends = []
    for call in range(calls):
        g = inputs(kind, n, dtype, call)
        a, b = (ef.compress(g.clone()) for ef in pair)
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values), (name, kind, dtype, call)
        assert a.threshold == b.threshold and a.fallback == b.fallback and a.stages == b.stages
        backends.append(pair[0].compressor.backend)
    assert torch.equal(pair[0].residual(), pair[1].residual())
    return backends


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", SIDCOS)
def test_fused_sidco_selects_what_the_eager_path_selects(name, dtype):
    assert same_messages(name, "gradient", dtype) == ["fused"] * 3


@pytest.mark.parametrize("name", SIDCOS)
def test_fused_sidco_at_fixed_stages_selects_what_the_eager_path_selects(name):
    assert same_messages(name, "gradient", torch.float32, stages=3) == ["fused"] * 3


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's float32 Σx²
@pytest.mark.parametrize("kind", ["constant", "outlier"])
@pytest.mark.parametrize("name", SIDCOS)
def test_fused_sidco_on_adversarial_inputs_selects_what_the_eager_path_selects(name, kind):
    same_messages(name, kind, torch.float32, calls=2)
    same_messages(name, kind, torch.float16, calls=1)


@pytest.mark.parametrize("name", SIDCOS)
def test_fused_sidco_refuses_nan_as_the_eager_path_does(name):
    x = gradient(2 * fused.BLOCK, torch.float32, 5)
    x[11] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        compressors.create(name, 0.01, backend="fused").compress(x)


def test_fused_kernel_launches_are_counted():
    """One Triton kernel (the statistics, with the pool's compaction in the same read), one
    transfer to the host and one copy back (the selection's positions and values) per steady call
    of one stage: the project's op recorder sees each launch where fused.py launches it."""
    c = compressors.create("sidco-e", 0.001, backend="fused")
    g = gradient_like(8 * fused.BLOCK, seed=3)
    c.compress(g)
    _, ops = counting.record_ops(lambda: c.compress(g))
    assert [op for op in ops if op.startswith("fused.")] == ["fused.statistics"]
    assert "index_select" not in ops and "zero_" not in ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_the_statistics_kernel_compacts_the_pool_as_the_compaction_does(dtype, n):
    """The pool taken in the statistics kernel's own read (a level known beforehand) is what the
    compaction kernel and the eager path select there, with error feedback's sum too."""
    g, r = gradient(n, dtype, 8), gradient(n, dtype, 9)
    s = fused.statistics(g, r, pool_at=0.02)
    eager = select_above(g + r, 0.02, Workspace(), backend="torch")
    assert s.pool.count == eager.count and torch.equal(s.pool.indices, eager.indices)
    assert torch.equal(s.pool.values, (g + r).index_select(0, eager.indices))
    alone = fused.compact(s.x, 0.02)
    assert close(s.pool.excess_sum, float(alone.excess_sum)) and close(s.abs_sum, float((g + r).double().abs().sum()))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(0, 3 * fused.BLOCK), seed=st.integers(0, 1000), level=st.floats(0.0, 0.05),
       dtype=st.sampled_from(DTYPES), pending=st.sampled_from([math.inf, 0.01]))
def test_any_gradient_pools_in_the_statistics_read_as_the_eager_path_selects(n, seed, level, dtype, pending):
    g, r = gradient(n, dtype, seed), gradient(n, dtype, seed + 1)
    s = fused.statistics(g, r, pending=float(torch.tensor(pending, dtype=dtype)), pool_at=level)
    x = g + pending_residual(r.clone(), float(torch.tensor(pending, dtype=dtype)))
    eager = select_above(x, level, Workspace(), backend="torch")
    assert torch.equal(s.x, x) and s.pool.count == eager.count and torch.equal(s.pool.indices, eager.indices)


@pytest.mark.parametrize("name", SIDCOS)
def test_a_pool_larger_than_its_read_has_the_rest_read_after_it(name, monkeypatch):
    """The one transfer brings back only the first slots the last call's pool suggests
    (compressors.work.sidco.pool_fetch); a pool that filled more is read to its end by a second
    transfer, and the messages stay the eager path's. Here every call reads one slot first."""
    import compressors.sidco as sidco_module
    from compressors.kernels import sidco_fused

    reads = []
    to_host = sidco_fused._to_host

    def counted(buffer):
        reads.append(buffer.numel())
        return to_host(buffer)

    monkeypatch.setattr(sidco_module, "pool_fetch", lambda n, pool, k: 1)
    monkeypatch.setattr(sidco_fused, "_to_host", counted)
    assert same_messages(name, "gradient", torch.float32) == ["fused"] * 3
    fast, slow = (compressors.create(name, 0.001, backend=b) for b in ("fused", "torch"))
    n = 8 * fused.BLOCK
    for c in (fast, slow):
        c.compress(gradient_like(n, seed=1))
    reads.clear()
    g = gradient_like(n, seed=2)
    a, b = fast.compress(g), slow.compress(g)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values)
    assert len(reads) >= 2 and reads[1] > 8  # the steady call's read (one slot), then the rest of its pool
    if name == "sidco-e":
        assert len(reads) == 2


def test_the_counters_need_no_zeroing_launch_across_calls_sizes_and_a_grown_buffer():
    """Each call adds to the pair of counters the call before zeroed; calls of two sizes in turn,
    a pool that outgrows its slots (the read buffer grows: both pairs zeroed once) and stages > 1
    (a second read of the call) keep the eager path's messages."""
    fast = compressors.create("sidco-e", 0.001, backend="fused")
    slow = compressors.create("sidco-e", 0.001, backend="torch")
    for call, n in enumerate([8 * fused.BLOCK + 3, 3 * fused.BLOCK, 8 * fused.BLOCK + 3, 3 * fused.BLOCK, 16 * fused.BLOCK]):
        g = gradient_like(n, seed=70 + call)
        if call == 2:
            g[: 2 * fused.BLOCK] *= 40  # many more above the pool's guess than its slots hold
        a, b = fast.compress(g), slow.compress(g)
        assert torch.equal(a.indices, b.indices) and fast.backend == "fused", call
    deep = [compressors.create("sidco-e", 0.001, stages=3, backend=b) for b in ("fused", "torch")]
    for call in range(3):
        g = gradient_like(8 * fused.BLOCK, seed=80 + call)
        assert torch.equal(deep[0].compress(g).indices, deep[1].compress(g).indices), call


@pytest.mark.parametrize("name", SIDCOS)
def test_the_fused_path_does_the_work_it_declares(name, monkeypatch):
    """Launches (Triton kernels counted where fused.py launches them, torch ops by OpCounter),
    syncs and full passes of a steady call with error feedback against
    compressors.work.work(..., backend="fused") (the drift test of tests/test_compressors_work.py)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from compressors import work as declared
    from opcount import OpCounter

    n = 16 * fused.BLOCK
    kernels = []
    launch = fused._launch

    def counted(kernel, grid, *args, **meta):
        kernels.append(kernel)
        with _disable_current_modes():  # the interpreter's own tensor traffic is no work of the call
            return launch(kernel, grid, *args, **meta)

    c = compressors.create(name, 0.001, backend="fused")
    ef = compressors.ErrorFeedback(c)
    for call in range(3):
        ef.compress(gradient_like(n, seed=40 + call))
    guess = c._guesses[n]
    monkeypatch.setattr(fused, "_launch", counted)
    g = gradient_like(n, seed=50)
    with OpCounter(n) as seen:
        ef.compress(g)
    assert c.backend == "fused"
    work = declared.work(name, n, 0.001, stages=c.last.planned, backend="fused", pool=guess.pool).compress
    host_only = seen.ops.count("lift_fresh")  # the selected positions wrapped from numpy: no kernel
    assert work.launches == seen.counts["launches"] - host_only + len(kernels)
    assert work.syncs == seen.counts["syncs"]
    assert work.passes == seen.counts["passes"] + len(kernels)
