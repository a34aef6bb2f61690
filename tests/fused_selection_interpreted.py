"""The selection primitive's fused backend (compressors/numerics/selection.py on the compaction
kernel of compressors/kernels/fused.py) under the Triton interpreter, against its torch path. Run by
tests/test_fused_selection.py in a child process with ``TRITON_INTERPRET=1`` (it must be set
before Triton is imported); not collected by itself (its name does not start with ``test_``)."""

from __future__ import annotations

import math

import pytest
import torch

import compressors
from compressors.kernels import fused
from measuring.samples import gradient_like
from compressors.numerics.selection import Workspace, count_above, select_above

assert fused.interpreted(), "run with TRITON_INTERPRET=1"

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, fused.BLOCK + 1, 3 * fused.BLOCK + 5]


def gradient(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=gen) * 0.01).to(dtype)


def same_selection(x: torch.Tensor, threshold: torch.Tensor | float) -> int:
    """The fused and torch paths select the same positions, magnitudes and count, both with a
    finite ``Σ|x|`` or neither, and count the same; returns the count."""
    ws = Workspace()
    fast = select_above(x, threshold, ws, total=True, backend="fused")
    slow = select_above(x, threshold, Workspace(), total=True, backend="torch")
    assert fast.backend == "fused" and slow.backend == "torch"
    assert fast.count == slow.count
    assert torch.equal(fast.indices, slow.indices) and torch.equal(fast.magnitudes, slow.magnitudes)
    assert math.isfinite(float(fast.total)) == math.isfinite(float(slow.total))
    assert count_above(x, threshold, ws, backend="fused") == (slow.count, "fused")
    return fast.count


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_the_fused_selection_is_the_torch_selection(dtype, n):
    x = gradient(n, dtype, n + 1)
    for threshold in (0.015, torch.tensor(0.015, dtype=dtype), torch.tensor(0.015, dtype=torch.float64)):
        same_selection(x, threshold)
    fast = select_above(x, 0.015, Workspace(), total=True, backend="fused")
    assert math.isclose(float(fast.total), float(x.double().abs().sum()), rel_tol=1e-5, abs_tol=1e-30)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf − inf
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_nan_and_inf_follow_the_documented_rule(dtype):
    """Strictly greater after rounding the threshold to the dtype; NaN never selected, ±Inf
    selected, ``Σ|x|`` not finite."""
    x = torch.tensor([0.5, -0.5, 0.25, 0.75, -1.0] * 1000, dtype=dtype)
    assert same_selection(x, 0.5) == 2000
    assert same_selection(x, torch.tensor(0.50001)) == 2000  # rounds to 0.5 in 16 bits, not in float32
    x = gradient(2 * fused.BLOCK + 3, dtype, 9)
    x[7], x[11], x[fused.BLOCK + 2] = math.nan, math.inf, -math.inf
    found = select_above(x, 0.0, Workspace(), total=True, backend="fused")
    assert 7 not in found.indices.tolist() and {11, fused.BLOCK + 2} <= set(found.indices.tolist())
    assert not math.isfinite(float(found.total))
    same_selection(x, 0.0)
    same_selection(x, torch.tensor(math.inf))


def test_the_fused_selection_reuses_its_buffers():
    """Steady state allocates nothing: the same workspace buffers serve every call."""
    ws = Workspace()
    x = gradient(3 * fused.BLOCK + 5, torch.float32, 4)
    select_above(x, 0.01, ws, total=True, backend="fused")
    buffers = {key: buf.data_ptr() for key, buf in ws._buffers.items()}
    select_above(x, torch.tensor(0.02), ws, total=True, backend="fused")
    assert {key: buf.data_ptr() for key, buf in ws._buffers.items()} == buffers


THRESHOLDERS = [("dgc", {"seed": 7}), ("gaussiank", {}), ("redsync", {})]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "options"), THRESHOLDERS)
def test_fused_threshold_compressors_send_what_the_torch_path_sends(name, options, dtype):
    """DGC, Gaussian-k and RedSync with ``backend="fused"`` and ``"torch"``, error feedback over
    three calls: the same messages bit for bit, and ``backend`` says which ran."""
    pair = [compressors.ErrorFeedback(compressors.create(name, 0.001, backend=b, **options)) for b in ("fused", "torch")]
    for call in range(3):
        g = gradient_like(8 * fused.BLOCK + 3, seed=20 + call).to(dtype)
        a, b = (ef.compress(g.clone()) for ef in pair)
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values), (name, dtype, call)
        assert a.threshold == b.threshold and a.fallback == b.fallback
        assert pair[0].compressor.backend == "fused" and pair[1].compressor.backend == "torch"
    assert torch.equal(pair[0].residual(), pair[1].residual())


@pytest.mark.parametrize(("name", "options"), THRESHOLDERS)
def test_fused_threshold_compressors_refuse_nan_as_the_torch_path_does(name, options):
    x = gradient(2 * fused.BLOCK, torch.float32, 5)
    x[11] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        compressors.create(name, 0.01, backend="fused", **options).compress(x)


@pytest.mark.parametrize("name", ["dgc", "gaussiank", "redsync"])
@pytest.mark.parametrize("density", [0.01, 0.001])
def test_the_fused_selection_does_the_work_it_declares(name, density, monkeypatch):
    """The drift test of tests/test_compressors_work.py on the fused path: launches (Triton kernels
    counted where fused.py launches them, torch ops by OpCounter), syncs, full passes, top-k calls
    and fresh buffers of a steady call with error feedback against
    compressors.work.work(..., backend="fused")."""
    from test_compressors_work import _check

    _check(name, 16 * fused.BLOCK, density, "fused", monkeypatch)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dgc_folds_error_feedback_into_its_first_selection(dtype, monkeypatch):
    """DGC on the fused path with error feedback: its first compaction reads the gradient and the
    residual and writes their sum (no eager addition), the residual's update is left pending
    after a call that sent exactly ``|x| ≥ thr`` and scattered after a trimmed one; messages and
    residual are the torch path's, bit for bit, over five calls."""
    folded = []
    launch = fused.launch_compact

    def watched(*args, feedback=None, **kwargs):
        folded.append(feedback is not None)
        return launch(*args, feedback=feedback, **kwargs)

    monkeypatch.setattr(fused, "launch_compact", watched)
    fast, slow = (compressors.ErrorFeedback(compressors.create("dgc", 0.001, backend=b, seed=7))
                  for b in ("fused", "torch"))
    pending = []
    for call in range(5):
        g = gradient_like(64 * fused.BLOCK + 3, seed=20 + call).to(dtype)
        folded.clear()
        a, b = fast.compress(g.clone()), slow.compress(g.clone())
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values), (dtype, call)
        assert folded[0], call  # the first compaction added the residual itself
        pending.append(bool(fast._pending))
        if call % 2:
            assert torch.equal(fast.residual(), slow.residual()), call
    assert any(pending) and not all(pending), pending
    assert torch.equal(fast.residual(), slow.residual())
