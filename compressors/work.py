"""What each compressor does per call, as a function of its size, density and stages.

:func:`work` returns a :class:`CallWork` (compress and decompress, each a :class:`Work`) that
counts, for one call on an ``numel``-element gradient, the kernels the code issues: passes over
the whole vector, bytes read and written by streaming kernels (whole or partial vectors),
kernel launches (eager op dispatches on a CPU), device→host synchronisations, and the
elements that go through top-k, sort, gather/scatter, compaction (``nonzero``) and
transcendental functions. :mod:`simulator.costmodel` turns it into seconds on a device.

The declarations mirror the code path by path (``backend="torch"``: the eager torch ops, any
device; ``"cuda"``: the same where a GPU runs other code (exact Top-k); ``"native"``: the fused C
kernels on CPU float32, SIDCo's and the selection primitive's) and are checked against what the
code does, op by op and kernel by kernel (tests/test_compressors_work.py, with the op recorder
:func:`record_ops` and :func:`loop_counts`). Work that depends on the data is declared as a
function of counts the call reveals, with defaults seen on gradient-like data: ``rounds``
(:data:`DEFAULT_ROUNDS`: selection loops; SIDCo's native full passes),
DGC's ``trim``, SIDCo's ``stages`` (:data:`DEFAULT_STAGES`) and its native correction ``steps``
(:data:`NATIVE_STEPS`). SIDCo's torch path is declared for a call whose pool guess held (every
call after the first on a steady stream): its work follows the planned stage count and the pool
size. With ``error_feedback`` (the default, as training runs
them) the residual update is part of compress. Units: elements, bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressors.rules import TOPK_SAMPLE, sample_stride, stage_probabilities, target_count
from compressors.wire import DENSE_ALLREDUCE, sparse_bytes

DEFAULT_STAGES = 2
"""SIDCo stages assumed when ``stages`` is not given (adaptive SIDCo settles at 1–3 on
gradient-like data below δ = 0.25)."""

DEFAULT_ROUNDS = {"gaussiank": 3, "redsync": 5, "dgc": 0, "topk": 0, "randomk": 1}
"""Data-dependent loop counts seen on the benchmark's gradient-like vector at δ = 0.01:
Gaussian-k's corrections (all three), RedSync's probes, DGC's threshold lowerings and Top-k's
halvings of its sampled guess (none), Random-k's draw rounds. SIDCo's native full passes default to ``min(stages, 2)`` (every
threshold after stage 2's statistics stays in or above the pool)."""

NATIVE_STEPS = 5
"""Correction steps SIDCo's native path takes by default (seen on gradient-like data at
δ = 0.01 and 0.001: 4 to 6)."""

NATIVE_POOL = 5
"""Elements in SIDCo's native pool per selected element by default (the pool holds ``|g|`` above
0.9 × the previous call's threshold: about 5·k seen on gradient-like data at δ = 0.01, more
while error feedback's residual is still growing)."""

SIDCO_CORRECTIONS = 8
"""SIDCo's in-call correction steps (its default ``corrections``)."""

POWERSGD_RANK = 1
"""PowerSGD rank assumed by its declaration (the compressor's default; the gradient viewed as a
⌈√n⌉-row square matrix)."""

SCALAR_OPS = {"finite": 5, "isfinite": 4, "gaussian": 13, "gaussian_threshold": 7, "redsync_setup": 6,
              "redsync_probe": 5}
"""Launches of 0-d tensor arithmetic per step (threshold formulas, finiteness checks), as the
torch path issues them; counted with a dispatch mode when the code was written."""


KINDS = ("map", "reduce", "minmax", "compare", "count", "log", "outer", "native", "native_select", "native_log")
"""Streaming kernels by what they compute per element (a device may be slower per element than
its memory for some): ``map`` (abs, add, clamp, copy, fill), ``reduce`` (sum, amax, norm),
``minmax`` (``aminmax`` of 16-bit values: two comparisons per element and a widening),
``outer`` (a rank-r product ``P·Qᵀ`` written out: a matrix product whose output is the whole
vector, ``2·r`` FLOPs per element),
``compare`` (``>``/``>=`` into a bool mask), ``count`` (``count_nonzero`` of a mask), ``log``
(logarithms), ``native`` (a fused C pass of statistics only: SIDCo's tails),
``native_select`` (a fused C pass that also compacts what lies above a threshold: the selection
primitive, SIDCo's pool and final selection), ``native_log`` (SIDCo's statistics with
logarithms)."""


@dataclass
class Work:
    """Work of one call. ``streams``: the streaming kernels as ``(kind, elements, bytes read,
    bytes written, cold)``; ``passes`` counts those over the whole vector; gathers, top-k, sorts and
    compaction are charged per element by the device (``sorts``: the length of each sort, whose rate
    per element depends on it); ``allocations``: bytes of each fresh
    buffer the call allocates; ``working_set_bytes``: what the call touches (how much of what it
    reads twice a cache still holds)."""

    passes: int = 0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    launches: int = 0
    syncs: int = 0
    streams: list[tuple[str, float, float, float, bool]] = field(default_factory=list)
    topk: list[tuple[float, float]] = field(default_factory=list)
    sorts: list[float] = field(default_factory=list)
    gather_elements: float = 0.0
    compact_elements: float = 0.0
    compact_hits: float = 0.0
    allocations: list[float] = field(default_factory=list)
    flops: float = 0.0
    working_set_bytes: float = 0.0
    host_bytes: float = 0.0

    def stream(self, elements: float, read: float, written: float, kind: str = "map", full: bool = False,
               cold: bool = False) -> Work:
        """A streaming kernel of ``kind`` over ``elements`` reading/writing ``read``/``written``
        bytes per element; ``cold``: what it reads comes from outside the call (state kept
        between calls, touched once per iteration), so it is read from memory even when the
        call's working set would fit in a cache."""
        if kind not in KINDS:
            raise ValueError(f"unknown kernel kind {kind!r}")
        self.passes += int(full)
        self.bytes_read += elements * read
        self.bytes_written += elements * written
        self.streams.append((kind, float(elements), elements * read, elements * written, cold))
        self.launches += 1
        return self

    def scalars(self, count: int) -> Work:
        """``count`` launches of 0-d arithmetic."""
        self.launches += count
        return self

    def sync(self, count: int = 1) -> Work:
        """``count`` device→host synchronisations."""
        self.syncs += count
        return self

    def to_host(self, nbytes: float) -> Work:
        """One device→host copy of ``nbytes`` read on the host (a synchronisation)."""
        self.syncs += 1
        self.host_bytes += nbytes
        return self

    def select_topk(self, elements: float, k: float) -> Work:
        """One ``torch.topk`` keeping ``k`` of ``elements``."""
        self.topk.append((float(elements), min(1.0, k / max(elements, 1.0))))
        self.launches += 1
        return self

    def sort(self, elements: float) -> Work:
        """One sort of ``elements``."""
        self.sorts.append(float(elements))
        self.launches += 1
        return self

    @property
    def sort_elements(self) -> float:
        """Elements sorted in all, over every sort of the call."""
        return sum(self.sorts)

    def gather(self, elements: float) -> Work:
        """One gather/scatter (``index_select``, ``index_add_``, ``index_copy_``) of ``elements``."""
        self.gather_elements += elements
        self.launches += 1
        return self

    def compact(self, elements: float, hits: float) -> Work:
        """One ``nonzero`` over ``elements`` finding ``hits`` (sizing its output syncs)."""
        self.compact_elements += elements
        self.compact_hits += hits
        self.launches += 1
        self.syncs += 1
        return self

    def allocate(self, nbytes: float) -> Work:
        """A fresh buffer of ``nbytes`` (a new tensor each call, not a reused workspace)."""
        self.allocations.append(float(nbytes))
        return self


@dataclass(frozen=True)
class CallWork:
    """Work of one compress call and one decompress call."""

    compress: Work
    decompress: Work


def _ef_in(n: int, itemsize: int) -> Work:
    """Error feedback before compressing: ``grad + residual`` into a kept spare buffer (the
    residual is state from the last iteration: cold)."""
    return Work().stream(n, 2 * itemsize, itemsize, full=True, cold=True)


def _ef_out(name: str, n: int, density: float, itemsize: int, sent: float | None = None) -> Work:
    """Error feedback after compressing, the new residual: a fresh zero vector for ``none``,
    ``index_add_`` of what was sent for sparse messages, else ``sub_`` of the message
    decompressed into a kept scratch buffer."""
    if name == "none":
        return Work().stream(n, 0, itemsize, full=True).allocate(n * itemsize)
    if name in ("fp16", "bf16"):  # widened into a kept scratch buffer, then ``sub_``
        return Work().stream(n, DENSE_ALLREDUCE[name], itemsize, full=True).stream(n, 2 * itemsize, itemsize, full=True)
    if name == "powersgd":  # decompressed into a kept scratch buffer, then ``sub_``
        return _merge(_powersgd_expand(n, itemsize), Work().stream(n, 2 * itemsize, itemsize, full=True))
    if sent is None:
        sent = 1.5 * target_count(density, n) if name == "redsync" else target_count(density, n)
    return Work().gather(sent)


def _finite(w: Work, n: int, itemsize: int) -> None:
    """``raise_if_not_finite`` with a fresh sum: one read pass, scalar checks, one sync."""
    w.stream(n, itemsize, 0, "reduce", full=True).scalars(SCALAR_OPS["finite"]).sync()


def _sparse_decompress(n: int, k: float, itemsize: int) -> Work:
    return Work(working_set_bytes=n * itemsize).stream(n, 0, itemsize, full=True).gather(k)


def _none(n, density, itemsize, stages, rounds, backend):
    c = Work()
    _finite(c, n, itemsize)
    return c, Work().stream(n, itemsize, itemsize, full=True)


def _select(w: Work, n: int, hits: float, itemsize: int, backend: str, total: bool = False) -> None:
    """:func:`compressors.selection.select_above`. Torch path: ``|x|`` into a reused buffer, the
    ``>`` mask, ``nonzero`` (its one sync), optionally ``Σ|x|``, the hits' magnitudes. Native
    path (CPU float32): the threshold read back (one sync), one fused pass writing 8 bytes per
    hit (with ``total``: a second kernel over the hits, and ``Σ|x|`` wrapped in a tensor), the
    positions widened to int64."""
    if backend == "native":
        w.sync().stream(n, itemsize, 8 * hits / n, "native_select", full=True)
        if total:
            w.stream(hits, 4, 0, "native").scalars(1)
        w.stream(hits, 4, 8)
        return
    w.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 1, "compare", full=True).compact(n, hits)
    if total:
        w.stream(n, itemsize, 0, "reduce", full=True)
    w.gather(hits)


