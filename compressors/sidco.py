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

Tie rule: an element is sent when ``|g| > η`` (strictly greater), where every ``η`` is first
rounded to the gradient's dtype; ``Sparse.threshold`` reports that rounded ``η``.
Guards: stages stop when fewer than two exceedances are left to fit (a single exceedance has no
variance) or when a stage would leave no exceedances, keeping the last threshold that selected
something; if nothing at all is above the threshold (e.g. an all-zero or constant gradient), the
single largest ``|g|`` (lowest index among ties) is sent. NaN/Inf raise ``ValueError``.
Range: when a statistic overflows (huge finite ``|g|``), the whole call is computed on
``g / 2^⌈log₂ max|g|⌉`` (all three fits are scale-equivariant; a power of two keeps every
comparison exact) and the threshold scaled back, so the selection is the one of the scaled data.

Backends compute the same thing: fused C kernels (:mod:`compressors.native`) for contiguous float32
CPU tensors, and plain torch ops for anything else (CUDA, fp16/bf16/fp64). Native: one read pass
for the stage-1 statistics and, with more than one stage, one for the statistics of stage 1's
exceedances (read-only: they are never compacted). One of these passes also collects a small pool
(the elements above a guess from the previous call of the same size, just below the thresholds
it will need), and every later stage, correction and the final selection read only that pool; when
the guess misses, one more pass over the vector collects the exceedances actually needed. Torch: stage
statistics as masked reductions over ``|g|`` (no data-dependent shapes), every branch written as
``torch.where``, and exactly one device→host transfer per call: a few counts read together, which
size the selection.
Native and torch agree up to the summation order of float32 partial sums (relative differences
of ~1e-6 in the statistics): thresholds agree to that precision and, when equal, so do the
selections.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from compressors import estimators, native
from compressors._validate import raise_if_not_finite, target_count
from compressors.adaptive import StageController
from compressors.base import Compressor
from compressors.rules import stage_probabilities
from compressors.selection import Workspace, argmax_fallback
from compressors.sparse import Sparse

GUESS_MARGIN = 0.9
"""Native path: the pool holds ``|g| > 0.9·τ``, ``τ`` the threshold the previous call of the same
size selected at (scaled by how this call's ``η₁`` moved); with one stage, the lower of that and
the previous ``η₁``, and the pool is collected by the first pass."""

WILD_TRY = 0.5
"""Native path: a try below ``0.5 ×`` the pool's threshold (a correction step that overshot, e.g.
the first secant step after a stage-1 fit that selected a hundredth of ``k``) is counted by a
full pass that collects nothing; a try just below the pool (the pool was a little too high) is
counted by a full pass that collects a new pool at that try."""

SLOPE_RANGE = (0.1, 10.0)
"""Clamp of the secant slope ``d ln c / d ln p`` used by the in-call correction."""


class Moments(NamedTuple):
    """What a fit needs, as 0-d float64 tensors: mean, variance (divisor n), mean of ln (or None)."""

    mean: torch.Tensor
    var: torch.Tensor | None = None
    mean_log: torch.Tensor | None = None


class Tail(NamedTuple):
    """Exceedances of a threshold: count, Σ excess and Σ excess² (0-d float64 tensors)."""

    count: torch.Tensor
    excess: torch.Tensor
    excess_sq: torch.Tensor

    def moments(self) -> Moments:
        """Mean and variance of the excess (count clamped at 1)."""
        c = torch.clamp(self.count, min=1.0)
        mean = self.excess / c
        return Moments(mean, torch.clamp(self.excess_sq / c - mean * mean, min=0.0))


class _Overflow(Exception):
    """A statistic overflowed on finite data: redo the call on scaled data."""


