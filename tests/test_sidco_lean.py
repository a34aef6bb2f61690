"""SIDCo as lean as the paper meant it: its torch path (as CUDA runs it) issues a few dozen kernels
and reads the host once per stage, selecting what the native path selects; priced by the cost
model, its compress is no dearer than Top-k's and DGC's where the declared work says so."""

from __future__ import annotations

import math

import pytest
import torch

import compressors
from compressors.work import sidco as sidco_work
from compressors import work as declared
from measuring.samples import gradient_like
from opcount import OpCounter
from costs import costmodel, devices

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


GOAL = {"sidco-e": 1.0, "sidco-p": 1.0, "sidco-gp": 1.5}
"""Issue 21's modelled goal: SIDCo-E's and SIDCo-P's compress no dearer than the cheaper of Top-k
and DGC as they ran on a GPU then (eager torch: ``backend="cuda"``; DGC's fused selection of issue
35 is not this goal's peer), SIDCo-GP within 1.5×."""

SHORT = {("sidco-e", 2): 1.40, ("sidco-p", 2): 1.62, ("sidco-gp", 2): 2.32,
         ("sidco-e", 3): 1.47, ("sidco-p", 3): 1.70, ("sidco-gp", 3): 2.40}
"""Where the goal is out of reach, the ceiling the model holds the ratio under (as priced on
2026-12-02; the ratios are in BENCHMARKS.md). Every stage after the first adds what no reordering
of torch operations avoids: the exceedances of ``η₁`` (a quarter of the vector) are known only
after stage 1's transfer, so their count, sum (and sum of squares) take a ``hardshrink`` and two
(three) more full reads, three (four) launches and a transfer: at 2²⁴ elements on a v100 ≈ 0.37 ms
against DGC's 0.90 ms for the whole compress, at 2²⁰ ≈ 28 µs against Top-k's 0.11–0.17 ms, which
is mostly its 14 launches."""

SHORT_AT_ONE_STAGE = {("sidco-p", "v100", 1 << 24, 0.01): 1.10, ("sidco-p", "a100", 1 << 24, 0.01): 1.05,
                      ("sidco-gp", "v100", 1 << 24, 0.001): 1.75, ("sidco-gp", "v100", 1 << 24, 0.01): 1.80,
                      ("sidco-gp", "a100", 1 << 24, 0.001): 1.62, ("sidco-gp", "a100", 1 << 24, 0.01): 1.68,
                      ("sidco-gp", "h100", 1 << 24, 0.01): 1.55}
"""The one-stage cells out of reach and their ceilings: SIDCo-P's ``‖g‖₂`` is a second full read
(no torch reduction returns ``Σ|g|`` and ``Σg²`` together), 1.08× and 1.03×; SIDCo-GP's stage 1
takes the logarithms of ``max(|g|, floor)`` (three read-write passes), 1.52–1.78× on the
devices whose memory is slowest against their launch cost."""

