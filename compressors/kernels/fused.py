"""Fused GPU kernels (Triton) for the threshold compressors: one statistics pass with error
feedback fused in, and one threshold compaction.

- :func:`statistics`: ``x = g + residual`` (written out when there is a residual) and, per block of
  :data:`BLOCK` elements, ``Σ|x|``, ``Σx²``, ``max|x|`` and the count of non-zero ``|x|``,
  accumulated in float32 within a block and summed over blocks in float64 on the device: one read
  of the gradient (and of the residual), no host round trip. The residual may still hold the
  previous call's selection (error feedback's *lazy residual*: instead of scattering zeros into it
  after selecting, the next read zeroes ``|r| > η`` as it goes), and the kernel zeroes the counters
  the compaction after it adds to (no launch of their own).
- :func:`compact`: the positions and values of ``|x| > threshold`` (strict, the threshold first
  rounded to ``x``'s dtype: the tie rule of :mod:`compressors.numerics.selection`), each block reserving
  its output range with one atomic and placing its elements by an in-block prefix sum, plus the
  survivors' count, ``Σ(|x| − t)`` and ``Σ(|x| − t)²`` (what a later peak-over-threshold stage
  fits on). The count is the one device→host read a call needs (the message size); blocks land
  in any order on a GPU, so the positions are sorted afterwards.

Both run on CUDA tensors when Triton and a GPU are present, and on CPU tensors under the Triton
interpreter (``TRITON_INTERPRET=1`` set before Triton is imported), which computes exactly what
the GPU binary does: that is how tests/test_fused_kernels.py checks them against the eager torch
path without a GPU, and compiles them ahead of time to sm_80/sm_90 binaries whose register use it
reads. Triton is the optional ``gpu`` extra (``pip install .[gpu]``); without it :func:`available`
is false and the compressors keep their eager torch path.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from compressors.numerics.estimators import LOG_FLOOR
from compressors.work.sidco import FUSED_BLOCK

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the eager path serves every tensor
    triton = None
    tl = None

BLOCK = FUSED_BLOCK
"""Elements per program of both kernels (its home is :data:`compressors.work.sidco.FUSED_BLOCK`,
where the declared work reads it without torch). Large blocks keep the interpreter's checks about a
second each (its cost grows with the number of programs, not with ``n``)."""

NUM_WARPS = 16
"""Warps per program: 8 elements a thread. Compiled for sm_90 at 4 warps the compaction kernel
took 255 registers a thread and spilled (16 bytes of stack), at 16 warps 87 and the statistics
kernel 47, neither spilling (tests/test_fused_kernels.py reads them from the binaries)."""

REGISTER_CEILING = 128
"""Registers per thread either kernel may use on sm_80 and sm_90 (and no stack: no spill)."""

STATISTICS = 4
"""Per-block statistics of :func:`statistics`: ``Σ|x|``, ``Σx²``, ``max|x|``, ``#(x ≠ 0)``."""

SURVIVORS = 3
"""Per-block statistics of :func:`compact`: the count, ``Σ(|x| − t)``, ``Σ(|x| − t)²``."""


