"""SIDCo's torch path is written for the GPU: one device→host transfer per stage (the stage's
statistics, the last one with the pool), at most M + 1 per call once a call of the same size has
been made, the estimators' scalar algebra on the host; the same code runs on CUDA tensors (tests
marked ``gpu``). Also range safety: huge finite gradients select what their scaled copy selects."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import compressors

SYNCING = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select",
           "unique", "numpy"}
"""Tensor operations that read device values on the host (or size an output from them); a copy to
the host is counted once, by the ``numpy`` that reads it."""


class SyncCounter(TorchFunctionMode):
    """Counts the operations that would synchronise a CUDA stream (run here on CPU tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in SYNCING:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def laplace(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.distributions.Laplace(0.0, 1.0).sample((n,)) * (1 + torch.rand(n, generator=gen))


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("stages", [1, 2, 3, "adaptive"])
def test_torch_path_reads_the_host_once_per_stage(name, stages):
    c = compressors.create(name, density=0.001, stages=stages, backend="torch")
    c.compress(laplace(50_000, 0))  # the first call of a size has no pool guess yet
    for seed in range(1, 4):
        g = laplace(50_000, seed)
        planned = c.stages
        with SyncCounter() as counter:
            s = c.compress(g)
        assert len(counter.calls) <= planned + 1 and set(counter.calls) <= {"numpy", "nonzero"}, counter.calls
        assert s.selected >= 1 and c.backend == "torch"
        assert torch.equal(s.indices, torch.nonzero(g.abs() > s.threshold).squeeze(1))


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("stages", [1, 2, "adaptive"])
def test_huge_finite_gradients_select_like_their_scaled_copy(name, backend, stages):
    torch.manual_seed(0)
    g = torch.rand(100_000) * 3e38
    scaled = g * 2.0**-128  # exact: a power of two
    big = compressors.create(name, density=0.1, backend=backend, stages=stages).compress(g)
    small = compressors.create(name, density=0.1, backend=backend, stages=stages).compress(scaled)
    assert torch.equal(big.indices, small.indices)
    assert big.threshold == pytest.approx(small.threshold * 2.0**128, rel=1e-6)
    assert 0.5 <= big.selected / 10_000 <= 2.0, big.selected  # near k = 10 000, not the 1-element fallback


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
def test_cuda_matches_cpu_torch_path(name):
    g = laplace(200_000, 1)
    cpu = compressors.create(name, density=0.001, backend="torch").compress(g)
    c = compressors.create(name, density=0.001, backend="torch")
    gpu = c.compress(g.cuda())
    assert c.backend == "cuda" and gpu.indices.device.type == "cuda"
    assert gpu.threshold == pytest.approx(cpu.threshold, rel=1e-4)
    assert abs(gpu.selected - cpu.selected) <= 0.01 * cpu.selected + 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_path_on_cuda_sends_the_eager_paths_messages(name, dtype):
    """The Triton kernels on a real GPU (blocks landing in any order, the counters alternating
    between calls, two sizes in turn) against the eager path on the same GPU, with error feedback:
    the same messages bit for bit."""
    pytest.importorskip("triton")
    pair = [compressors.ErrorFeedback(compressors.create(name, 0.001, backend=b)) for b in ("auto", "torch")]
    for call, n in enumerate([1 << 20, 1 << 20, 300_001, 1 << 20, 300_001, 1 << 20]):
        g = laplace(n, 10 + call).to(dtype).cuda()
        a, b = (ef.compress(g.clone()) for ef in pair)
        assert pair[0].compressor.backend == "fused" and pair[1].compressor.backend == "cuda"
        assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values), (name, call)
    assert torch.equal(pair[0].residual(), pair[1].residual())


@pytest.mark.gpu
def test_a_steady_fused_call_synchronises_once():
    """SIDCo-E fused at one stage, a call after one of the same size: at most one synchronising
    operation (the wait for its read's transfer; the upload of the selection copies from a
    page-locked buffer without waiting)."""
    import warnings

    pytest.importorskip("triton")
    c = compressors.create("sidco-e", density=0.001)
    g = laplace(1 << 20, 3).cuda()
    for _ in range(3):
        c.compress(g)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            c.compress(g)
        syncs = [str(r.message) for r in record if "synchroniz" in str(r.message)]
        assert c.backend == "fused" and len(syncs) <= 1, syncs
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_cuda_path_syncs_at_most_once_per_stage_and_once_more(stages):
    c = compressors.create("sidco-gp", density=0.001, stages=stages, backend="torch")
    g = laplace(1 << 20, 2).cuda()
    c.compress(g)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as record:
            c.compress(g)
        assert len(record) <= stages + 1, [str(r.message) for r in record]
    finally:
        torch.cuda.set_sync_debug_mode("default")
