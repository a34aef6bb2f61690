"""Fused GPU kernels (Triton) for the threshold compressors: one statistics pass with error
feedback fused in, and one threshold compaction.

- :func:`statistics`: ``x = g + residual`` (written out when there is a residual) and, per block of
  :data:`BLOCK` elements, ``Σ|x|``, ``Σx²``, ``max|x|`` and the count of non-zero ``|x|``,
  accumulated in float32 within a block and summed over blocks in float64 on the device: one read
  of the gradient (and of the residual), no host round trip. The residual may still hold the
  previous call's selection (error feedback's *lazy residual*: instead of scattering zeros into it
  after selecting, the next read zeroes ``|r| > η`` as it goes), and the kernel zeroes the counters
  a later compaction adds to (no launch of their own). Given a level known before the call
  (:class:`Pool`: SIDCo's pool at its guess) it also compacts ``|x| > level`` in the same read.
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
from compressors.work.declare import FUSED_BLOCK

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the eager path serves every tensor
    triton = None
    tl = None

BLOCK = FUSED_BLOCK
"""Elements per program of both kernels (its home is :data:`compressors.work.declare.FUSED_BLOCK`,
where the declared work reads it without torch). Large blocks keep the interpreter's checks about a
second each (its cost grows with the number of programs, not with ``n``)."""

NUM_WARPS = 16
"""Warps per program of the compaction kernel: 8 elements a thread. Compiled for sm_90 at 4 warps
it took 255 registers a thread and spilled (16 bytes of stack), at 16 warps 87, not spilling
(tests/test_fused_kernels.py reads them from the binaries)."""

STATISTICS_WARPS = 32
"""Warps per program of the statistics kernel: 4 elements a thread (one 16-byte load of float32).
With its pool's compaction at 16 warps ptxas held it to 64 registers and spilled (8 bytes of
stack, sm_80 and sm_90); at 32 warps every variant takes 22–45 registers and no stack."""

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


DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""Dtypes the kernels serve (float64 stays on the eager path)."""


def serves(x: torch.Tensor) -> bool:
    """Whether the kernels serve ``x``: Triton present, a contiguous float32/16/bf16 tensor of
    fewer than 2³¹ elements (positions travel as int32), on a GPU (or on the CPU when Triton runs
    its interpreter, as the tests do)."""
    return (available() and x.dtype in DTYPES and x.is_contiguous() and x.numel() < 2 ** 31
            and (x.is_cuda or (x.device.type == "cpu" and interpreted())))


