"""The threshold compressors' fused selection (DGC, Gaussian-k and RedSync on the compaction
kernel of compressors/kernels/fused.py, through compressors.numerics.selection), checked without a
GPU: exactly against the torch path under the Triton interpreter (tests/fused_selection_interpreted.py,
in a child process: ``TRITON_INTERPRET=1`` must be set before Triton is imported)."""

from __future__ import annotations

import pytest
import torch
from interpreter import run_interpreted

import compressors
from compressors.kernels import fused, native
from measuring.samples import gradient_like


def test_the_fused_selection_matches_the_torch_path_under_the_interpreter():
    assert run_interpreted("fused_selection_interpreted.py") == 37


@pytest.mark.parametrize("name", ["dgc", "gaussiank", "redsync", "sidco-e"])
def test_the_backend_option_is_checked_in_one_place(name):
    """DGC, Gaussian-k, RedSync and SIDCo take the same ``backend`` option with the same errors
    (compressors/kernels/backends.py); "fused" on a tensor the Triton kernels do not serve (a CPU
    tensor outside the interpreter, float64) runs torch and says so."""
    with pytest.raises(ValueError, match="backend must be 'auto', 'torch' or 'fused', got 'gpu'"):
        compressors.create(name, 0.01, backend="gpu")
    c = compressors.create(name, 0.01, backend="fused")
    c.compress(gradient_like(1 << 14, seed=1))
    assert c.backend == "torch"
    c.compress(gradient_like(1 << 14, seed=1).double())
    assert c.backend == "torch"


def test_without_triton_fused_is_refused(monkeypatch):
    monkeypatch.setattr(fused, "available", lambda: False)
    for name in ("dgc", "gaussiank", "redsync", "sidco-p"):
        with pytest.raises(ValueError, match=r"backend 'fused' needs Triton: pip install '\.\[gpu\]'"):
            compressors.create(name, 0.01, backend="fused")


def test_auto_runs_the_native_or_torch_path_on_a_cpu_tensor():
    g = gradient_like(1 << 14, seed=2)
    for name in ("dgc", "gaussiank", "redsync"):
        seeded = {"seed": 3} if name == "dgc" else {}
        auto, eager = (compressors.create(name, 0.01, **seeded, **option) for option in ({}, {"backend": "torch"}))
        a, b = auto.compress(g), eager.compress(g)
        assert auto.backend == ("native" if native.usable(g) else "torch") and eager.backend == "torch"
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dgc", "gaussiank", "redsync"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_selection_on_cuda_sends_the_eager_paths_messages(name, dtype):
    """On a real GPU (blocks landing in any order, the threshold read from the device and echoed
    back with the count, DGC's error feedback folded into its first read), with error feedback
    over five calls: the messages and the residual of the eager path on the same GPU, bit for bit."""
    pytest.importorskip("triton")
    options = {"seed": 7} if name == "dgc" else {}
    fast, slow = (compressors.ErrorFeedback(compressors.create(name, 0.001, backend=b, **options))
                  for b in ("auto", "torch"))
    for call in range(5):
        g = gradient_like(1 << 20, seed=30 + call).to(dtype).cuda()
        a, b = fast.compress(g.clone()), slow.compress(g.clone())
        assert fast.compressor.backend == "fused" and slow.compressor.backend == "cuda"
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values), (name, call)
    assert torch.equal(fast.residual(), slow.residual())
