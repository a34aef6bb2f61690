"""The declared work of every compressor (its class's ``work``, in compressors/<module>_work.py)
against what its code does, counted op by op on the torch path and kernel by kernel on the
native path."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import compressors
from compressors.work import counting
from compressors.kernels import native
from compressors.work import sidco as sidco_work
from compressors import work as declared
from measuring.samples import gradient_like
from opcount import OpCounter

SIZES = (1 << 16, 1 << 18)
DENSITIES = (0.01, 0.001)


def _observe(name: str, n: int, density: float, backend: str, monkeypatch, options=None):
    if backend == "torch":  # the torch path everywhere, as on a GPU or without the C kernels
        monkeypatch.setattr(native, "usable", lambda x: False)
    grad = gradient_like(n, seed=3)
    opts = {"backend": "torch"} if name.startswith("sidco") and backend == "torch" else {}
    if backend == "fused":  # the Triton kernels (under the interpreter: tests/fused_selection_interpreted.py)
        opts = {"backend": "fused"}
    comp = compressors.create(name, density, **opts, **(options or {}))
    ef = compressors.ErrorFeedback(comp)
    for _ in range(6):
        comp.decompress(ef.compress(grad.clone()))
    kernels = []
    planned = comp.stages if name.startswith("sidco") else None
    guess = getattr(comp, "_guesses", {}).get(n)  # SIDCo's torch path sizes its pool from the last call's
    host_counts = []  # SIDCo's counts over its pool on the host (numpy, no kernel)
    if backend == "native":
        scan, count = native.scan, native.count_above

        def counted_scan(x, **kw):
            kernels.append(x.numel())
            return scan(x, **kw)

        def counted_count(x, threshold):
            host_counts.append(x.size)
            return count(x, threshold)

        monkeypatch.setattr(native, "scan", counted_scan)
        monkeypatch.setattr(native, "count_above", counted_count)
    launched = []  # Triton kernels, counted where compressors/kernels/fused.py launches them (no torch dispatch)
    if backend == "fused":
        from torch.utils._python_dispatch import _disable_current_modes

        from compressors.kernels import fused
        launch = fused._launch

        def counted_launch(kernel, grid, *args, **meta):
            launched.append(f"{counting.FUSED_MARKER}{kernel}")
            with _disable_current_modes():  # the interpreter's own tensor traffic is no work of the call
                return launch(kernel, grid, *args, **meta)

        monkeypatch.setattr(fused, "_launch", counted_launch)
    with OpCounter(n) as seen:
        sparse = ef.compress(grad)
    if backend == "fused":
        assert comp.backend == "fused", comp.backend
    out = torch.empty_like(grad)  # decompress into a kept buffer, as replays, profiles and hooks do
    with OpCounter(n) as seen_decompress:
        comp.decompress(sparse, out=out)
    counts = dict(seen.counts, fresh=sum(seen.fresh))
    dcounts = dict(seen_decompress.counts, fresh=sum(seen_decompress.fresh))
    counts["passes"] += sum(1 for size in kernels if size >= n) + len(launched)
    counts["launches"] += len(launched)
    # a native kernel is a launch; SIDCo's also carry the host work of its stage loop around them
    counts["launches"] += len(kernels) * (1 + sidco_work.NATIVE_HOST_LAUNCHES if name.startswith("sidco") else 1)
    counts["launches"] += len(host_counts)  # each one launch of host time
    full_native = sum(1 for size in kernels if size >= n)
    loops = counting.loop_counts(name, seen.ops + launched)
    rounds = loops.pop("rounds", None)
    if backend == "native":  # loops counted by their kernels: SIDCo's full passes, the others' selections
        rounds = full_native if name.startswith("sidco") else full_native - 1
    stages = planned if backend == "torch" else getattr(sparse, "stages", None)
    if backend == "native" and name.startswith("sidco"):  # the count at the last threshold, then one per step
        assert host_counts, "SIDCo's native path counts its last threshold on the host"
        loops["steps"] = len(host_counts) - 1
    if backend == "torch" and guess is not None:
        loops["pool"] = guess.pool
    return counts, dcounts, stages, rounds, loops


def _check(name, n, density, backend, monkeypatch, options=None):
    counts, dcounts, stages, rounds, extra = _observe(name, n, density, backend, monkeypatch, options)
    if options and "adapt" in options:
        extra["adapt"] = options["adapt"]
    work = declared.work(name, n, density, stages=stages, rounds=rounds, backend=backend, **extra)
    for what, got, decl in (("compress", counts, work.compress), ("decompress", dcounts, work.decompress)):
        assert decl.passes == got["passes"], f"{what}: declared {decl.passes} full passes, code makes {got['passes']}"
        assert decl.syncs == got["syncs"], f"{what}: declared {decl.syncs} syncs, code makes {got['syncs']}"
        assert len(decl.topk) == got["topk"], f"{what}: top-k calls"
        fresh = sum(size for size in decl.allocations if size >= n)
        assert fresh == pytest.approx(got["fresh"], rel=0.01), f"{what}: bytes of fresh full-size buffers"
        assert decl.launches == pytest.approx(got["launches"], rel=0.1), f"{what}: launches"
        if backend == "torch":
            assert decl.bytes_read + decl.bytes_written == pytest.approx(got["bytes"], rel=0.05), f"{what}: bytes"


@pytest.mark.parametrize("name", [n for n in compressors.names()])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("density", DENSITIES)
def test_declared_work_matches_the_torch_path(name: str, n: int, density: float, monkeypatch) -> None:
    _check(name, n, density, "torch", monkeypatch)


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("options", [{"stages": 2}, {"stages": 3}, {"adapt": "paper", "stages": 2}])
def test_declared_work_matches_sidco_torch_path_at_every_stage_count(name: str, options: dict, monkeypatch) -> None:
    _check(name, 1 << 16, 0.001, "torch", monkeypatch, options)


@pytest.mark.skipif(not native.library(), reason="no C compiler for the native kernels")
@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp", "topk", "dgc", "gaussiank", "redsync"])
@pytest.mark.parametrize("density", DENSITIES)
def test_declared_work_matches_the_native_path(name: str, density: float, monkeypatch) -> None:
    _check(name, 1 << 18, density, "native", monkeypatch)


@pytest.mark.parametrize("name", ["powersgd", "fp16", "int8", "fp8", "int4"])
def test_declared_work_matches_a_vector_that_is_no_square(name: str, monkeypatch) -> None:
    """PowerSGD zero-pads such a vector to the next square (a fresh buffer and a copy each way);
    the quantizers pad it to whole blocks (the tail zeroed), and int4 packs its odd length's last
    code beside a zero."""
    _check(name, (1 << 16) + 5, 0.01, "torch", monkeypatch)


def test_every_compressor_class_declares_its_work_beside_its_code() -> None:
    """Each registered class binds its own ``work`` (none is inherited from the base class), a
    function of the torch-free companion of the module that implements it, and that is the
    declaration the cost model reads; compressors.work loads without torch."""
    assert not hasattr(compressors.Compressor, "work")
    for name in compressors.names():
        cls = compressors.compressor_class(name)
        assert cls.work is declared.DECLARATIONS[name].work, name
        assert cls.work.__module__ == cls.__module__.replace("compressors.", "compressors.work.", 1), name
    assert list(declared.DECLARATIONS) == compressors.names()
    with pytest.raises(ValueError, match="no work declared"):
        declared.work("nope", 10, 0.1)
    code = "import sys, compressors.work; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_wire_bytes_follow_the_message_format() -> None:
    assert declared.wire_bytes("none", 1000, 1.0) == 4000
    assert declared.wire_bytes("topk", 1000, 0.01) == 10 * 8
    assert declared.wire_bytes("fp16", 1000, 1.0) == 2000
    sparse = compressors.create("topk", 0.01).compress(torch.randn(1000))
    assert declared.wire_bytes("topk", 1000, 0.01) == sparse.wire_bytes()


def test_sidco_fused_meets_the_launch_goal_of_issue_35() -> None:
    """SIDCo-E fused with error feedback at 2^24, δ = 0.001 (one stage): at most 2 + M launches
    (here two: the statistics kernel, which compacts the pool in the same read, and one packed copy
    back), one sync, one full read of the gradient (and the residual: 12 bytes an element)."""
    w = declared.work("sidco-e", 1 << 24, 0.001, backend="fused", error_feedback=True).compress
    assert w.launches == 2 and w.syncs == 1 and w.passes == 1, w
    assert 12 * (1 << 24) <= w.bytes_read + w.bytes_written < 12.2 * (1 << 24)