def _count(w: Work, n: int, hits: float, itemsize: int, backend: str) -> None:
    """:func:`compressors.selection.count_above`: on the torch path ``|x|``, the mask,
    ``count_nonzero`` and its sync; natively a selection (:func:`_select`)."""
    if backend == "native":
        _select(w, n, hits, itemsize, backend)
        return
    w.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 1, "compare", full=True)
    w.stream(n, 1, 0, "count", full=True).sync()


def _hits(hits: Sequence[float], i: int, default: float) -> float:
    """Elements kept by selecting pass ``i`` of a call: the recorded count when there is one."""
    return float(hits[i]) if i < len(hits) else default


def _topk(n, density, itemsize, stages, rounds, backend, hits=()):
    """Exact Top-k (:func:`compressors.selection.exact_topk`) on a CPU (torch or native
    selection): a threshold guess from a strided sample, the candidates above it (``rounds``
    halvings of the guess while too few), ``torch.topk`` among the candidates. ``n`` < 2¹⁴ or ``k ≥ n/4``: ``torch.topk``
    over ``|g|``, as on CUDA (``backend="cuda"``)."""
    k = target_count(density, n)
    c = Work()
    if backend == "cuda" or 4 * k >= n or n < 4 * TOPK_SAMPLE:
        c.stream(n, itemsize, itemsize, full=True).select_topk(n, k).sort(k)
        c.stream(n, itemsize, 0, "reduce", full=True).gather(k)
    else:
        stride = max(1, n // max(TOPK_SAMPLE, math.ceil(20 * n / k)))
        sample = math.ceil(n / stride)
        top = min(sample, math.ceil(1.5 * sample * k / n) + 3)
        candidates = n * min(1.0, 1.2 * k / n)
        c.stream(sample, itemsize, itemsize).allocate(sample * itemsize).select_topk(sample, top)
        c.stream(top, itemsize, 0, "reduce")
        _select(c, n, _hits(hits, 0, candidates), itemsize, backend, total=True)
        c.scalars(SCALAR_OPS["isfinite"]).sync()
        for step in range(rounds):
            c.scalars(2).sync()
            _select(c, n, _hits(hits, step + 1, candidates), itemsize, backend)
        c.select_topk(_hits(hits, rounds, candidates), k).sort(k).gather(k).gather(k).gather(k)
    c.scalars(SCALAR_OPS["finite"]).sync().gather(k).stream(k, itemsize, 0, "reduce")
    return c, _sparse_decompress(n, k, itemsize)


def _randomk(n, density, itemsize, stages, rounds, backend):
    k = target_count(density, n)
    c = Work()
    if 4 * k >= n:
        c.stream(n, 0, 8).sort(k)
    else:
        draw = k + k // 16 + 16
        for _ in range(rounds):
            c.stream(draw, 0, 8).stream(draw, 8, 8).sort(draw).sync()
        c.stream(draw, 0, 8).gather(k).sort(k)
    _finite(c, n, itemsize)
    return c.gather(k), _sparse_decompress(n, k, itemsize)


def _dgc(n, density, itemsize, stages, rounds, backend, trim=True, hits=()):
    """DGC: top ``δ`` of a strided sample of ``|g|`` sets the threshold; the selection
    ``|g| ≥ thr`` (with ``Σ|g|`` for the finiteness check); ``rounds`` lowerings by 0.8 while it
    holds fewer than 0.8·k; ``trim``: an exact top-k among more than 1.3·k."""
    k = target_count(density, n)
    samples = math.ceil(n / sample_stride(n, density, 0.01))
    c = Work().stream(samples, itemsize, itemsize).allocate(samples * itemsize)
    top = max(1, math.ceil(samples * density))
    c.select_topk(samples, top).stream(top, itemsize, 0, "reduce")
    c.scalars(2)
    _select(c, n, _hits(hits, 0, k), itemsize, backend, total=True)
    c.scalars(SCALAR_OPS["finite"]).sync()
    for step in range(rounds):
        c.scalars(2)
        _select(c, n, _hits(hits, step + 1, k), itemsize, backend)
    if trim:
        c.select_topk(1.3 * k, k).gather(k).sort(k)
    return c.gather(k), _sparse_decompress(n, k, itemsize)


def _gaussiank(n, density, itemsize, stages, rounds, backend, hits=()):
    """Gaussian-k: mean and variance of ``g`` (two reductions), the threshold formula, a
    selection, then ``rounds`` corrections each with a new selection, each scaling the float64
    threshold (×1.5 or ×0.5: its finiteness check, widening, choice, product and narrowing)."""
    k = target_count(density, n)
    c = Work().stream(n, itemsize, 0, "reduce", full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.scalars(SCALAR_OPS["gaussian"]).sync().scalars(SCALAR_OPS["gaussian_threshold"])
    _select(c, n, _hits(hits, 0, k), itemsize, backend)
    for step in range(rounds):
        c.scalars(4 + SCALAR_OPS["isfinite"])
        _select(c, n, _hits(hits, step + 1, k), itemsize, backend)
    sent = _hits(hits, rounds, k)
    return c.gather(sent), _sparse_decompress(n, sent, itemsize)


def _redsync(n, density, itemsize, stages, rounds, backend, hits=()):
    """RedSync: ``max|g|`` and ``mean|g|``, then ``rounds`` binary-search probes each counting
    ``|g| > thr`` (one sync each), then the selection at the chosen threshold (≈ 1.5·k hits)."""
    k = target_count(density, n)
    c = Work().stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.scalars(1).stream(n, itemsize, 0, "reduce", full=True).scalars(SCALAR_OPS["redsync_setup"]).sync()
    for step in range(rounds):
        c.scalars(SCALAR_OPS["redsync_probe"])
        _count(c, n, _hits(hits, step, 2 * k), itemsize, backend)
    sent = _hits(hits, rounds, 1.5 * k)
    _select(c, n, sent, itemsize, backend)
    return c.gather(sent), _sparse_decompress(n, sent, itemsize)


POOL_ROOM = 1.75
"""SIDCo's torch path: its pool's slots are ``⌊1.75 × max(previous pool, k)⌋ + 1024`` (as
:data:`compressors.sidco.POOL_ROOM`)."""

POOL_BINS = 256
"""Bins of the histogram of SIDCo's pool that its torch path reads to the host (as
:data:`compressors.sidco.WINDOW`)."""


def _sidco(name):
    def declare(n, density, itemsize, stages, rounds, backend, corrections=8, adapt="count", steps=None, pool=None,
                collects=1):
        planned = len(stage_probabilities(density, stages, 0.25))
        k = target_count(density, n)
        pool = min(n, NATIVE_POOL * k) if pool is None else pool
        if backend == "native":
            steps = (NATIVE_STEPS if steps is None else steps) if corrections and adapt == "count" else 0
            full = min(planned, 2) if rounds is None else rounds
            return (_sidco_native(name, n, itemsize, planned, k, pool, full, steps, collects),
                    _sparse_decompress(n, k, itemsize))
        return (_sidco_torch(name, n, k, itemsize, planned, pool, exact=bool(corrections) and adapt == "count"),
                _sparse_decompress(n, k, itemsize))

    return declare


def _sidco_pool(w: Work, n: int, capacity: int, itemsize: int) -> float:
    """SIDCo's pool on the torch path: ``hardshrink`` of ``g`` at ``pool_at`` into the kept
    buffer, ``nonzero_static`` of it into ``capacity`` slots (a pass over it), the values gathered
    and made magnitudes in place; then its histogram (their float32 bits capped and widened to
    float64 by one ``minimum``, ``histc``), or for float64 data nothing more. Returns
    the bytes of what travels to the host (the histogram, or the pool's values)."""
    whole = capacity >= n
    w.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 8 * capacity / n, full=True)
    w.gather(capacity).stream(capacity, itemsize, itemsize, full=whole)
    if itemsize == 8:
        return capacity * itemsize
    if itemsize != 4:
        w.stream(capacity, itemsize, 4, full=whole)
    w.stream(capacity, 4, 8, full=whole).stream(capacity, 8, 8 * POOL_BINS / capacity, "count", full=whole)
    return 8.0 * POOL_BINS


def _sidco_torch(name: str, n: int, k: int, itemsize: int, planned: int, pool: float, exact: bool = True) -> Work:
    """SIDCo's torch path (any device; :class:`compressors.sidco._TorchOps`), a call after one of
    the same size (its pool guess held: every try inside the pool's histogram or known to select
    too many). No ``|g|`` is materialised, and every statistic is a float64 reduction written
    (``out=``) into one buffer that travels to the host with the pool's histogram (one transfer
    per stage read, nothing concatenated). Stage 1's reductions of ``g`` (``‖g‖₁``; ``‖g‖₂`` for
    SIDCo-P; for SIDCo-GP ``|g|`` into a float32 scratch, clamped and its logarithms taken in
    place, their sum, and ``‖g‖₀``), read with the pool's histogram when there is one stage; with
    more, stage 2's ``hardshrink`` of ``g`` at ``η₁`` and its ``‖·‖₀``, ``‖·‖₁`` (and ``‖·‖₂``
    but for SIDCo-E), read with the pool's histogram; each later stage the same reductions of the
    pool's ``hardshrink`` (one transfer each); without count corrections (``exact`` false:
    ``adapt="paper"`` or ``corrections=0``) the count at the final threshold, the pool's
    ``hardshrink`` and its ``‖·‖₀`` (one transfer); the selection is a ``nonzero_static`` over
    the pool sized by the count the host already has, two gathers. No 0-d arithmetic on the device."""
    capacity = min(n, int(POOL_ROOM * max(pool, k)) + 1024)
    whole = capacity >= n
    c = Work()
    stats = 1
    c.stream(n, itemsize, 0, "reduce", full=True)
    if name == "sidco-p":
        c.stream(n, itemsize, 0, "reduce", full=True)
        stats += 1
    if name == "sidco-gp":
        c.stream(n, itemsize, 4, full=True).stream(n, 4, 4, full=True).stream(n, 4, 4, "log", full=True)
        c.stream(n, 4, 0, "reduce", full=True).stream(n, itemsize, 0, "count", full=True)
        stats += 2
    for m in range(1, planned + 1):
        if m > 1:
            size = capacity if m > 2 else n
            c.stream(size, itemsize, itemsize, full=size >= n)
            c.stream(size, itemsize, 0, "count", full=size >= n).stream(size, itemsize, 0, "reduce", full=size >= n)
            stats = 2
            if name != "sidco-e":
                c.stream(size, itemsize, 0, "reduce", full=size >= n)
                stats += 1
        sent = 8.0 * stats
        if m == min(planned, 2):
            pool_bytes = _sidco_pool(c, n, capacity, itemsize)
            if itemsize == 8:  # the statistics and the pool's values concatenated
                c.stream(stats + capacity, 8, 8, full=stats + capacity >= n)
            sent += pool_bytes
        c.to_host(sent)
    if not exact:
        c.stream(capacity, itemsize, itemsize, full=whole).stream(capacity, itemsize, 0, "count", full=whole).to_host(8)
    c.stream(capacity, itemsize, 1, "compare", full=whole).stream(capacity, 1, 8 * k / capacity, full=whole).gather(k)
    return c.gather(k)


NATIVE_HOST_LAUNCHES = 3
"""Host time of one of SIDCo's native kernels beyond the kernel, in eager operations: its ctypes
call and the stage loop's float algebra around it (measured: SIDCo-E, -P and -GP at one stage on
4,096 gradient-like elements, 8–10 kernels and 2 torch operations per call, 103–143 µs of process
CPU time per call against 3.9 µs per operation of Gaussian-k's compress, 2026-12-02, loaded
machine: 3.0–3.4 operations per kernel)."""


def _sidco_native(name, n, itemsize, stages, k, pool, full_passes, steps, collects=1):
    """SIDCo's native path (``native.scan``: one read pass per kernel, 8 bytes written per
    selected element). Its kernels: stage 1's statistics, one tail per later stage, the count at
    the last stage's threshold, one per correction step the pool answered or that fell below a
    small pool (``steps``: how many, between 0 and ``corrections``; a try below a pool of more
    than (1 + band)·k elements takes no kernel), and the final selection. ``full_passes`` of them
    read the whole vector (by default stage 1's and stage 2's, one of which, ``collects``, also
    collects the pool of ``pool`` candidates above a guess from the previous call; then any try
    that fell below the pool); the others (later stages' statistics too) read only the pool. Host floats throughout: no 0-d operations,
    no synchronisations; each kernel's host time is :data:`NATIVE_HOST_LAUNCHES` launches more."""
    kernels = stages + 2 + steps
    c = Work()
    for i in range(kernels):
        last = i == kernels - 1
        if i < full_passes:
            selecting = i < collects or last
            kind = "native_log" if i == 0 and name == "sidco-gp" else "native_select" if selecting else "native"
            c.stream(n, itemsize, 8 * (k if last else pool if selecting else 0) / n, kind, full=True)
        else:
            c.stream(pool, 8, 8 * k / max(pool, 1) if last else 0, "native_select" if last else "native")
    return c.scalars(NATIVE_HOST_LAUNCHES * kernels).stream(k, 4, 8).gather(k)


def _cast(n, density, itemsize, stages, rounds, backend, half=2):
    """fp16/bf16: the cast into a fresh buffer; off the GPU then ``aminmax`` of the half-width
    values (the finiteness check, and a second check that nothing overflowed the narrower range:
    one sync each); on a GPU (``backend="cuda"``) the cast alone, as PyTorch's hook."""
    c = Work().stream(n, itemsize, half, full=True).allocate(n * half)
    if backend == "cuda":
        return c, Work().stream(n, half, itemsize, full=True)
    c.stream(n, half, 0, "minmax", full=True)
    c.scalars(5)  # max/2 − min/2 in fp32: two widenings, two halvings and the subtraction
    c.scalars(SCALAR_OPS["finite"]).sync().scalars(SCALAR_OPS["isfinite"]).sync()
    return c, Work().stream(n, half, itemsize, full=True)


def _powersgd_factors(n: int) -> tuple[int, int, int]:
    """Rows, columns and rank of PowerSGD's one matrix: the vector as a square of side ⌈√n⌉."""
    side = math.isqrt(max(n - 1, 0)) + 1
    return side, side, min(side, POWERSGD_RANK)


def _powersgd(n, density, itemsize, stages, rounds, backend):
    """PowerSGD, one power iteration on the whole vector as one square matrix (zero-padded to
    ``side²``): ``‖g‖`` for the finiteness check, re-orthogonalise the kept Q, ``P = M·Q``,
    orthogonalise P, ``Q = Mᵀ·P`` (each product one read of M), a copy of Q to send."""
    rows, cols, r = _powersgd_factors(n)
    c = Work().stream(n, itemsize, 0, "reduce", full=True).scalars(SCALAR_OPS["finite"]).sync()
    if rows * cols != n:
        c.stream(rows * cols, 0, itemsize, full=True).allocate(rows * cols * itemsize)
        c.stream(n, itemsize, itemsize, full=True)
    _orthogonalize(c, cols * r, itemsize)
    c.stream(rows * cols, itemsize, r * itemsize / cols, full=True)
    _orthogonalize(c, rows * r, itemsize)
    c.stream(rows * cols, itemsize, r * itemsize / rows, full=True).stream(cols * r, itemsize, itemsize)
    c.flops += 4.0 * rows * cols * r
    return c, _powersgd_expand(n, itemsize)


def _orthogonalize(w: Work, elements: int, itemsize: int) -> None:
    """PyTorch's Gram-Schmidt of one rank-1 factor (its norm, the division) and the NaN clean-up."""
    w.stream(elements, itemsize, 0, "reduce").stream(elements, itemsize, itemsize)
    w.stream(elements, itemsize, itemsize)


def _powersgd_expand(n: int, itemsize: int) -> Work:
    """PowerSGD's decompress into a kept buffer: ``P·Qᵀ`` straight into place when the square
    holds exactly ``n`` elements, else into a fresh padded square and copied (its first ``n``)."""
    rows, cols, r = _powersgd_factors(n)
    d = Work().stream(rows * cols, r * itemsize * (rows + cols) / (rows * cols), itemsize, "outer", full=True)
    if rows * cols != n:
        d.allocate(rows * cols * itemsize).stream(n, itemsize, itemsize, full=True)
    return d


DECLARATIONS = {
    "none": _none, "topk": _topk, "randomk": _randomk, "dgc": _dgc, "gaussiank": _gaussiank,
    "redsync": _redsync, "sidco-e": _sidco("sidco-e"), "sidco-p": _sidco("sidco-p"),
    "sidco-gp": _sidco("sidco-gp"), "fp16": _cast, "bf16": _cast, "powersgd": _powersgd,
}


def work(name: str, numel: int, density: float, *, stages: int | None = None, rounds: int | None = None,
         backend: str = "torch", error_feedback: bool = True, itemsize: int = 4, trim: bool = True,
         corrections: int = SIDCO_CORRECTIONS, adapt: str = "count",
         steps: int | None = None, pool: float | None = None, collects: int = 1,
         hits: Sequence[float] | None = None) -> CallWork:
    """The declared work of one compress and one decompress call of compressor ``name``.

    ``numel`` elements of ``itemsize`` bytes at target ``density``; ``backend``: ``torch`` (eager
    ops; exact Top-k as on a CPU), ``cuda`` (the same, but exact Top-k is one ``torch.topk``) or
    ``native`` (the fused CPU kernels: SIDCo's, and the selection of Top-k, DGC, Gaussian-k
    and RedSync; other compressors ignore it). Data-dependent counts:
    ``stages``: SIDCo's stage count (default :data:`DEFAULT_STAGES`; on the torch/CUDA path the
    planned count, on the native path the stages used); ``rounds``: the loop count of Gaussian-k,
    RedSync, DGC, Top-k and Random-k, and for SIDCo's native path its full passes (default
    :data:`DEFAULT_ROUNDS`);
    ``trim``: DGC ends with an exact top-k among its selection (it does when the selection exceeds
    1.3·k); ``corrections``: SIDCo's in-call correction steps (its torch path always runs all of
    them, masked); ``adapt``: SIDCo's ``adapt`` option (``"paper"``: fixed stage probabilities,
    no corrections); ``steps``: the correction steps SIDCo's native path took (it stops once
    within the band; default :data:`NATIVE_STEPS`); ``pool``: the elements each of its pool
    kernels read (default :data:`NATIVE_POOL` · k); ``collects``: its full passes that also
    collected a pool (default 1, the first); ``hits``: the elements each native selecting pass of
    Top-k, DGC, Gaussian-k and RedSync kept, in order (a selecting pass costs more the more it
    keeps, 0.15 to 0.5 ns per element on this testbed's CPU; defaults: the candidates Top-k
    expects, k for DGC and Gaussian-k, 2·k for each of RedSync's probes).
    """
    if name not in DECLARATIONS:
        raise ValueError(f"no work declared for compressor {name!r}; declared: {', '.join(DECLARATIONS)}")
    if backend not in ("torch", "cuda", "native"):
        raise ValueError(f"backend must be torch, cuda or native, got {backend!r}")
    n = int(numel)
    stages = DEFAULT_STAGES if stages is None else int(stages)
    if rounds is not None:
        rounds = int(rounds)
    elif not name.startswith("sidco"):  # SIDCo's native full passes default to its stage count
        rounds = DEFAULT_ROUNDS.get(name, 0)
    extra = {"trim": trim} if name == "dgc" else {}
    if name in ("topk", "dgc", "gaussiank", "redsync"):
        extra["hits"] = list(hits or ())
    if name.startswith("sidco"):
        extra = {"corrections": corrections, "adapt": adapt, "steps": steps, "pool": pool, "collects": collects}
    compress, decompress = DECLARATIONS[name](n, float(density), itemsize, stages, rounds, backend, **extra)
    if not error_feedback:  # the compressor reads the caller's gradient, written long before the call
        _read_input_cold(compress, n)
    if error_feedback:
        sent = float(hits[-1]) if hits and name in ("gaussiank", "redsync") else None
        compress = _merge(_merge(_ef_in(n, itemsize), compress), _ef_out(name, n, density, itemsize, sent))
    compress.working_set_bytes = (4.0 if error_feedback else 2.0) * n * itemsize
    decompress.working_set_bytes = 2.0 * n * itemsize
    return CallWork(compress, decompress)


def _read_input_cold(w: Work, n: int) -> None:
    """Mark the first full-size read of ``w`` (the gradient handed to the call) as cold."""
    for i, (kind, elements, read, written, _) in enumerate(w.streams):
        if elements == n and read > 0:
            w.streams[i] = (kind, elements, read, written, True)
            return


def _merge(a: Work, b: Work) -> Work:
    return Work(
        a.passes + b.passes, a.bytes_read + b.bytes_read, a.bytes_written + b.bytes_written,
        a.launches + b.launches, a.syncs + b.syncs, a.streams + b.streams, a.topk + b.topk,
        a.sorts + b.sorts, a.gather_elements + b.gather_elements,
        a.compact_elements + b.compact_elements, a.compact_hits + b.compact_hits, a.allocations + b.allocations,
        a.flops + b.flops, host_bytes=a.host_bytes + b.host_bytes,
    )


def wire_bytes(name: str, numel: int, density: float, itemsize: int = 4) -> float:
    """Bytes one worker sends for an ``numel``-element gradient: dense for ``none``, half-width
    values for fp16/bf16, the two PowerSGD factors (the vector as one square matrix), else the
    sparse message of ``k`` values and their indices (:mod:`compressors.wire`)."""
    if name == "none":
        return float(numel * itemsize)
    if name in ("fp16", "bf16"):
        return float(numel * DENSE_ALLREDUCE[name])
    if name == "powersgd":
        rows, cols, r = _powersgd_factors(numel)
        return float((rows + cols) * r * itemsize)
    return float(sparse_bytes(target_count(density, numel), itemsize))


HITS_MARKER = "native.hits:"
"""Prefix of :func:`record_ops`'s marker after each native selection: the elements it kept."""


def record_ops(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``call`` and return its result and the names of the torch operations it dispatched,
    in order (``torch.utils._python_dispatch.TorchDispatchMode``; untimed, for counting), with
    each native selection as ``native.select_above`` followed by the marker ``native.hits:<kept
    elements>`` (not an operation) and each ``native.scan`` kernel as
``native.scan:full`` (over as many elements as the call's first kernel; followed by
``native.scan:collect`` when it also selected) or ``native.scan:pool:<elements>``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from compressors import native

    names: list[str] = []
    select, scan = native.select_above, native.scan
    first: list[int] = []

    def counted_select(*args, **kwargs):
        names.append("native.select_above")
        found = select(*args, **kwargs)
        names.append(f"{HITS_MARKER}{(found[0] if kwargs.get('with_stats') else found).indices.numel()}")
        return found

    def counted_scan(x, **kwargs):
        first.append(x.numel())
        names.append("native.scan:full" if x.numel() >= first[0] else f"native.scan:pool:{x.numel()}")
        if x.numel() >= first[0] and kwargs.get("select") is not None:
            names.append("native.scan:collect")
        return scan(x, **kwargs)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    native.select_above, native.scan = counted_select, counted_scan
    try:
        with torch.no_grad(), Recorder():
            result = call()
    finally:
        native.select_above, native.scan = select, scan
    return result, names


def loop_counts(name: str, ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """The data-dependent loop counts of one call of ``name`` from the operations it dispatched
    (:func:`record_ops`), as :func:`work` takes them (``rounds``, DGC's ``trim``,
    the ``hits`` of each native selection; for SIDCo's native path its full passes
    and, given the ``stages`` it used, its correction ``steps``)."""
    pools = [int(op.rsplit(":", 1)[1]) for op in ops if op.startswith("native.scan:pool:")]
    kernels = ops.count("native.scan:full") + len(pools)
    if name.startswith("sidco") and kernels:
        counts = {"rounds": ops.count("native.scan:full"), "pool": sum(pools) / len(pools) if pools else 0,
                  "collects": ops.count("native.scan:collect")}
        if stages is not None:
            counts["steps"] = kernels - 2 - stages
        return counts
    selections = ops.count("nonzero") + ops.count("native.select_above")
    hits = [int(op[len(HITS_MARKER):]) for op in ops if op.startswith(HITS_MARKER)]
    kept = {"hits": hits} if hits else {}
    if name == "gaussiank":
        return {"rounds": selections - 1, **kept}
    if name == "redsync":
        return {"rounds": ops.count("count_nonzero") + selections - 1, **kept}
    if name == "topk":
        return {"rounds": max(0, selections - 1), **kept}
    if name == "dgc":
        return {"rounds": selections - 1, "trim": ops.count("topk") == 2, **kept}
    if name == "randomk":
        return {"rounds": ops.count("_unique2")}
    return {}