def available() -> bool:
    """Whether the Triton package is importable (the kernels can be launched on a GPU, or run on
    CPU tensors when ``TRITON_INTERPRET=1``)."""
    return triton is not None


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    @triton.jit
    def _statistics_kernel(g_ptr, r_ptr, x_ptr, part_ptr, counter_ptr, log_ptr, n, pending, floor,
                           BLOCK: tl.constexpr, RESIDUAL: tl.constexpr, LOGS: tl.constexpr):
        pid = tl.program_id(0)
        pair = tl.arange(0, 2)
        tl.store(counter_ptr + pair, tl.zeros([2], dtype=tl.int32), mask=(pair < 2) & (pid == 0))
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if RESIDUAL:
            r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            x = x + tl.where(tl.abs(r) > pending, 0.0, r)  # the previous call's selection, left pending
            if x_ptr.dtype.element_ty == tl.bfloat16:  # to nearest, ties to even, by the bits (exact everywhere)
                bits = x.to(tl.uint32, bitcast=True)
                bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
                x = tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # NaN stays NaN
            x = x.to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
            tl.store(x_ptr + offs, x, mask=mask)
            x = x.to(tl.float32)
        a = tl.abs(x)
        tl.store(part_ptr + pid * 4 + 0, tl.sum(a, axis=0))
        tl.store(part_ptr + pid * 4 + 1, tl.sum(x * x, axis=0))
        tl.store(part_ptr + pid * 4 + 2, tl.max(a, axis=0))
        tl.store(part_ptr + pid * 4 + 3, tl.sum((a != 0).to(tl.float32), axis=0))
        if LOGS:  # SIDCo-GP's Σ ln max(|x|, floor), the masked tail left out
            tl.store(log_ptr + pid, tl.sum(tl.where(mask, tl.log(tl.maximum(a, floor)), 0.0), axis=0))

    @triton.jit
    def _compact_kernel(x_ptr, n, threshold, counter_ptr, idx_ptr, val_ptr, part_ptr, capacity,
                        BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        a = tl.abs(x.to(tl.float32))
        keep = (a > threshold) & mask
        ones = keep.to(tl.int32)
        total = tl.sum(ones, axis=0)
        base = tl.atomic_add(counter_ptr, total)
        pos = base + tl.cumsum(ones, axis=0) - ones
        room = keep & (pos < capacity)  # the count goes on past the slots: the caller sees it overflowed
        tl.store(idx_ptr + pos, offs, mask=room)
        tl.store(val_ptr + pos, x, mask=room)
        excess = tl.where(keep, a - threshold, 0.0)
        tl.store(part_ptr + pid * 3 + 0, total.to(tl.float32))
        tl.store(part_ptr + pid * 3 + 1, tl.sum(excess, axis=0))
        tl.store(part_ptr + pid * 3 + 2, tl.sum(excess * excess, axis=0))


class Statistics(NamedTuple):
    """What :func:`statistics` computed: ``x`` (``g + residual``, or ``g`` itself), and 0-d float64
    tensors on ``x``'s device: ``abs_sum`` (Σ|x|), ``square_sum`` (Σx²), ``abs_max`` (max|x|),
    ``nonzero`` (#(x ≠ 0)), ``log_sum`` (Σ ln max(|x|, LOG_FLOOR)). A non-finite ``abs_sum`` means
    ``x`` holds NaN/Inf (or overflowed)."""

    x: torch.Tensor
    abs_sum: torch.Tensor
    square_sum: torch.Tensor
    abs_max: torch.Tensor
    nonzero: torch.Tensor
    log_sum: torch.Tensor


class Survivors(NamedTuple):
    """What :func:`compact` selected: ``indices`` (int64, ascending) and ``values`` of
    ``|x| > threshold``; ``count`` (a host int: the call's one device→host read); ``excess_sum``
    and ``excess_square_sum``, ``Σ(|x| − t)`` and ``Σ(|x| − t)²`` over them (0-d float64)."""

    indices: torch.Tensor
    values: torch.Tensor
    count: int
    excess_sum: torch.Tensor
    excess_square_sum: torch.Tensor


def programs(n: int) -> int:
    """Programs (blocks of :data:`BLOCK` elements) either kernel runs over ``n`` elements."""
    return -(-n // BLOCK)



def _launch(kernel: str, grid: int, *args, **meta) -> None:
    """The one place the kernels are launched (``kernel``: ``"statistics"`` or ``"compact"``), over
    ``grid`` programs (none launched for 0): :func:`compressors.work.counting.record_ops` counts the
    launches here, since a Triton launch is no torch dispatch."""
    if grid:
        fn = _statistics_kernel if kernel == "statistics" else _compact_kernel
        fn[(grid,)](*args, BLOCK=BLOCK, num_warps=NUM_WARPS, **meta)


def launch_statistics(grad: torch.Tensor, residual: torch.Tensor | None, x: torch.Tensor,
                      parts: torch.Tensor, counters: torch.Tensor, pending: float = math.inf,
                      logs: torch.Tensor | None = None) -> None:
    """Launch the statistics kernel over ``grad`` (plus ``residual``, the sum written into ``x``),
    its per-block partials (:data:`STATISTICS` float32 a block) into ``parts``, and where ``logs``
    is given (float32, one a block) each block's ``Σ ln max(|x|, LOG_FLOOR)`` (SIDCo-GP's first
    statistic, :data:`compressors.numerics.estimators.LOG_FLOOR`) into it; no host read.

    The residual is read as :func:`compressors.memory.pending_residual` of ``pending`` (a threshold already rounded to
    the residual's dtype: the selection of the call before, not yet zeroed; ``inf``: none), and the
    kernel zeroes the two int32 ``counters`` a compaction launched after it (stream order) adds to."""
    _launch("statistics", programs(grad.numel()), grad, grad if residual is None else residual, x, parts, counters,
            parts if logs is None else logs, grad.numel(), pending, LOG_FLOOR, RESIDUAL=residual is not None,
            LOGS=logs is not None)


def launch_compact(x: torch.Tensor, threshold: float, counter: torch.Tensor, indices: torch.Tensor,
                   values: torch.Tensor, parts: torch.Tensor, capacity: int) -> None:
    """Launch the compaction of ``|x| > threshold`` (``threshold`` already rounded to ``x``'s
    dtype) adding its count to ``counter`` (int32, zeroed by the caller or by a statistics kernel
    launched before it) and writing the first
    ``capacity`` hits' positions and values (in block order, any order of blocks) into ``indices``
    and ``values`` (any integer and floating dtypes: stored converted), the survivors' partials
    (:data:`SURVIVORS` float32 a block) into ``parts``; no host read."""
    _launch("compact", programs(x.numel()), x, x.numel(), threshold, counter, indices, values, parts, capacity)


def _require() -> None:
    if triton is None:
        raise RuntimeError("the fused kernels need Triton: pip install '.[gpu]'")


def statistics(grad: torch.Tensor, residual: torch.Tensor | None = None,
               out: torch.Tensor | None = None, pending: float = math.inf) -> Statistics:
    """One pass over the 1-D floating ``grad`` (and ``residual``, same shape and dtype, when given:
    ``x = grad + residual`` is written into ``out`` or a new tensor, the residual read with what
    ``|r| > pending`` selects zeroed: :func:`launch_statistics`): the statistics of
    :class:`Statistics`, one kernel launch plus one reduction of the per-block partials."""
    _require()
    n = grad.numel()
    device = grad.device
    if residual is not None and (residual.shape != grad.shape or residual.dtype != grad.dtype):
        raise ValueError(f"residual must match the gradient: {grad.dtype} {tuple(grad.shape)}, "
                         f"got {residual.dtype} {tuple(residual.shape)}")
    x = grad if residual is None else (torch.empty_like(grad) if out is None else out)
    parts = torch.zeros(max(programs(n), 1), STATISTICS, dtype=torch.float32, device=device)
    logs = torch.zeros(max(programs(n), 1), dtype=torch.float32, device=device)
    launch_statistics(grad, residual, x, parts, torch.empty(2, dtype=torch.int32, device=device), pending, logs)
    wide = parts.double()
    sums = wide.sum(0)
    return Statistics(x, sums[0], sums[1], wide[:, 2].max(), sums[3], logs.double().sum())


def compact(x: torch.Tensor, threshold: float) -> Survivors:
    """The elements of the 1-D floating ``x`` with ``|x| > threshold`` (``threshold`` rounded to
    ``x``'s dtype first), ascending, with their statistics: one kernel launch, one read of the
    count to the host, one sort of the positions."""
    _require()
    n = x.numel()
    device = x.device
    t = float(torch.tensor(threshold, dtype=x.dtype))
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    indices = torch.empty(n, dtype=torch.int64, device=device)
    values = torch.empty(n, dtype=x.dtype, device=device)
    parts = torch.zeros(max(programs(n), 1), SURVIVORS, dtype=torch.float32, device=device)
    launch_compact(x, t, counter, indices, values, parts, n)
    count = int(counter.item())
    order = torch.argsort(indices[:count])
    sums = parts.double().sum(0)
    return Survivors(indices[:count].index_select(0, order), values[:count].index_select(0, order), count,
                     sums[1], sums[2])


SIGNATURES = {
    "statistics": {"g_ptr": "*{v}", "r_ptr": "*{v}", "x_ptr": "*{v}", "part_ptr": "*fp32", "counter_ptr": "*i32",
                   "log_ptr": "*fp32", "n": "i64", "pending": "fp32", "floor": "fp32", "BLOCK": "constexpr",
                   "RESIDUAL": "constexpr", "LOGS": "constexpr"},
    "compact": {"x_ptr": "*{v}", "n": "i64", "threshold": "fp32", "counter_ptr": "*i32", "idx_ptr": "*i32",
                "val_ptr": "*fp32", "part_ptr": "*fp32", "capacity": "i64", "BLOCK": "constexpr"},
}
"""Each kernel's argument types for :func:`compile_ahead` (``{v}``: the gradient's Triton dtype)."""


def compile_ahead(kernel: str, arch: int, dtype: str = "fp32") -> bytes:
    """The CUDA binary (cubin bytes) of ``kernel`` (``"statistics"`` or ``"compact"``) for
    ``sm_<arch>`` (80, 90), values of Triton dtype ``dtype`` (``fp32``, ``fp16``, ``bf16``), with
    this module's block and warps: Triton compiles ahead of time without a GPU."""
    _require()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = {"statistics": _statistics_kernel, "compact": _compact_kernel}[kernel]
    signature = {name: kind.format(v=dtype) for name, kind in SIGNATURES[kernel].items()}
    constexprs = {"BLOCK": BLOCK, **({"RESIDUAL": True, "LOGS": True} if kernel == "statistics" else {})}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": NUM_WARPS})
    return compiled.asm["cubin"]


__all__ = ["BLOCK", "NUM_WARPS", "REGISTER_CEILING", "SIGNATURES", "Statistics", "Survivors", "available", "compact",
           "compile_ahead", "interpreted", "launch_compact", "launch_statistics", "programs", "statistics"]