class _Ops:
    """What the stage chain needs from a backend; every value is a 0-d float64 tensor."""

    eager = False
    """Whether values may be read on the host (CPU tensors): the chain then stops early."""

    def first(self) -> Moments: ...
    def tail(self, threshold: torch.Tensor) -> Tail: ...
    def select(self, threshold: torch.Tensor, pre_count: torch.Tensor,
               used: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """Positions above ``threshold``, with ``pre_count`` and ``used`` read on the host."""


class _NativeOps(_Ops):
    """Fused C kernels; the pool is the compacted ``{|g| > pool_at}`` (positions and magnitudes)."""

    eager = True

    def __init__(self, owner: SIDCo, grad: torch.Tensor, guess: tuple[float, float] | None, single: bool,
                 logs: bool):
        self.owner, self.grad, self.n = owner, grad, grad.numel()
        self.guess, self.single, self.logs = guess, single, logs
        self.pool: native.Selection | None = None
        self.pool_at = math.inf
        self.eta1: float | None = None
        self.chosen = math.nan  # the threshold the call selected at (read back by select)

    def _buffers(self, name: str, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owner._buffers(name, numel)

    def first(self) -> Moments:
        select = None
        if self.single and self.guess is not None:
            select = GUESS_MARGIN * min(self.guess)  # one stage: stage 1's own threshold comes from the pool
        r = native.scan(self.grad, absolute=True, logs=self.logs, select=select,
                        buffers=self._buffers("pool", self.n) if select is not None else None)
        if r.selection is not None:
            self.pool, self.pool_at = r.selection, select
        n = self.n
        if not (math.isfinite(r.excess) and math.isfinite(r.excess_sq)):
            raise _Overflow
        mean = r.excess / n
        mean_log = estimators.mean_log_from_sums(r.total_log, r.positive, n) if self.logs else 0.0
        return Moments(_f64(mean), _f64(max(r.excess_sq / n - mean * mean, 0.0)), _f64(mean_log))

    def _scan(self, t: float, select: float | None = None) -> native.Scan:
        if self.pool is not None and t >= self.pool_at:
            return native.scan(self.pool.magnitudes, absolute=False, shift=t, select=select,
                               positions=self.pool.indices,
                               buffers=self._buffers("final", self.pool.indices.numel()) if select is not None else None)
        if select is None:
            # a full pass: collect the pool for later stages on the way
            if self.eta1 is None:
                self.eta1 = t
                if self.guess is not None:
                    select = GUESS_MARGIN * t * self.guess[1] / self.guess[0]
            elif self.pool is None or t >= WILD_TRY * self.pool_at:
                select = t
            if select is None:
                return native.scan(self.grad, absolute=True, shift=t)
            r = native.scan(self.grad, absolute=True, shift=t, select=select,
                            buffers=self._buffers("pool", self.n))
            self.pool, self.pool_at = r.selection, select
            return r
        return native.scan(self.grad, absolute=True, shift=t, select=select, buffers=self._buffers("final", self.n))

    def tail(self, threshold: torch.Tensor) -> Tail:
        t = float(threshold)
        r = self._scan(t)
        if self.eta1 is None:
            self.eta1 = t
        return Tail(_f64(r.count), _f64(r.excess), _f64(r.excess_sq))

    def select(self, threshold: torch.Tensor, pre_count: torch.Tensor,
               used: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        t = self.chosen = float(threshold)
        r = self._scan(t, select=t)
        return r.selection.indices.long(), int(pre_count), int(used)


class _TorchOps(_Ops):
    """Masked reductions over ``a = |g|`` in reused buffers; one device→host transfer in :meth:`select`."""

    def __init__(self, owner: SIDCo, grad: torch.Tensor, logs: bool, variance: bool):
        self.grad, self.logs, self.variance = grad, logs, variance
        ws = owner._workspace
        self.a = torch.abs(grad, out=ws.get("abs", grad.numel(), grad.dtype, grad.device))
        self.work = ws.get("excess", grad.numel(), grad.dtype, grad.device)
        self.acc = torch.float64 if grad.dtype == torch.float64 else torch.float32
        self.ws = ws

    def first(self) -> Moments:
        a = self.a
        if self.variance:
            mean, var = estimators.mean_and_var(a)
        else:
            mean, var = estimators.mean(a), torch.zeros((), dtype=torch.float64, device=a.device)
        mean_log = torch.zeros((), dtype=torch.float64, device=a.device)
        if self.logs:
            mean_log = estimators.mean_log_positive(a, self.ws.get("log", a.numel(), self.acc, a.device))
        self.statistic = mean + var + mean_log
        return Moments(mean, var, mean_log)

    def tail(self, threshold: torch.Tensor) -> Tail:
        excess = torch.sub(self.a, threshold.to(self.a.dtype), out=self.work).clamp_(min=0)
        count = torch.count_nonzero(excess).double()
        total = torch.sum(excess, dtype=self.acc).double()
        square = torch.linalg.vector_norm(excess, 2, dtype=self.acc).double() ** 2
        return Tail(count, total, square)

    def select(self, threshold: torch.Tensor, pre_count: torch.Tensor,
               used: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        mask = torch.gt(self.a, threshold.to(self.a.dtype), out=self.ws.get("mask", self.a.numel(), torch.bool,
                                                                            self.a.device))
        count = torch.count_nonzero(mask)
        finite = torch.isfinite(self.statistic)
        info = torch.stack([count.double(), pre_count, used.to(count.device), finite.double()])
        selected, pre, stages, ok = info.tolist()  # the one device->host transfer of the call
        if not ok:
            raise _Overflow
        return torch.nonzero_static(mask, size=int(selected)).squeeze(1), int(pre), int(stages)


def _f64(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


class SIDCo(Compressor):
    """Base of the three SIDCo variants; subclasses provide the first- and later-stage fits.

    Options: ``stages`` — an int ≥ 1 or ``"adaptive"`` (default; see
    :class:`compressors.adaptive.StageController`); ``adapt`` — ``"count"`` (default) or
    ``"paper"`` (module docstring); ``corrections`` — at most this many in-call corrections of the
    last stage (``adapt="count"`` only; default 8, 0 disables); ``first_ratio`` — tail mass of
    stage 1 in (0, 1) (default 0.25); ``window`` and ``band`` of the adaptive controller (5 calls,
    ±20 %; ``band`` is also the in-call correction's band); ``backend`` — ``"auto"`` (default: the
    fused C kernels for contiguous float32 CPU tensors when they are available, torch otherwise) or
    ``"torch"`` (always the torch path). After a call, :attr:`backend` names what ran it
    (``"native"``, ``"torch"`` or ``"cuda"``).
    """

    name = "sidco"
    first_needs_var = False
    first_needs_log = False
    tail_needs_var = True

    def __init__(self, density: float, stages: int | str = "adaptive", first_ratio: float = 0.25,
                 window: int = 5, band: float = 0.2, backend: str = "auto", adapt: str = "count",
                 corrections: int = 8):
        super().__init__(density)
        if backend not in ("auto", "torch"):
            raise ValueError(f"backend must be 'auto' or 'torch', got {backend!r}")
        self.backend_choice = backend
        self.backend = "torch"
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
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise ValueError(f"window must be an int >= 1, got {window!r}")
            self.controller = StageController(self.density, window=window, band=self.band)
        elif isinstance(stages, int) and not isinstance(stages, bool) and stages >= 1:
            self.fixed_stages = stages
        else:
            raise ValueError(f"stages must be an int >= 1 or 'adaptive', got {stages!r}")
        self._workspace = Workspace()
        self._guesses: dict[int, tuple[float, float]] = {}

    @property
    def stages(self) -> int:
        """Stage count the next call will use."""
        if self.controller is not None:
            return self.controller.stages
        return self.fixed_stages

    def first_threshold(self, moments: Moments, p: float | torch.Tensor) -> torch.Tensor:
        """Stage-1 threshold for tail mass ``p`` from the moments of all magnitudes."""
        raise NotImplementedError

    def tail_threshold(self, moments: Moments, p: float | torch.Tensor) -> torch.Tensor:
        """Later-stage threshold (above the shift) from the moments of the shifted exceedances."""
        return estimators.gpareto_threshold(moments.mean, moments.var, p)

    def _compress(self, grad: torch.Tensor) -> Sparse:
        try:
            sparse, pre_count = self._run(grad)
        except _Overflow:
            sparse, pre_count = self._rescaled(grad)
        if self.controller is not None:
            self.controller.observe(max(pre_count, 1), grad.numel())
        return sparse

    def _run(self, grad: torch.Tensor, remember: bool = True) -> tuple[Sparse, int]:
        n = grad.numel()
        stages = self.stages
        if self.backend_choice == "auto" and native.usable(grad):
            guess = self._guesses.get(n) if remember else None
            single = len(stage_probabilities(self.density, stages, self.first_ratio)) == 1
            ops: _Ops = _NativeOps(self, grad, guess, single, self.first_needs_log)
            self.backend = "native"
        else:
            ops = _TorchOps(self, grad, self.first_needs_log, self.first_needs_var)
            self.backend = "cuda" if grad.device.type == "cuda" else "torch"
        threshold, used, pre_count = self._chain(ops, n, stages, grad.dtype)
        indices, pre, used = ops.select(threshold, pre_count, used)
        if isinstance(ops, _NativeOps) and remember and ops.eta1 is not None:
            if ops.chosen > 0 and ops.eta1 > 0 and math.isfinite(ops.eta1):
                self._guesses = {**dict(list(self._guesses.items())[-7:]), n: (ops.eta1, ops.chosen)}
        if indices.numel() == 0:
            raise_if_not_finite(grad, getattr(ops, "statistic", None))
            indices = argmax_fallback(grad.abs())
        return Sparse(grad.index_select(0, indices), indices, n, threshold, used), pre

    def _chain(self, ops: _Ops, n: int, stages: int, dtype: torch.dtype):
        """Thresholds of every stage and the in-call correction; returns (η, stages used, count
        above η), η rounded to ``dtype``."""
        k = float(target_count(self.density, n))
        probs = stage_probabilities(self.density, stages, self.first_ratio)
        moments = ops.first()
        first = lambda p: _round(self.first_threshold(moments, p), dtype)  # noqa: E731
        t = first(probs[0])
        tail = ops.tail(t)
        fit: Callable[[torch.Tensor], torch.Tensor] = first
        log_p = torch.tensor(math.log(probs[0]), dtype=torch.float64, device=t.device)
        used = torch.ones((), dtype=torch.float64, device=t.device)
        alive = torch.ones((), dtype=torch.bool, device=t.device)
        for m in range(1, len(probs)):
            if ops.eager and not bool(alive & (tail.count >= 2)):
                break
            if self.adapt == "paper":
                p = torch.tensor(probs[m], dtype=torch.float64, device=t.device)
            else:
                p = torch.clamp(k / torch.clamp(tail.count, min=1.0), max=1.0) ** (1.0 / (len(probs) - m))
            base, base_tail = t, tail
            stage_fit = self._stage_fit(base, base_tail, dtype)
            candidate = stage_fit(p)
            cand_tail = ops.tail(candidate)
            ok = alive & (base_tail.count >= 2) & (cand_tail.count > 0)
            if ops.eager:
                if not bool(ok):
                    break
                t, tail, fit, log_p = candidate, cand_tail, stage_fit, torch.log(p)
                used = used + float(p < 1)
                continue
            alive = ok
            t = torch.where(ok, candidate, t)
            tail = Tail(*(torch.where(ok, new, old) for new, old in zip(cand_tail, tail)))
            fit = _switch(ok, stage_fit, fit)
            log_p = torch.where(ok, torch.log(p), log_p)
            used = used + (ok & (p < 1)).double()
        if self.corrections:
            t, tail = self._correct(ops, fit, t, tail, log_p, k, dtype)
        return t, used, tail.count

    def _stage_fit(self, base: torch.Tensor, base_tail: Tail, dtype: torch.dtype):
        moments = base_tail.moments()
        return lambda p: _round(base.double() + self.tail_threshold(moments, p), dtype)

    def _correct(self, ops: _Ops, fit, t, tail, log_p, k: float, dtype):
        """Safeguarded secant steps on ``ln p`` of the last stage until its count is within the band.

        Each step moves ``ln p`` by ``ln(k/c)/r`` (``r`` the slope: 1, then the secant of the last
        two tries); a step leaving the bracket of tries known to under- and over-select bisects it
        instead. The try closest to ``k`` is kept.
        """
        limit = math.log1p(self.band)
        log_k = math.log(k)
        err = torch.log(torch.clamp(tail.count, min=0.5)) - log_k
        best_t, best_tail, best_err = t, tail, err.abs()
        slope = torch.ones((), dtype=torch.float64, device=t.device)
        under = torch.where(err < 0, log_p, torch.full_like(log_p, -math.inf))  # ln p known to select too few
        over = torch.where(err > 0, log_p, torch.full_like(log_p, math.inf))    # ln p known to select too many
        prev_log_p, prev_err = log_p, err
        for step in range(self.corrections):
            need = best_err > limit
            if ops.eager and not bool(need):
                break
            if step:
                dx = log_p - prev_log_p
                moved = dx.abs() > 1e-12
                secant = (err - prev_err) / torch.where(moved, dx, torch.ones_like(dx))
                slope = torch.where(moved, torch.clamp(secant, *SLOPE_RANGE), slope)
            new_log_p = torch.clamp(log_p - err / slope, max=0.0)
            bracketed = torch.isfinite(under) & torch.isfinite(over)
            outside = (new_log_p <= under) | (new_log_p >= over)
            new_log_p = torch.where(bracketed & outside, 0.5 * (under + over), new_log_p)
            candidate = fit(torch.exp(new_log_p))
            cand_tail = ops.tail(candidate)
            cand_err = torch.log(torch.clamp(cand_tail.count, min=0.5)) - log_k
            prev_log_p, prev_err = log_p, err
            log_p = torch.where(need, new_log_p, log_p)
            err = torch.where(need, cand_err, err)
            under = torch.where(need & (cand_err < 0), torch.maximum(under, new_log_p), under)
            over = torch.where(need & (cand_err > 0), torch.minimum(over, new_log_p), over)
            better = need & (cand_err.abs() < best_err)
            best_t = torch.where(better, candidate, best_t)
            best_tail = Tail(*(torch.where(better, new, old) for new, old in zip(cand_tail, best_tail)))
            best_err = torch.where(better, cand_err.abs(), best_err)
        return best_t, best_tail

    def _buffers(self, name: str, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reused (int32, float32) selection buffers of capacity ``numel`` for the native path."""
        return (self._workspace.at_least(name + "-idx", numel, torch.int32, torch.device("cpu")),
                self._workspace.at_least(name + "-mag", numel, torch.float32, torch.device("cpu")))

    def _rescaled(self, grad: torch.Tensor) -> tuple[Sparse, int]:
        """The call on ``grad / 2^⌈log₂ max|g|⌉`` (after checking for NaN/Inf), threshold scaled back."""
        raise_if_not_finite(grad)
        top = float(torch.amax(grad.abs()))
        scale = math.ldexp(1.0, math.frexp(top)[1])  # a power of two: scaling is exact
        scaled, pre = self._run(grad * (1.0 / scale), remember=False)
        back = (scaled.threshold_tensor.double() * scale).to(grad.dtype)
        return Sparse(grad.index_select(0, scaled.indices), scaled.indices, grad.numel(), back, scaled.stages), pre


def _round(threshold: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``threshold`` rounded to the gradient's dtype, kept as a float64 0-d tensor (−0 made +0)."""
    return threshold.to(dtype).double() + 0.0


def _switch(condition: torch.Tensor, new, old):
    """The fit to correct later: ``new`` where ``condition`` holds (elementwise on the threshold)."""
    return lambda p: torch.where(condition, new(p), old(p))


class SIDCoE(SIDCo):
    """SIDCo-E: exponential fit of ``|g|`` (double-exponential ``g``), ``η = μ·ln(1/p)`` per stage."""

    name = "sidco-e"
    tail_needs_var = False

    def first_threshold(self, moments, p):
        return estimators.exponential_threshold(moments.mean, p)

    def tail_threshold(self, moments, p):
        return estimators.exponential_threshold(moments.mean, p)


class SIDCoP(SIDCo):
    """SIDCo-P: generalized Pareto (moments) fit of ``|g|`` in every stage."""

    name = "sidco-p"
    first_needs_var = True

    def first_threshold(self, moments, p):
        return estimators.gpareto_threshold(moments.mean, moments.var, p)


class SIDCoGP(SIDCo):
    """SIDCo-GP: gamma fit (approximate MLE of the shape, true ``Q⁻¹``) in stage 1, generalized
    Pareto in later stages."""

    name = "sidco-gp"
    first_needs_log = True

    def first_threshold(self, moments, p):
        return estimators.gamma_threshold(moments.mean, moments.mean_log, p)
