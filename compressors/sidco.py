"""SIDCo-E, SIDCo-P and SIDCo-GP: statistical thresholds with multi-stage peak-over-threshold.

Stage 1 fits all magnitudes ``a = |g|`` and takes the threshold ``η₁`` for tail mass ``p₁``
(``first_ratio``, 0.25 by default, when ``M > 1`` and ``δ < first_ratio``; otherwise a single stage
with ``p = δ``). Stage ``m`` keeps the exceedances of ``η_{m−1}``, shifts them by ``η_{m−1}``,
refits (exponential stays exponential; SIDCo-P and the later stages of SIDCo-GP use the
generalized Pareto law) and sets ``η_m = η_{m−1} + threshold(p_m)``. Later stages need only the
count and the first two sums of the exceedances, never the exceedances themselves.

Two ways to split the tail mass and to choose ``M`` (option ``adapt``):

- ``"paper"``: the paper's rule. ``p_m = (δ/p₁)^(1/(M−1))`` for every later stage; ``M`` from
  :class:`compressors.adaptive.StageController` (windowed achieved/target ratio, ±``band``).
- ``"count"`` (default): the same fits, but each later stage aims at what is left of the target
  count ``k = max(1, round(δn))``: ``p_m = (k / c_{m−1})^(1/(M−m+1))`` with ``c_{m−1}`` the
  exceedances of ``η_{m−1}`` (clamped at 1: a stage never lowers the threshold). When the final
  count ``c`` still misses ``[k/(1+band), k(1+band)]`` the last stage's tail mass is corrected
  before anything is sent, at most ``corrections`` times: ``ln p ← ln p + ln(k/c)/r``, where
  ``r`` is the observed slope ``d ln c / d ln p`` (1, the fitted law's own, for the first step;
  the secant of the last two tries after that, clamped to [0.1, 10]; a step that leaves the bracket
  of tries known to select too few and too many bisects it instead); the try closest to ``k`` (in
  ``|ln(c/k)|``) is kept. The stage controller starts at one stage and sees the ratios *after*
  the correction, so a stage is added only where the corrections alone do not reach the band:
  every extra stage costs a pass over the whole vector, a correction only a pass over the pool.
  With adaptive stages, a call whose corrected threshold still selects more than ``(1 + band)·k``
  adds up to :data:`EXTRA_STAGES` stages itself (:meth:`SIDCo._deepen`): a Pareto fit with a
  bounded tail cannot reach a tiny tail mass by its quantile alone.

Tie rule: an element is sent when ``|g| > η`` (strictly greater), where every ``η`` is first
rounded to the gradient's dtype; ``Sparse.threshold`` reports that rounded ``η``.
Guards: stages stop when fewer than two exceedances are left to fit (a single exceedance has no
variance) or when a stage would leave no exceedances, keeping the last threshold that selected
something; a final count outside the count rule (:data:`compressors.rules.COUNT_BAND`, or
``ESTIMATOR_BAND`` without corrections: nothing selected, the whole vector, far from ``k``, as on
one huge outlier or a constant vector) sends the exact top-``k`` instead
(:func:`compressors.numerics.selection.guard_count`). NaN/Inf raise ``ValueError``.
Range: when a statistic overflows (huge finite ``|g|``), the whole call is computed on
``g / 2^⌈log₂ max|g|⌉`` (all three fits are scale-equivariant; a power of two keeps every
comparison exact) and the threshold scaled back, so the selection is the one of the scaled data.

One stage loop for both backends (:meth:`SIDCo._chain`): each stage's statistics are read to the
host once, and the fits, the count-targeted split and the correction are scalar algebra on Python
floats there (SciPy's inverse incomplete gamma for SIDCo-GP). The pool, the magnitudes above
``0.9 ×`` the previous call's threshold of the same size (scaled by how ``η₁`` moved), is taken
with the last statistics the plan reads; every later count and the selection come from it, and a
correction's try below a pool of more than ``(1 + band)·k`` elements is known to select too many
without being counted. A try the pool cannot answer is counted by a full pass (that collects a
new pool just below it). What differs is how a backend reads the data: fused C kernels
(:mod:`compressors.kernels.native`) for contiguous float32 CPU tensors (one read pass per stage's
statistics, collecting the pool in the same pass; the counts over the pool by numpy on the host,
without a kernel call), and torch operations for anything else (CUDA,
fp16/bf16/fp64): per stage a few reductions of ``g`` or of one ``hardshrink`` of it written into
one float64 buffer that travels to the host in one transfer, with the pool's histogram when the
pool (gathered by ``nonzero_static`` into a fixed number of slots) is taken; the pool itself stays
on the device. With corrections every count the loop asks for is at a lattice point
(:data:`LATTICE_SHIFT`, :func:`_snap`), which that histogram answers exactly. So a call of ``M``
stages reads the host ``M`` times once a call of the same size has been made (plus one when the
pool overflowed its slots, two when a try fell below it), issues a few dozen kernels and no scalar arithmetic on the device.
The fused path (:mod:`compressors.kernels.sidco_fused`: Triton kernels, the same stage loop, one transfer
per read) reads the gradient twice in a call of one stage and syncs once.
Native and torch agree up to the summation order of the statistics (relative differences of ~1e-7
or less): thresholds agree to that precision and, when equal, so do the selections.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from compressors.numerics import estimators
from compressors.kernels import backends, native
from compressors.work import sidco as sidco_work
from compressors._validate import raise_if_not_finite, target_count
from compressors.adaptive import StageController, max_stages
from compressors.base import Compressor
from compressors.rules import COUNT_BAND, ESTIMATOR_BAND, stage_probabilities
from compressors.numerics.selection import Workspace, guard_count
from compressors.numerics.tails import (F32, GUESS_MARGIN, POOL_REGROW, Moments, Ops, Overflow, Tail, host_count,
                                         host_tail, round_to)
from compressors.work.sidco import CORRECTIONS, POOL_BINS, fused_fits, pool_fetch, pool_slots, ships_values
from compressors.messages.sparse import Sparse
from units import check_count

SLOPE_RANGE = (0.1, 10.0)
"""Clamp of the secant slope ``d ln c / d ln p`` used by the in-call correction."""

LATTICE_SHIFT = 16
"""With corrections (``adapt="count"``) every threshold whose count is tried is first moved to the
nearest point of a lattice: the float32 values whose low 16 bits are zero (7 mantissa bits, so
also exact in bfloat16 and float16; steps of 0.4–0.8 %). A count at a lattice point is what the
torch path's pool histogram (:data:`POOL_BINS` bins) answers exactly without reading the pool;
the native path counts the same tries in its pool, so both backends take the same steps."""

GUESSES = 8
"""Tensor sizes whose last :class:`Guess` a compressor keeps (the least recently compressed size is
forgotten first)."""

EXTRA_STAGES = 3
"""Stages :meth:`SIDCo._deepen` may add within one call when the corrected threshold still
selects too many."""


class Guess(NamedTuple):
    """What the previous call of the same size left for the next: its stage-1 threshold, the
    threshold it selected at, its pool's size (elements), the lowest threshold it needed after
    stage 2's statistics (the chosen one, or a later stage's shift), and whether it added a stage
    within itself (:meth:`SIDCo._deepen` read a tail)."""

    eta1: float
    chosen: float
    pool: int
    low: float
    deepened: bool = False


@dataclass(frozen=True)
class Report:
    """What one call of a SIDCo compressor did (:attr:`SIDCo.last`).

    ``backend``: what ran it (``"native"``, ``"fused"``, ``"torch"`` or ``"cuda"``); ``planned``:
    the stage count it planned; ``deepened``: the stages it added within itself
    (:meth:`SIDCo._deepen`: each a read of a tail; what its work follows, where the message's
    ``stages`` counts the stages that lowered the threshold); ``threshold``: the ``η`` its stage
    loop chose, rounded to the gradient's dtype (the message's threshold unless the count guard sent
    the exact top-``k``); ``estimated``: the count of ``|g| > η`` (elements), before the count guard
    (:func:`compressors.numerics.selection.guard_count`; what the stage controller sees)."""

    backend: str
    planned: int
    deepened: int
    threshold: float
    estimated: int


class _Chain(NamedTuple):
    """What the stage loop (:meth:`SIDCo._chain`) found: the threshold ``η`` (rounded to the
    gradient's dtype), the stages that lowered it, its count, stage 1's ``η₁``, the lowest threshold
    it needed after stage 2's statistics (:attr:`Guess.low`) and the stages it added within itself."""

    threshold: float
    used: int
    count: int
    eta1: float
    low: float
    deepened: int


class _NativeOps(Ops):
    """Fused C kernels (:func:`compressors.kernels.native.scan`); the pool is the compacted
    ``{|g| > pool_at}`` (positions and magnitudes) in reused buffers."""

    def __init__(self, owner: SIDCo, grad: torch.Tensor, logs: bool):
        self.owner, self.grad, self.n, self.logs = owner, grad, grad.numel(), logs
        self.pool: native.Selection | None = None
        self.pool_host: np.ndarray | None = None  # the pool's magnitudes as numpy sees them (no copy)

    def _scan(self, shift: float, pool_at: float | None, logs: bool = False, squares: bool = False) -> native.Scan:
        buffers = self.owner._buffers("pool", self.n) if pool_at is not None else None
        r = native.scan(self.grad, absolute=True, shift=shift, squares=squares, logs=logs, select=pool_at,
                        buffers=buffers)
        if buffers is not None:  # keep the pool
            self.pool, self.pool_at, self.pool_size = r.selection, pool_at, int(r.selection.indices.numel())
            self.pool_host = self.owner._host_view(buffers[1])[:self.pool_size]
        return r

    def first(self, pool_at):
        r = self._scan(0.0, pool_at, self.logs, self.owner.first_needs_var)
        if not (math.isfinite(r.excess) and math.isfinite(r.excess_sq)):
            raise Overflow
        n = self.n
        mean = r.excess / n
        mean_log = estimators.mean_log_from_sums(r.total_log, r.positive, n) if self.logs else 0.0
        return Moments(mean, max(r.excess_sq / n - mean * mean, 0.0), mean_log)

    def tail(self, threshold, pool_at):
        if self.pool is not None and threshold >= self.pool_at:
            r = native.scan(self.pool.magnitudes, absolute=False, shift=threshold, squares=self.owner.tail_needs_var)
        else:
            r = self._scan(threshold, pool_at, squares=self.owner.tail_needs_var)
        return Tail(r.count, r.excess, r.excess_sq)

    def pool_count(self, threshold):
        return native.count_above(self.pool_host, threshold)

    def collect(self, pool_at):
        self._scan(pool_at, pool_at)

    def full_count(self, threshold):
        return native.scan(self.grad, absolute=True, shift=threshold, squares=False).count

    def select(self, threshold, count):
        if self.pool is not None and threshold >= self.pool_at:
            found = native.scan(self.pool.magnitudes, absolute=False, shift=threshold, squares=False, select=threshold,
                                positions=self.pool.indices, buffers=self.owner._buffers("final", self.pool_size))
        else:
            found = native.scan(self.grad, absolute=True, shift=threshold, squares=False, select=threshold,
                                buffers=self.owner._buffers("final", self.n))
        return found.selection.indices.long()


class _TorchOps(Ops):
    """Torch operations on any device, with every statistic a stage needs read to the host in one
    transfer (:meth:`_fetch`): no scalar arithmetic on the device, no data-dependent shapes before
    the host knows them. No ``|g|`` is materialised: stage 1 reduces ``g`` itself (``‖g‖₁``,
    ``‖g‖₂``), and every thresholded pass is one ``hardshrink`` (``g`` where ``|g| > η``, else 0,
    the strict comparison of the tie rule) into a reused buffer of ``n + 1`` elements whose last
    one stays 0: a later stage's count, ``Σ|g|`` and ``‖·‖₂`` are reductions of it. The pool
    (``nonzero_static`` of it into ``pool_capacity`` slots, the spare slots pointing at that 0,
    the gathered values made magnitudes in place) stays on the device; what travels to the host
    with the statistics of the stage it is taken with is its histogram over :data:`POOL_BINS`
    lattice steps from its level (the float32 bits of the magnitudes, capped at the window's top
    and widened exactly to float64 by one ``minimum``, binned by ``histc`` at bin edges the bits
    cannot fall on), from which the count above any
    lattice point in the window is exact on the host. Float64 data ship the pool's values instead,
    and so does a pool of at most :data:`~compressors.work.sidco.SHIP_SLOTS` slots after a call of
    the same size that added a stage within itself: that stage's statistics and every count are
    then read on the host. A later stage's statistics from the pool, and a count the histogram cannot answer,
    are reductions of the pool read in one more transfer. The selection is a ``nonzero_static``
    over the pool sized by the count the host already has."""

    def __init__(self, owner: SIDCo, grad: torch.Tensor, logs: bool, variance: bool, capacity: int | None,
                 ship: bool = False):
        self.grad, self.logs, self.variance, self.n = grad, logs, variance, grad.numel()
        self.ws = owner._workspace
        self.owner_top, self.top_tensor = owner._top
        self.padded = owner._shrink_buffer(grad)
        self.shrunk = self.padded[:self.n]
        self.pool_capacity = capacity
        self.pool_positions: torch.Tensor | None = None
        self.pool_values: torch.Tensor | None = None
        self.histogram = grad.dtype != torch.float64 and not ship
        self.host_pool: np.ndarray | None = None  # the pool's values on the host, when they travel
        self.above: np.ndarray | None = None  # the pool's count above lattice point lowest + i
        self.lowest = 0

    def _shrink(self, threshold: float) -> torch.Tensor:
        """``g`` where ``|g| > threshold``, else 0, in the kept buffer."""
        return torch.ops.aten.hardshrink.out(self.grad, threshold, out=self.shrunk)

    def _gather_pool(self, pool_at: float, capacity: int | None, packet: torch.Tensor | None) -> torch.Tensor | None:
        """The pool on the device, and what of it travels to the host: its histogram, written into
        ``packet`` (or, when values travel, its values, returned)."""
        kept = self._shrink(pool_at)
        if capacity is None:  # sized by the device: its own transfer
            self.pool_positions = torch.nonzero(kept).squeeze(1)
        else:
            slots = self.ws.at_least("pool-positions", capacity, torch.int64, kept.device).view(-1, 1)
            self.pool_positions = torch.nonzero_static(kept, size=capacity, fill_value=self.n,
                                                       out=slots).squeeze(1)
        size = self.pool_positions.numel()
        values = self.ws.at_least("pool-values", size, kept.dtype, kept.device)
        self.pool_values = torch.abs_(torch.index_select(self.padded, 0, self.pool_positions, out=values))
        if not self.histogram:
            return self.pool_values
        self.lowest = _U32.unpack(F32.pack(pool_at))[0] >> LATTICE_SHIFT
        top_bits = min((self.lowest + POOL_BINS) << LATTICE_SHIFT, 0x7F7F0000)
        narrow = self.pool_values if self.pool_values.dtype == torch.float32 else \
            self.ws.at_least("pool-f32", size, torch.float32, kept.device).copy_(self.pool_values)
        self.owner_top[...] = top_bits  # a host scalar the device reads at launch (no transfer, no kernel)
        wide = torch.minimum(narrow.view(torch.int32), self.top_tensor,
                             out=self.ws.at_least("pool-bits", size, torch.float64, kept.device))
        low = (self.lowest << LATTICE_SHIFT) + 0.5
        torch.histc(wide, bins=POOL_BINS, min=low, max=low + float(POOL_BINS << LATTICE_SHIFT), out=packet)
        return None

    def _fetch(self, stats: Callable[[torch.Tensor], None], count: int, pool_at: float | None,
               capacity: int | None = None) -> np.ndarray:
        """One device→host transfer: ``stats`` writes ``count`` float64 statistics into the slots
        it is given (reductions with ``out=``), followed by the histogram of the pool above
        ``pool_at`` (or the pool's values, concatenated, widened to float64); returns the statistics."""
        device = self.grad.device
        extra = POOL_BINS if pool_at is not None and self.histogram else 0
        packet = self.ws.at_least("to-host", count + extra, torch.float64, device)
        stats(packet)
        pool = self._gather_pool(pool_at, capacity, packet[count:]) if pool_at is not None else None
        if pool is not None:  # the pool's values follow the statistics
            both = self.ws.at_least("to-host-pool", count + pool.numel(), torch.float64, device)
            packet = torch.cat([packet[:count], pool], out=both)
        host = packet.cpu().numpy()  # on a CPU the packet itself: read it before another transfer reuses it
        values = host[:count].copy()
        if pool_at is not None:
            summary = host[count:]
            size = int(summary.sum()) if self.histogram else int(np.count_nonzero(summary))
            if capacity is not None and size == capacity < self.n:  # full: more lie above pool_at than it holds
                self._fetch(lambda out: None, 0, pool_at, min(self.n, POOL_REGROW * capacity))
            else:
                self.pool_at, self.pool_size = pool_at, size
                if self.histogram:
                    self.above = np.cumsum(summary[::-1])[::-1]
                else:
                    self.host_pool = summary.copy()
        return values

    def first(self, pool_at):
        g, acc = self.grad, torch.float64

        def stats(out: torch.Tensor) -> None:
            torch.linalg.vector_norm(g, 1, dtype=acc, out=out[0])
            if self.variance:
                torch.linalg.vector_norm(g, 2, dtype=acc, out=out[1])
            if self.logs:
                log_sum(g, self.ws, out[1 + self.variance])
                torch.linalg.vector_norm(g, 0, dtype=acc, out=out[2 + self.variance])

        values = self._fetch(stats, 1 + self.variance + 2 * self.logs, pool_at, self.pool_capacity)
        total = float(values[0])
        if not math.isfinite(total) or (self.variance and not math.isfinite(values[1])):
            raise Overflow
        n = self.n
        mean = total / n
        var = max(_square(float(values[1])) / n - mean * mean, 0.0) if self.variance else 0.0
        mean_log = estimators.mean_log_from_sums(float(values[-2]), int(values[-1]), n) if self.logs else 0.0
        return Moments(mean, var, mean_log)

    def tail(self, threshold, pool_at):
        if self.host_pool is not None and threshold >= self.pool_at:  # on the host, from the pool
            return host_tail(self.host_pool, threshold)
        if self.above is not None and threshold >= self.pool_at:  # reductions of the pool's kept
            kept = torch.ops.aten.hardshrink.out(self.pool_values, threshold, out=self.ws.at_least(
                "pool-kept", self.pool_values.numel(), self.pool_values.dtype, self.grad.device))
            pool_at = None
        else:  # g where |g| > threshold, else 0: the count, Σ|·| and ‖·‖₂ of the kept are those of the excess, shifted
            kept = self._shrink(threshold)
        orders = (0, 1, 2) if self.variance_tail else (0, 1)

        def stats(out: torch.Tensor) -> None:
            for i, order in enumerate(orders):
                torch.linalg.vector_norm(kept, order, dtype=torch.float64, out=out[i])

        values = self._fetch(stats, len(orders), pool_at, self.pool_capacity)
        count, total = int(values[0]), float(values[1])
        excess = max(total - count * threshold, 0.0)
        square = max(_square(float(values[2])) - 2.0 * threshold * total + count * threshold * threshold, 0.0) \
            if self.variance_tail else 0.0
        return Tail(count, excess, square)

    def pool_count(self, threshold):
        if self.host_pool is not None:
            return host_count(self.host_pool, threshold)
        j = _lattice_index(threshold)
        if j is not None and 0 <= j - self.lowest < POOL_BINS and j << LATTICE_SHIFT < 0x7F7F0000:
            return int(self.above[j - self.lowest])
        kept = torch.ops.aten.hardshrink.out(self.pool_values, threshold, out=self.ws.at_least(
            "pool-kept", self.pool_values.numel(), self.pool_values.dtype, self.grad.device))
        return int(self._fetch(lambda out: torch.linalg.vector_norm(kept, 0, dtype=torch.float64, out=out[0]), 1,
                               None)[0])

    def collect(self, pool_at):
        self._fetch(lambda out: None, 0, pool_at)

    def full_count(self, threshold):
        kept = self._shrink(threshold)
        return int(self._fetch(lambda out: torch.linalg.vector_norm(kept, 0, dtype=torch.float64, out=out[0]), 1,
                               None)[0])

    def select(self, threshold, count):
        if self.pool_values is not None and threshold >= self.pool_at:
            above = self.ws.at_least("pool-mask", self.pool_values.numel(), torch.bool, self.grad.device)
            chosen = torch.nonzero_static(torch.gt(self.pool_values, threshold, out=above), size=count).squeeze(1)
            return self.pool_positions.index_select(0, chosen)
        return torch.nonzero_static(self._shrink(threshold), size=count).squeeze(1)


def log_sum(g: torch.Tensor, ws: Workspace, out: torch.Tensor) -> None:
    """``Σ ln max(|g|, LOG_FLOOR)`` into the 0-d float64 ``out`` (SIDCo-GP's first statistic):
    ``|g|`` into a float32 scratch of ``ws`` (float64 for float64 data), clamped, logarithms taken
    in place, summed in float64."""
    work = torch.float64 if g.dtype == torch.float64 else torch.float32
    scratch = ws.get("log", g.numel(), work, g.device)
    logs = torch.abs(g, out=scratch) if g.dtype == work else scratch.copy_(g).abs_()
    torch.sum(logs.clamp_(min=estimators.LOG_FLOOR).log_(), 0, dtype=torch.float64, out=out)


def _finite(threshold: float, dtype: torch.dtype) -> float:
    """A fitted threshold rounded to ``dtype``; one that overflows it (huge finite ``|g|``, whose
    statistics fit in the host's float64) means the call is redone on scaled data."""
    rounded = round_to(threshold, dtype)
    if not math.isfinite(rounded):
        raise Overflow
    return rounded


_CPU = torch.device("cpu")
_U32 = struct.Struct("<I")
def _square(norm: float) -> float:
    """``norm²`` of a float64 L2 norm read to the host; one beyond float64's range (the norm of
    float64 values near their maximum) means the call is redone on scaled data."""
    square = norm * norm
    if not math.isfinite(square):
        raise Overflow
    return square


def _snap(threshold: float, dtype: torch.dtype) -> float:
    """``threshold`` moved to the nearest lattice point (:data:`LATTICE_SHIFT`), rounded to
    ``dtype``; one beyond float32's finite range (or not positive) is left as it is. A point
    beyond ``dtype``'s range (65,504 snaps to 65,536, infinite in float16) means the call is redone
    on scaled data, as for a fit that overflows (:func:`_finite`)."""
    if not 0 < threshold < 3.0e38:
        return threshold
    bits = _U32.unpack(F32.pack(threshold))[0]
    bits = ((bits + (1 << (LATTICE_SHIFT - 1))) >> LATTICE_SHIFT) << LATTICE_SHIFT
    point = F32.unpack(_U32.pack(bits))[0]
    return point if dtype is torch.float32 else _finite(point, dtype)  # a lattice point is a float32


def _lattice_index(threshold: float) -> int | None:
    """``j`` when ``threshold`` is the lattice point with float32 bits ``j << LATTICE_SHIFT``."""
    if not 0 <= threshold < 3.0e38:
        return None
    bits = _U32.unpack(F32.pack(threshold))[0]
    exact = F32.unpack(_U32.pack(bits))[0] == threshold
    return bits >> LATTICE_SHIFT if exact and not bits & ((1 << LATTICE_SHIFT) - 1) else None


class SIDCo(Compressor):
    """Base of the three SIDCo variants; subclasses provide the first- and later-stage fits.

    Options: ``stages`` — an int from 1 to ``⌈log₂(1/δ)⌉`` (any int ≥ 1 at ``δ ≥ first_ratio``,
    where one stage is used) or ``"adaptive"`` (default; see
    :class:`compressors.adaptive.StageController`); ``adapt`` — ``"count"`` (default) or
    ``"paper"`` (module docstring); ``corrections`` — at most this many in-call corrections of the
    last stage (``adapt="count"`` only; default 8, 0 disables); ``first_ratio`` — tail mass of
    stage 1 in (0, 1) (default 0.25); ``window`` and ``band`` of the adaptive controller (5 calls,
    ±20 %; ``band`` is also the in-call correction's band); ``backend`` — ``"auto"`` (default: the
    fused C kernels for contiguous float32 CPU tensors when they are available, the fused Triton
    kernels for CUDA float32/16/bf16 tensors when Triton is installed, torch otherwise),
    ``"torch"`` (always the torch path) or ``"fused"`` (the Triton kernels wherever
    :func:`compressors.kernels.fused.serves` allows: also CPU tensors under ``TRITON_INTERPRET=1``,
    as the tests run them; needs Triton; ``"auto"`` leaves a gradient whose pool would exceed
    :data:`~compressors.work.sidco.FUSED_SLOTS` to the eager path). After a call, :attr:`last` is
    its :class:`Report` (what ran it, the stages it planned and added, its threshold and count
    before the count guard; ``None`` before the first call) and :attr:`backend` names what ran it,
    as for every compressor.
    """

    name = "sidco"
    first_needs_var = False
    first_needs_log = False
    tail_needs_var = True

    def __init__(self, density: float, stages: int | str = "adaptive", first_ratio: float = 0.25,
                 window: int = 5, band: float = 0.2, backend: str = "auto", adapt: str = "count",
                 corrections: int = CORRECTIONS):
        super().__init__(density)
        self.backend_choice = backends.check(backend)
        self.last: Report | None = None
        if adapt not in ("count", "paper"):
            raise ValueError(f"adapt must be 'count' or 'paper', got {adapt!r}")
        self.adapt = adapt
        if isinstance(corrections, bool) or not isinstance(corrections, int) or corrections < 0:
            raise ValueError(f"corrections must be an int >= 0, got {corrections!r}")
        self.corrections = corrections if adapt == "count" else 0
        if isinstance(first_ratio, bool) or not isinstance(first_ratio, (int, float)) or not 0 < first_ratio < 1:
            raise ValueError(f"first_ratio must be in (0, 1), got {first_ratio!r}")
        self.first_ratio = float(first_ratio)
        if isinstance(band, bool) or not isinstance(band, (int, float)) or not 0 < band < 1:
            raise ValueError(f"band must be in (0, 1), got {band!r}")
        self.band = float(band)
        self.controller: StageController | None = None
        self.fixed_stages: int | None = None
        if stages == "adaptive":
            check_count(window, "window")
            self.controller = StageController(self.density, window=window, band=self.band)
        elif isinstance(stages, int) and not isinstance(stages, bool) and stages >= 1:
            if self.density < self.first_ratio and stages > max_stages(self.density):
                raise ValueError(f"stages={stages} is more than density {self.density:g} allows: at most "
                                 f"{max_stages(self.density)} (⌈log₂(1/δ)⌉, the bound the adaptive stages keep to as well)")
            self.fixed_stages = stages
        else:
            raise ValueError(f"stages must be an int >= 1 or 'adaptive', got {stages!r}")
        self._workspace = Workspace()
        self._guesses: dict[int, Guess] = {}
        self._counters: dict[torch.device, object] = {}  # the fused path's, per device (sidco_fused._Counters)
        self._padded: dict[tuple, torch.Tensor] = {}
        self._viewed: torch.Tensor | None = None  # the buffer whose numpy view _view is
        self._view: np.ndarray | None = None
        top = np.zeros((), dtype=np.int32)
        self._top = (top, torch.from_numpy(top))  # the torch path's histogram cap, a 0-d host int32

    @property
    def stages(self) -> int:
        """Stage count the next call will use."""
        if self.controller is not None:
            return self.controller.stages
        return self.fixed_stages

    def first_threshold(self, moments: Moments, p: float) -> float:
        """Stage-1 threshold for tail mass ``p`` from the moments of all magnitudes."""
        raise NotImplementedError

    def first_quantile(self, moments: Moments) -> Callable[[float], float]:
        """:meth:`first_threshold` of ``moments`` as a function of the tail mass alone (the
        correction tries several of one fit)."""
        return lambda p: self.first_threshold(moments, p)

    def tail_threshold(self, moments: Moments, p: float) -> float:
        """Later-stage threshold (above the shift) from the moments of the shifted exceedances."""
        return estimators.gpareto_threshold(moments.mean, moments.var, p)

    def _compress(self, grad: torch.Tensor) -> Sparse:
        exactly_above = None
        try:
            sparse, report = self._run(grad)
            if report.backend == "fused" and not sparse.fallback:  # FusedOps.select: exactly |x| > η
                exactly_above = float(sparse.threshold)
        except Overflow:
            sparse, report = self._rescaled(grad)
        self.last, self.backend, self._exactly_above = report, report.backend, exactly_above
        if self.controller is not None:
            self.controller.observe(max(report.estimated, 1), grad.numel())
        return sparse

    def _run(self, grad: torch.Tensor, remember: bool = True) -> tuple[Sparse, Report]:
        """One call on ``grad``: the message and the call's :class:`Report`. Raises
        :class:`~compressors.numerics.tails.Overflow` where a statistic overflowed on finite data
        (:meth:`_rescaled` redoes the call on scaled data)."""
        n = grad.numel()
        guess = self._guesses.get(n) if remember else None
        k = target_count(self.density, n)
        capacity = None if guess is None else pool_slots(n, guess.pool, k)
        planned = self.stages
        ops: Ops | None = None
        chained = None
        if self.backend_choice == "auto" and native.usable(grad):
            ops, backend = _NativeOps(self, grad, self.first_needs_log), "native"
        elif self._fused(grad):
            from compressors.kernels.sidco_fused import FusedOps  # imports Triton: only where the fused path runs

            try:
                fetched = None if guess is None else pool_fetch(n, guess.pool, k)
                ops, backend = FusedOps(self, grad, self.first_needs_log, self.first_needs_var, capacity,
                                        fetched), "fused"
                chained = self._chain(ops, n, planned, grad.dtype, guess)
            except Overflow:  # a float32 statistic overflowed: the eager path decides (rescales or refuses)
                ops = None
        if ops is None:
            ship = guess is not None and ships_values(guess.deepened, capacity)
            ops = _TorchOps(self, grad, self.first_needs_log, self.first_needs_var, capacity, ship)
            ops.variance_tail = self.tail_needs_var
            backend = "cuda" if grad.device.type == "cuda" else "torch"
        if chained is None:
            chained = self._chain(ops, n, planned, grad.dtype, guess)
        threshold, count, eta1 = chained.threshold, chained.count, chained.eta1
        if remember and threshold > 0 and eta1 > 0 and math.isfinite(eta1):
            guesses = self._guesses
            if guesses.pop(n, None) is None and len(guesses) >= GUESSES:  # forget the least recent size
                del guesses[next(iter(guesses))]
            guesses[n] = Guess(eta1, threshold, ops.pool_size, chained.low, chained.deepened > 0)
        indices = ops.select(threshold, count) if count else torch.empty(0, dtype=torch.int64, device=grad.device)
        band = COUNT_BAND if self.corrections else ESTIMATOR_BAND
        indices, reported, fallback = guard_count(grad, indices, count, threshold, target_count(self.density, n),
                                                  self._workspace, band)
        return (Sparse(ops.values(grad, indices), indices, n, reported, chained.used, fallback=fallback),
                Report(backend, planned, chained.deepened, threshold, count))

    def _folds_feedback(self, grad: torch.Tensor) -> bool:
        """The fused path folds error feedback in (:meth:`Compressor.compress_feedback`): its
        statistics kernel reads ``grad`` and ``residual`` (zeroing ``|r| > pending`` as it reads)
        and writes their sum (the gradient's dtype, rounded as ``torch.add``), the call's first
        read; the message's threshold comes back as ``η`` where it selected exactly ``|x| > η``."""
        return self._fused(grad)

    def _fused(self, grad: torch.Tensor) -> bool:
        """Whether this call runs the fused path (:mod:`compressors.kernels.sidco_fused`): asked for
        (``backend="fused"``) or, with ``"auto"``, on a CUDA tensor, where it serves the tensor."""
        if self.backend_choice == "torch" or (self.backend_choice == "auto" and not grad.is_cuda):
            return False
        if self.backend_choice == "auto":  # a pool too large to ship to the host: the eager path
            n, guess = grad.numel(), self._guesses.get(grad.numel())
            if not fused_fits(n, 0 if guess is None else guess.pool, target_count(self.density, n)):
                return False
        return backends.fused_serves(grad)

    def _chain(self, ops: Ops, n: int, stages: int, dtype: torch.dtype, guess: Guess | None) -> _Chain:
        """Thresholds of every stage and the in-call correction, on host floats, every η rounded to
        ``dtype``.

        The pool is taken with stage 1's statistics when there is one stage, at
        :data:`GUESS_MARGIN` × the previous call's chosen threshold; with more, with stage 2's, at
        :data:`GUESS_MARGIN` × the lowest threshold the previous call needed after them (its
        chosen one or a later stage's shift) scaled by how ``η₁`` moved: every later stage's
        statistics then come from the pool.
        """
        # Step 1: split the density into one exceedance probability per stage.
        k = target_count(self.density, n)
        probs = stage_probabilities(self.density, stages, self.first_ratio)
        last = len(probs) - 1
        # Step 2: stage 1 fits the whole |g| (one read; the pool too when there is one stage).
        pool_at = round_to(GUESS_MARGIN * guess.chosen, dtype) if guess is not None and not last else None
        moments = ops.first(pool_at)
        quantile = self.first_quantile(moments)
        fit: Callable[[float], float] = lambda p: _finite(quantile(p), dtype)  # noqa: E731
        t = eta1 = fit(probs[0])
        log_p, used, count, exact = math.log(probs[0]), 1, None, True
        previous = None  # the accepted stage before t's: (t, its count, its fit, ln p, stages used)
        low = math.inf  # the lowest threshold needed after stage 2's statistics
        # Step 3: each later stage fits the exceedances over the previous stage's threshold
        # (peak over threshold), adapting its probability to what that threshold kept.
        for m in range(1, len(probs)):
            pool_at = None
            if m == 1 and guess is not None and guess.eta1 > 0:
                pool_at = round_to(GUESS_MARGIN * guess.low * eta1 / guess.eta1, dtype)
            if m > 1:
                low = min(low, t)
            tail = ops.tail(t, pool_at)
            if previous is not None and tail.count == 0:  # t selects nothing: keep the stage before
                t, count, fit, log_p, used = previous
                break
            count, previous = tail.count, (t, tail.count, fit, log_p, used)
            if tail.count < 2:
                break
            if self.adapt == "paper":
                p = probs[m]
            else:
                p = min(1.0, k / max(tail.count, 1)) ** (1.0 / (len(probs) - m))
            fit = self._stage_fit(t, tail, dtype)
            t, log_p, used = fit(p), math.log(p), used + (p < 1)
            count = None
        # Step 4: count what the last threshold selects (from the pool where it answers).
        if count is None:
            if self.corrections:
                t = _snap(t, dtype)
                count, exact = ops.probe(t, k * (1.0 + self.band))
            else:
                count, exact = ops.count(t), True
            if count == 0 and previous is not None:
                t, count, fit, log_p, used = previous
        # Step 5: correct the threshold toward k within the band; add stages if it still overshoots.
        deepened = 0
        if self.corrections:
            t, count = self._correct(ops, fit, t, count, exact, log_p, k, dtype)
            t, count, used, deepened = self._deepen(ops, t, count, used, k, dtype)
        return _Chain(t, used, count, eta1, min(low, t), deepened)

    def _deepen(self, ops: Ops, t: float, count: int, used: int, k: int,
                dtype: torch.dtype) -> tuple[float, int, int, int]:
        """Stages added within the call while the corrected threshold still selects more than
        ``(1 + band)·k``: a fit whose tail is bounded (the generalized Pareto law with ξ < 0, as
        on light-tailed data at a tiny density) cannot reach a small enough tail mass by moving
        its quantile, but the fit of its own exceedances (one more peak-over-threshold stage) can.
        Only with adaptive stages (a fixed ``stages`` is a promise), at most :data:`EXTRA_STAGES`
        and never past the controller's stage limit; each reads the exceedances of ``t`` (from the
        pool when it holds them) and is corrected like the last stage. Returns (η, its count,
        stages used, tails read)."""
        deepened = 0
        if self.controller is None:
            return t, count, used, deepened
        for _ in range(EXTRA_STAGES):
            if count <= k * (1.0 + self.band) or used >= self.controller.upper:
                break
            tail = ops.tail(t, None)
            deepened += 1
            if tail.count < 2:
                break
            fit = self._stage_fit(t, tail, dtype)
            p = min(1.0, k / tail.count)
            candidate = _snap(fit(p), dtype)
            found, exact = ops.probe(candidate, k * (1.0 + self.band))
            candidate, found = self._correct(ops, fit, candidate, found, exact, math.log(p), k, dtype)
            if found == 0 or found >= count:
                break
            t, count, used = candidate, found, used + 1
        return t, count, used, deepened

    def _stage_fit(self, base: float, tail: Tail, dtype: torch.dtype) -> Callable[[float], float]:
        moments = tail.moments()
        return lambda p: _finite(base + self.tail_threshold(moments, p), dtype)

    def _correct(self, ops: Ops, fit, t: float, count: int, exact: bool, log_p: float, k: int,
                 dtype: torch.dtype) -> tuple[float, int]:
        """Safeguarded secant steps on ``ln p`` of the last stage until its count is within the band.

        Each step moves ``ln p`` by ``ln(k/c)/r`` (``r`` the slope: 1, then the secant of the last
        two tries); a step leaving the bracket of tries known to under- and over-select bisects it
        instead. The try closest to ``k`` among those counted exactly is kept (``exact``: whether
        ``count`` is ``t``'s, or a lower bound of a ``t`` below the pool that selects too many).
        Every try is a lattice point (:func:`_snap`).
        """
        limit = math.log1p(self.band)
        enough = k * (1.0 + self.band)
        log_k = math.log(k)
        err = math.log(max(count, 0.5)) - log_k
        best_t, best_count, best_err = (t, count, abs(err)) if exact else (t, None, math.inf)
        slope = 1.0
        under = log_p if err < 0 else -math.inf  # ln p known to select too few
        over = log_p if err > 0 else math.inf    # ln p known to select too many
        prev_log_p, prev_err, prev_exact, cur_exact = log_p, err, exact, exact
        counted = 0  # tries taken as "too many" without a count do not use up the corrections
        for step in range(self.corrections + Ops.bounds_left):
            if best_err <= limit or counted == self.corrections:
                break
            if step and prev_exact and cur_exact:  # a secant through two counted tries
                dx = log_p - prev_log_p
                if abs(dx) > 1e-12:
                    slope = min(max((err - prev_err) / dx, SLOPE_RANGE[0]), SLOPE_RANGE[1])
            new_log_p = min(log_p - err / slope, 0.0)
            if math.isfinite(under) and math.isfinite(over) and (new_log_p <= under or new_log_p >= over):
                new_log_p = 0.5 * (under + over)
            candidate = _snap(fit(math.exp(new_log_p)), dtype)
            cand_count, exact = ops.probe(candidate, enough)
            counted += exact
            cand_err = math.log(max(cand_count, 0.5)) - log_k  # a lower bound when not exact
            prev_log_p, prev_err, prev_exact, cur_exact = log_p, err, cur_exact, exact
            log_p, err = new_log_p, cand_err
            if cand_err < 0:
                under = max(under, new_log_p)
            elif cand_err > 0:
                over = min(over, new_log_p)
            if exact and abs(cand_err) < best_err:
                best_t, best_count, best_err = candidate, cand_count, abs(cand_err)
        if best_count is None:  # no try was counted: count the stage's own threshold
            best_count = ops.count(best_t)
        return best_t, best_count

    def _buffers(self, name: str, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reused (int32, float32) selection buffers of at least ``numel`` elements for the native path."""
        return (self._workspace.grown(name + "-idx", numel, torch.int32, _CPU),
                self._workspace.grown(name + "-mag", numel, torch.float32, _CPU))

    def _host_view(self, buf: torch.Tensor) -> np.ndarray:
        """``buf.numpy()`` (a CPU buffer's memory as numpy sees it, no copy), made once per reused
        buffer of :meth:`_buffers` and kept."""
        if self._viewed is not buf:
            self._viewed, self._view = buf, buf.numpy()
        return self._view

    def _shrink_buffer(self, grad: torch.Tensor) -> torch.Tensor:
        """A reused buffer of ``n + 1`` elements of ``grad``'s dtype whose last one is 0 (set once):
        the torch path's thresholded copies of ``grad`` go into its first ``n``."""
        key = (grad.numel(), grad.dtype, grad.device)
        buf = self._padded.get(key)
        if buf is None:
            if len(self._padded) >= 4:
                del self._padded[next(iter(self._padded))]
            buf = torch.zeros(grad.numel() + 1, dtype=grad.dtype, device=grad.device)
            self._padded[key] = buf
        return buf

    def _rescaled(self, grad: torch.Tensor) -> tuple[Sparse, Report]:
        """The call on ``grad / 2^⌈log₂ max|g|⌉`` (after checking for NaN/Inf), thresholds (the
        message's and the report's) scaled back.

        The power of two is applied as two halves of its exponent (each a normal float: 2^1024,
        the scale of fp64 values near their maximum, is not one), so scaling stays exact."""
        raise_if_not_finite(grad)
        exponent = math.frexp(float(torch.amax(grad.abs())))[1]
        half = exponent // 2
        scaled, report = self._run(grad * math.ldexp(1.0, -half) * math.ldexp(1.0, half - exponent), remember=False)
        back = _scaled_back(scaled.threshold, exponent, grad.dtype)
        return (Sparse(grad.index_select(0, scaled.indices), scaled.indices, grad.numel(), back, scaled.stages,
                       fallback=scaled.fallback),
                replace(report, threshold=_scaled_back(report.threshold, exponent, grad.dtype)))


def _scaled_back(threshold: float, exponent: int, dtype: torch.dtype) -> float:
    """A threshold of data scaled by ``2^-exponent`` (:meth:`SIDCo._rescaled`) on the data's own
    scale, rounded to ``dtype`` (the largest finite value where it overflows)."""
    try:
        back = math.ldexp(threshold, exponent)
    except OverflowError:
        back = math.inf
    return round_to(min(back, torch.finfo(dtype).max), dtype)


class SIDCoE(SIDCo):
    """SIDCo-E: exponential fit of ``|g|`` (double-exponential ``g``), ``η = μ·ln(1/p)`` per stage."""

    name = "sidco-e"
    tail_needs_var = False
    work = staticmethod(sidco_work.DECLARES["sidco-e"].work)

    def first_threshold(self, moments, p):
        return estimators.exponential_threshold(moments.mean, p)

    def tail_threshold(self, moments, p):
        return estimators.exponential_threshold(moments.mean, p)


class SIDCoP(SIDCo):
    """SIDCo-P: generalized Pareto (moments) fit of ``|g|`` in every stage."""

    name = "sidco-p"
    first_needs_var = True
    work = staticmethod(sidco_work.DECLARES["sidco-p"].work)

    def first_threshold(self, moments, p):
        return estimators.gpareto_threshold(moments.mean, moments.var, p)


class SIDCoGP(SIDCo):
    """SIDCo-GP: gamma fit (approximate MLE of the shape, true ``Q⁻¹``) in stage 1, generalized
    Pareto in later stages."""

    name = "sidco-gp"
    first_needs_log = True
    work = staticmethod(sidco_work.DECLARES["sidco-gp"].work)

    def first_threshold(self, moments, p):
        return estimators.gamma_threshold(moments.mean, moments.mean_log, p)

    def first_quantile(self, moments):
        alpha = estimators.gamma_shape(moments.mean, moments.mean_log)  # once per fit, not per try
        return lambda p: estimators.gamma_quantile(moments.mean, alpha, p)