if triton is not None:
    @triton.jit
    def _feedback_sum(g_ptr, r_ptr, x_ptr, offs, mask, pending):
        """``g + r`` read at ``offs`` (``|r| > pending`` read as zero: the previous call's selection,
        left pending), rounded to ``x_ptr``'s dtype as ``torch.add`` rounds, stored there and
        returned as float32."""
        x = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x = x + tl.where(tl.abs(r) > pending, 0.0, r)
        if x_ptr.dtype.element_ty == tl.bfloat16:  # to nearest, ties to even, by the bits (exact everywhere)
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # NaN stays NaN
        x = x.to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(x_ptr + offs, x, mask=mask)
        return x.to(tl.float32)

    @triton.jit
    def _compact_block(keep, offs, value, counter_ptr, idx_ptr, val_ptr, capacity, SLOT: tl.constexpr):
        """The block's hits (``keep``) written at a range it reserves with one atomic add on
        ``counter_ptr``, placed by an in-block prefix sum: hit ``i`` at ``idx_ptr[i·SLOT]`` (its
        position ``offs``) and ``val_ptr[i·SLOT]`` (its ``value``), the first ``capacity`` of all
        blocks' hits (the count goes on past them: the caller sees it overflowed). Returns the
        block's hit count."""
        ones = keep.to(tl.int32)
        total = tl.sum(ones, axis=0)
        base = tl.atomic_add(counter_ptr, total)
        pos = base + tl.cumsum(ones, axis=0) - ones
        room = keep & (pos < capacity)
        tl.store(idx_ptr + pos * SLOT, offs, mask=room)
        tl.store(val_ptr + pos * SLOT, value, mask=room)
        return total

    @triton.jit
    def _statistics_kernel(g_ptr, r_ptr, x_ptr, part_ptr, counter_ptr, log_ptr, n, pending, floor,
                           pool_at, pool_counter_ptr, idx_ptr, val_ptr, capacity,
                           BLOCK: tl.constexpr, RESIDUAL: tl.constexpr, LOGS: tl.constexpr, POOL: tl.constexpr,
                           SLOT: tl.constexpr):
        pid = tl.program_id(0)
        pair = tl.arange(0, 2)
        tl.store(counter_ptr + pair, tl.zeros([2], dtype=tl.int32), mask=(pair < 2) & (pid == 0))
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if RESIDUAL:
            x = _feedback_sum(g_ptr, r_ptr, x_ptr, offs, mask, pending)
        else:
            x = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        a = tl.abs(x)
        tl.store(part_ptr + pid * 4 + 0, tl.sum(a, axis=0))
        tl.store(part_ptr + pid * 4 + 1, tl.sum(x * x, axis=0))
        tl.store(part_ptr + pid * 4 + 2, tl.max(a, axis=0))
        tl.store(part_ptr + pid * 4 + 3, tl.sum((a != 0).to(tl.float32), axis=0))
        if LOGS:  # SIDCo-GP's Σ ln max(|x|, floor), the masked tail left out
            tl.store(log_ptr + pid, tl.sum(tl.where(mask, tl.log(tl.maximum(a, floor)), 0.0), axis=0))
        if POOL:  # the pool's compaction above a level known before the call: the same read
            _compact_block((a > pool_at) & mask, offs, x, pool_counter_ptr, idx_ptr, val_ptr, capacity, SLOT)

    @triton.jit
    def _compact_kernel(x_ptr, n, threshold, counter_ptr, idx_ptr, val_ptr, part_ptr, total_ptr, capacity,
                        r_ptr, sum_ptr, pending, BLOCK: tl.constexpr, THRESHOLD_PTR: tl.constexpr,
                        TOTAL: tl.constexpr, ABSOLUTE: tl.constexpr, RESIDUAL: tl.constexpr, SLOT: tl.constexpr):
        pid = tl.program_id(0)
        if THRESHOLD_PTR:  # a 0-d float32 tensor on the device: no host read of it
            t = tl.load(threshold)
            echo = tl.arange(0, 2)  # its bits beside the count, for the host's one read
            tl.store(counter_ptr + echo, tl.zeros([2], dtype=tl.int32) + t.to(tl.int32, bitcast=True),
                     mask=(echo == 1) & (pid == 0))
        else:
            t = threshold
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if RESIDUAL:  # x = g + r (error feedback's sum) written into sum_ptr as it is read
            x = _feedback_sum(x_ptr, r_ptr, sum_ptr, offs, mask, pending).to(sum_ptr.dtype.element_ty)
        else:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        a = tl.abs(x.to(tl.float32))
        keep = (a > t) & mask
        if ABSOLUTE:
            total = _compact_block(keep, offs, tl.abs(x), counter_ptr, idx_ptr, val_ptr, capacity, SLOT)
        else:
            total = _compact_block(keep, offs, x, counter_ptr, idx_ptr, val_ptr, capacity, SLOT)
        excess = tl.where(keep, a - t, 0.0)
        tl.store(part_ptr + pid * 3 + 0, total.to(tl.float32))
        tl.store(part_ptr + pid * 3 + 1, tl.sum(excess, axis=0))
        tl.store(part_ptr + pid * 3 + 2, tl.sum(excess * excess, axis=0))
        if TOTAL:  # Σ|x| over the block, every element (finite iff the block is, barring overflow)
            tl.store(total_ptr + pid, tl.sum(a, axis=0))


class Survivors(NamedTuple):
    """What :func:`compact` selected: ``indices`` (int64, ascending) and ``values`` of
    ``|x| > threshold``; ``count`` (a host int: the call's one device→host read); ``excess_sum``
    and ``excess_square_sum``, ``Σ(|x| − t)`` and ``Σ(|x| − t)²`` over them (0-d float64)."""

    indices: torch.Tensor
    values: torch.Tensor
    count: int
    excess_sum: torch.Tensor
    excess_square_sum: torch.Tensor