SHORT_BY_DEFAULT = {("sidco-p", "v100", 1 << 24, 0.001): 1.02}
"""With its default options SIDCo-P adds a stage from the pool below δ = 0.002
(:func:`compressors.work.sidco.default_deepened`). A small pool's values travel with stage 1's
statistics and the stage is read on the host (:data:`compressors.work.sidco.SHIP_SLOTS`: at 2²⁰
elements, 0.90–0.93×); a pool too large to ship (2²⁴ elements: 148 k slots) costs its
``hardshrink``, three reductions and a transfer on the device, ≈ 35 µs, 1.01× on a v100."""


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("stages", [None, 1, 2, 3])
def test_modelled_sidco_compress_against_topk_and_dgc(name, stages):
    """Read through the cost model as it prices the devices now (launch and sync costs included),
    on v100, a100, h100 and h200 at 2²⁰ and 2²⁴ elements, δ = 0.001 and 0.01, with the default
    options (``None``: one planned stage, and SIDCo-P's added stage at δ = 0.001) and at fixed
    M = 1, 2, 3: SIDCo's compress over the cheaper of Top-k's and DGC's (eager) is within :data:`GOAL`
    (with one stage: SIDCo-E everywhere, SIDCo-P and SIDCo-GP but at the cells of
    :data:`SHORT_AT_ONE_STAGE` and, by default, :data:`SHORT_BY_DEFAULT`), else under the
    ceiling recorded for it."""
    planned = declared.DEFAULT_STAGES if stages is None else stages
    for device in ("v100", "a100", "h100", "h200"):
        gpu = devices.get(device)
        for numel in (1 << 20, 1 << 24):
            for density in (0.001, 0.01):
                peers = min(costmodel.call_seconds(peer, numel, density, gpu, backend="cuda")[0]
                            for peer in ("topk", "dgc"))
                ratio = costmodel.call_seconds(name, numel, density, gpu, stages=stages)[0] / peers
                cell = (name, device, numel, density)
                bound = SHORT.get((name, planned)) if planned > 1 else \
                    SHORT_AT_ONE_STAGE.get(cell, (SHORT_BY_DEFAULT if stages is None else {}).get(cell, GOAL[name]))
                assert ratio <= bound, (device, numel, density, ratio)


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("density", [0.01, 0.001])
def test_default_options_plan_one_stage_and_match_the_declared_default(name, density):
    """SIDCo with its default options (adaptive stages, count corrections, error feedback) plans
    one stage on every call, on light and heavy tails and on gradient-like data (what
    :data:`compressors.work.DEFAULT_STAGES` declares), adding stages within a call only where the
    declared default says (:func:`compressors.work.sidco.default_deepened`); on the torch path
    each call selects what the reference path selects, and its launches and host reads are those
    declared for the stages it added (where the call
    before it added as many: a small pool's values then travel with stage 1's statistics and the
    added stage is read on the host, :data:`compressors.work.sidco.SHIP_SLOTS`)."""
    n = 1 << 16
    gen = torch.Generator().manual_seed(3)
    draws = {"gaussian": lambda: torch.randn(n, generator=gen),
             "laplace": lambda: torch.distributions.Laplace(0.0, 1.0).sample((n,)),
             "student-t3": lambda: torch.randn(n, generator=gen) / torch.sqrt(
                 torch.distributions.Chi2(3.0).sample((n,)) / 3.0),
             "gradient-like": iter(gradient_like(n, seed=s) for s in range(10, 100)).__next__}
    added, checked = [], 0
    for kind, draw in draws.items():
        torch.manual_seed(3)
        c = compressors.create(name, density, backend="torch")
        lean = compressors.ErrorFeedback(c)
        reference = compressors.ErrorFeedback(compressors.create(name, density))
        before = None
        for call in range(8):
            g = draw()
            assert c.stages == 1, (kind, call)
            with OpCounter(n) as seen:
                sent = lean.compress(g)
            want = reference.compress(g)
            assert math.isclose(sent.threshold, want.threshold, rel_tol=1e-5), (kind, call)
            assert sent.stages == want.stages and (sent.threshold != want.threshold
                                                    or torch.equal(sent.indices, want.indices)), (kind, call)
            deepened = sent.stages - 1
            if kind == "gradient-like" and call >= 3:
                added.append(deepened)
                if bool(before) == bool(deepened):  # the steady state the declaration describes
                    checked += 1
                    work = declared.work(name, n, density, deepened=deepened, pool=c._guesses[n].pool).compress
                    assert (work.launches, work.syncs) == (seen.counts["launches"], seen.counts["syncs"]), seen.ops
            before = deepened
    assert checked >= 3 and max(set(added), key=added.count) == sidco_work.default_deepened(name, density), added


def test_a_profile_row_prices_the_stages_sidco_planned_and_added():
    """A profile row of a SIDCo call that added a stage within itself carries the stages it
    planned and added (``planned``, ``deepened``) beside the stages it used, and the cost model
    prices what the code did: on the torch/CUDA path one planned stage and an added read of the
    pool, not two full stages (which the used count alone would mean)."""
    from costs import device_profile as dp
    from measuring.profiling import loops_of_call
    from pipeline import profile as device_profiles

    n, density = 1 << 16, 0.001
    grads = [gradient_like(n, seed) for seed in range(10, 20)]
    loops = [loops_of_call("sidco-p", density, grads, call, torch.empty(n)) for call in (2, 7)]
    assert [(row["planned"], row["deepened"]) for row in loops] == [(1, 0), (1, 1)], loops  # below DEEPEN_BELOW
    h100 = devices.get("h100")
    row = {"compressor": "sidco-p", "density": density, "numel": 1 << 24, "compress_s": 1e-3, "decompress_s": 1e-3,
           "stages": 2, "planned": 1, "deepened": 1, "backend": "cuda"}
    profile = dp.DeviceProfile("h100", "test", (row,))
    priced = device_profiles.check_rows(profile, h100)[0]["model_compress_s"]
    want, _ = costmodel.call_seconds("sidco-p", 1 << 24, density, h100, stages=1, deepened=1, backend="cuda")
    used_only, _ = costmodel.call_seconds("sidco-p", 1 << 24, density, h100, stages=2, backend="cuda")
    assert priced == want and used_only > 1.2 * want
    older = {k: v for k, v in row.items() if k not in ("planned", "deepened")}  # rows written before: as they were
    assert device_profiles.check_rows(dp.DeviceProfile("h100", "test", (older,)), h100)[0]["model_compress_s"] == used_only
