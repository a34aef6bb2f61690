"""SIDCo as lean as the paper meant it: its torch path (as CUDA runs it) issues a few dozen kernels
and reads the host once per stage, selecting what the native path selects; priced by the cost
model, its compress is no dearer than Top-k's and DGC's where the declared work says so."""

from __future__ import annotations

import math

import pytest
import torch

import compressors
from compressors import work as declared
from compressors.samples import gradient_like
from opcount import OpCounter
from simulator import costmodel, devices

LAUNCHES = 60
"""Kernel launches a SIDCo compress with error feedback may issue on the torch path."""


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_torch_path_is_lean_and_selects_what_the_reference_path_selects(name, stages):
    """Launches and host reads counted op by op on the torch path (with error feedback, after
    warm-up calls on a steady stream), outputs equal to the reference path (the native kernels
    where they build, else a fresh torch-path compressor fed the same inputs) call by call, and
    the declared work matches the count."""
    n, density = 1 << 16, 0.001
    grad = gradient_like(n, seed=5)
    lean = compressors.ErrorFeedback(compressors.create(name, density, stages=stages, backend="torch"))
    reference = compressors.ErrorFeedback(compressors.create(name, density, stages=stages))
    for call in range(7):
        kept = lean.residual()
        corrected = grad + (0 if kept is None else kept)
        if call < 6:
            got = lean.compress(grad)
        else:
            with OpCounter(n) as seen:
                got = lean.compress(grad)
        want = reference.compress(grad)
        assert math.isclose(got.threshold, want.threshold, rel_tol=1e-5), call
        if got.threshold == want.threshold:
            assert torch.equal(got.indices, want.indices) and torch.equal(got.values, want.values), call
        assert torch.equal(got.indices, torch.nonzero(corrected.abs() > got.threshold).squeeze(1)), call
    planned = len(compressors.sidco.stage_probabilities(density, stages, 0.25))
    assert seen.counts["launches"] <= LAUNCHES and seen.counts["syncs"] <= planned + 1, seen.ops
    assert seen.counts["syncs"] == planned  # the pool guess held: one read per stage (the pool with stage min(M, 2))
    work = declared.work(name, n, density, stages=stages, pool=lean.compressor._guesses[n].pool)
    assert work.compress.launches == seen.counts["launches"] and work.compress.syncs == seen.counts["syncs"]


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("density", [0.01, 0.001])
def test_declared_torch_path_stays_within_the_budget(name, stages, density):
    for n in (1 << 20, 1 << 24):
        c = declared.work(name, n, density, stages=stages, backend="cuda").compress
        assert c.launches <= LAUNCHES and c.syncs <= stages + 1


@pytest.mark.parametrize("device", ["v100", "a100", "h100", "h200"])
@pytest.mark.parametrize("numel", [1 << 20, 1 << 24])
def test_modelled_sidco_e_compress_is_no_dearer_than_topk_and_dgc(device, numel):
    """Read through the cost model as it prices the devices now (launch and sync costs included):
    one-stage SIDCo-E at δ = 0.001 costs no more than Top-k or DGC."""
    gpu = devices.get(device)
    sidco = costmodel.call_seconds("sidco-e", numel, 0.001, gpu, stages=1)[0]
    for peer in ("topk", "dgc"):
        assert sidco <= costmodel.call_seconds(peer, numel, 0.001, gpu)[0], peer