class Statistics(NamedTuple):
    """What :func:`statistics` computed: ``x`` (``g + residual``, or ``g`` itself), and 0-d float64
    tensors on ``x``'s device: ``abs_sum`` (Σ|x|), ``square_sum`` (Σx²), ``abs_max`` (max|x|),
    ``nonzero`` (#(x ≠ 0)), ``log_sum`` (Σ ln max(|x|, LOG_FLOOR)). A non-finite ``abs_sum`` means
    ``x`` holds NaN/Inf (or overflowed). ``pool``: what the same read compacted above a level given
    beforehand (:class:`Survivors` of it), when one was asked for."""

    x: torch.Tensor
    abs_sum: torch.Tensor
    square_sum: torch.Tensor
    abs_max: torch.Tensor
    nonzero: torch.Tensor
    log_sum: torch.Tensor
    pool: Survivors | None = None


def programs(n: int) -> int:
    """Programs (blocks of :data:`BLOCK` elements) either kernel runs over ``n`` elements."""
    return -(-n // BLOCK)



def _launch(kernel: str, grid: int, *args, **meta) -> None:
    """The one place the kernels are launched (``kernel``: ``"statistics"`` or ``"compact"``), over
    ``grid`` programs (none launched for 0): :func:`compressors.work.counting.record_ops` counts the
    launches here, since a Triton launch is no torch dispatch."""
    if grid:
        fn = _statistics_kernel if kernel == "statistics" else _compact_kernel
        fn[(grid,)](*args, BLOCK=BLOCK, num_warps=warps(kernel), **meta)


class Pool(NamedTuple):
    """A compaction the statistics kernel does in its own read (:func:`launch_statistics`): the
    positions and values of ``|x| > level`` (``level`` already rounded to ``x``'s dtype: a level
    known before the call, as SIDCo's pool at its guess), the count added to ``counter`` (int32,
    zero before the launch; not one of the ``counters`` the kernel zeroes), the first ``capacity``
    hits written into ``indices`` and ``values`` (any integer and floating dtypes: stored
    converted) in block order, any order of blocks, hit ``i`` at ``indices[i·slot]`` and
    ``values[i·slot]`` (``slot`` 2: positions and values interleaved in one buffer, a slot of 8
    bytes each, so that a prefix of it holds the first hits whole)."""

    level: float
    counter: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    capacity: int
    slot: int = 1


def warps(kernel: str) -> int:
    """Warps per program of ``kernel`` (``"statistics"``: :data:`STATISTICS_WARPS`, ``"compact"``:
    :data:`NUM_WARPS`)."""
    return STATISTICS_WARPS if kernel == "statistics" else NUM_WARPS


def launch_statistics(grad: torch.Tensor, residual: torch.Tensor | None, x: torch.Tensor,
                      parts: torch.Tensor, counters: torch.Tensor, pending: float = math.inf,
                      logs: torch.Tensor | None = None, pool: Pool | None = None) -> None:
    """Launch the statistics kernel over ``grad`` (plus ``residual``, the sum written into ``x``),
    its per-block partials (:data:`STATISTICS` float32 a block) into ``parts``, and where ``logs``
    is given (float32, one a block) each block's ``Σ ln max(|x|, LOG_FLOOR)`` (SIDCo-GP's first
    statistic, :data:`compressors.numerics.estimators.LOG_FLOOR`) into it; no host read.

    The residual is read as :func:`compressors.memory.pending_residual` of ``pending`` (a threshold already rounded to
    the residual's dtype: the selection of the call before, not yet zeroed; ``inf``: none), and the
    kernel zeroes the two int32 ``counters`` a compaction launched after it (stream order) adds to.
    With ``pool`` the same read also compacts ``|x| > pool.level`` (:class:`Pool`): one launch, the
    gradient read once."""
    level, counter, indices, values, capacity, slot = pool if pool is not None else (0.0, counters, counters, parts, 0, 1)
    _launch("statistics", programs(grad.numel()), grad, grad if residual is None else residual, x, parts, counters,
            parts if logs is None else logs, grad.numel(), pending, LOG_FLOOR, level, counter, indices, values,
            capacity, RESIDUAL=residual is not None, LOGS=logs is not None, POOL=pool is not None, SLOT=slot)


def launch_compact(x: torch.Tensor, threshold: float | torch.Tensor, counter: torch.Tensor, indices: torch.Tensor,
                   values: torch.Tensor, parts: torch.Tensor, capacity: int, totals: torch.Tensor | None = None,
                   absolute: bool = False, feedback: tuple[torch.Tensor, torch.Tensor, float] | None = None,
                   slot: int = 1) -> None:
    """Launch the compaction of ``|x| > threshold`` adding its count to ``counter`` (int32, zeroed
    by the caller or by a statistics kernel launched before it) and writing the first
    ``capacity`` hits' positions and values (in block order, any order of blocks) into ``indices``
    and ``values`` (any integer and floating dtypes: stored converted; ``absolute``: ``|x|``
    instead of ``x``), the survivors' partials (:data:`SURVIVORS` float32 a block) into ``parts``
    and, where ``totals`` is given (float32, one a block), each block's ``Σ|x|`` into it; no host
    read. ``threshold`` is already rounded to ``x``'s dtype: a float, or a 0-d float32 tensor on
    ``x``'s device that the kernel reads there (no device→host copy of it) and whose bits it
    writes into ``counter[1]`` (int32: the host reads them with the count). With ``feedback``
    ``(residual, out, pending)``, ``x`` is the gradient and the kernel compacts ``x + residual``
    (the residual read as :func:`compressors.memory.pending_residual` of ``pending``, a float
    already rounded to its dtype), writing the sum into ``out`` as it reads: error feedback's
    addition in the same read. ``slot``: hit ``i`` goes to ``indices[i·slot]`` and
    ``values[i·slot]`` (:class:`Pool`)."""
    pointer = isinstance(threshold, torch.Tensor)
    residual, out, pending = feedback if feedback is not None else (x, x, math.inf)
    _launch("compact", programs(x.numel()), x, x.numel(), threshold, counter, indices, values, parts,
            parts if totals is None else totals, capacity, residual, out, pending, THRESHOLD_PTR=pointer,
            TOTAL=totals is not None, ABSOLUTE=absolute, RESIDUAL=feedback is not None, SLOT=slot)


def _require() -> None:
    if triton is None:
        raise RuntimeError("the fused kernels need Triton: pip install '.[gpu]'")


def statistics(grad: torch.Tensor, residual: torch.Tensor | None = None,
               out: torch.Tensor | None = None, pending: float = math.inf,
               pool_at: float | None = None) -> Statistics:
    """One pass over the 1-D floating ``grad`` (and ``residual``, same shape and dtype, when given:
    ``x = grad + residual`` is written into ``out`` or a new tensor, the residual read with what
    ``|r| > pending`` selects zeroed: :func:`launch_statistics`): the statistics of
    :class:`Statistics`, one kernel launch plus one reduction of the per-block partials; with
    ``pool_at`` also the elements ``|x| > pool_at`` (rounded to the dtype first), compacted in the
    same launch and sorted afterwards (one read of their count to the host)."""
    _require()
    n = grad.numel()
    device = grad.device
    if residual is not None and (residual.shape != grad.shape or residual.dtype != grad.dtype):
        raise ValueError(f"residual must match the gradient: {grad.dtype} {tuple(grad.shape)}, "
                         f"got {residual.dtype} {tuple(residual.shape)}")
    x = grad if residual is None else (torch.empty_like(grad) if out is None else out)
    parts = torch.zeros(max(programs(n), 1), STATISTICS, dtype=torch.float32, device=device)
    logs = torch.zeros(max(programs(n), 1), dtype=torch.float32, device=device)
    pool = None
    if pool_at is not None:
        pool = Pool(float(torch.tensor(pool_at, dtype=grad.dtype)), torch.zeros(1, dtype=torch.int32, device=device),
                    torch.empty(n, dtype=torch.int64, device=device), torch.empty(n, dtype=grad.dtype, device=device), n)
    launch_statistics(grad, residual, x, parts, torch.empty(2, dtype=torch.int32, device=device), pending, logs, pool)
    wide = parts.double()
    sums = wide.sum(0)
    return Statistics(x, sums[0], sums[1], wide[:, 2].max(), sums[3], logs.double().sum(),
                      None if pool is None else _sorted(pool.indices, pool.values, int(pool.counter.item()), pool.level))


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
    return _sorted(indices, values, int(counter.item()), t)


def _sorted(indices: torch.Tensor, values: torch.Tensor, count: int, threshold: float) -> Survivors:
    """The first ``count`` compacted ``indices`` and ``values`` in ascending order of position, with
    their excess over ``threshold`` summed (float64)."""
    order = torch.argsort(indices[:count])
    values = values[:count].index_select(0, order)
    excess = values.double().abs() - threshold
    return Survivors(indices[:count].index_select(0, order), values, count, excess.sum(), (excess * excess).sum())


SIGNATURES = {
    "statistics": {"g_ptr": "*{v}", "r_ptr": "*{v}", "x_ptr": "*{v}", "part_ptr": "*fp32", "counter_ptr": "*i32",
                   "log_ptr": "*fp32", "n": "i64", "pending": "fp32", "floor": "fp32", "pool_at": "fp32",
                   "pool_counter_ptr": "*i32", "idx_ptr": "*i32", "val_ptr": "*fp32", "capacity": "i64",
                   "BLOCK": "constexpr", "RESIDUAL": "constexpr", "LOGS": "constexpr", "POOL": "constexpr",
                   "SLOT": "constexpr"},
    "compact": {"x_ptr": "*{v}", "n": "i64", "threshold": "fp32", "counter_ptr": "*i32", "idx_ptr": "*i32",
                "val_ptr": "*fp32", "part_ptr": "*fp32", "total_ptr": "*fp32", "capacity": "i64", "r_ptr": "*{v}",
                "sum_ptr": "*{v}", "pending": "fp32", "BLOCK": "constexpr", "THRESHOLD_PTR": "constexpr",
                "TOTAL": "constexpr", "ABSOLUTE": "constexpr", "RESIDUAL": "constexpr", "SLOT": "constexpr"},
}
SIGNATURES["select"] = {**SIGNATURES["compact"], "threshold": "*fp32", "idx_ptr": "*i64", "val_ptr": "*{v}"}
SIGNATURES["select_feedback"] = SIGNATURES["select"]
"""Each kernel's argument types for :func:`compile_ahead` (``{v}``: the gradient's Triton dtype):
``compact`` as SIDCo's fused path launches the compaction (a float threshold, int32 positions and
float32 values), ``select`` as :func:`compressors.numerics.selection.select_above` does (the
threshold read from a device pointer, int64 positions, magnitudes in the gradient's dtype and each
block's ``Σ|x|``), ``select_feedback`` the same with error feedback's addition in its read (DGC's
first selection)."""

_CONSTEXPRS = {"statistics": {"RESIDUAL": True, "LOGS": True, "SLOT": 2},
               "compact": {"THRESHOLD_PTR": False, "TOTAL": False, "ABSOLUTE": False, "RESIDUAL": False, "SLOT": 2},
               "select": {"THRESHOLD_PTR": True, "TOTAL": True, "ABSOLUTE": True, "RESIDUAL": False, "SLOT": 1},
               "select_feedback": {"THRESHOLD_PTR": True, "TOTAL": True, "ABSOLUTE": True, "RESIDUAL": True, "SLOT": 1}}


def compile_ahead(kernel: str, arch: int, dtype: str = "fp32", pool: bool = True) -> bytes:
    """The CUDA binary (cubin bytes) of ``kernel`` (``"statistics"``, or the compaction as
    ``"compact"``, ``"select"`` or ``"select_feedback"``: :data:`SIGNATURES`) for ``sm_<arch>`` (80, 90), values of
    Triton dtype ``dtype`` (``fp32``, ``fp16``, ``bf16``), with this module's block and warps (the
    statistics kernel with error feedback, logarithms and, with ``pool``, the pool's compaction):
    Triton compiles ahead of time without a GPU."""
    _require()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _statistics_kernel if kernel == "statistics" else _compact_kernel
    signature = {name: kind.format(v=dtype) for name, kind in SIGNATURES[kernel].items()}
    constexprs = {"BLOCK": BLOCK, **_CONSTEXPRS[kernel], **({"POOL": pool} if kernel == "statistics" else {})}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": warps(kernel)})
    return compiled.asm["cubin"]


__all__ = ["BLOCK", "DTYPES", "NUM_WARPS", "Pool", "REGISTER_CEILING", "SIGNATURES", "STATISTICS_WARPS", "Statistics", "Survivors", "available", "compact",
           "compile_ahead", "interpreted", "launch_compact", "launch_statistics", "programs", "serves", "statistics", "warps"]
