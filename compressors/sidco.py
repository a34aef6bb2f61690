"""SIDCo-E, SIDCo-P and SIDCo-GP: statistical thresholds with multi-stage peak-over-threshold.

Stage 1 fits all magnitudes ``a = |g|`` and takes the threshold ``η₁`` for tail mass ``p₁``
(``first_ratio``, 0.25 by default, when ``M > 1`` and ``δ < first_ratio``; otherwise a single stage
with ``p = δ``). Stage ``m`` keeps the exceedances of ``η_{m−1}``, shifts them by ``η_{m−1}``,
refits (exponential stays exponential; SIDCo-P and the later stages of SIDCo-GP use the
generalized Pareto law) and sets ``η_m = η_{m−1} + threshold(p_m)`` with
``p_m = (δ/p₁)^(1/(M−1))``. Only stage 1 touches the whole vector.

Tie rule: an element is sent when ``|g| > η`` (strictly greater), where ``η`` is first rounded to
the gradient's dtype; ``Sparse.threshold`` reports that rounded ``η``.
Guards: stages stop when fewer than two exceedances are left to fit (a single exceedance has no
variance) or when a stage would leave no exceedances, keeping the last threshold that selected
something; if even stage 1 selects nothing (e.g. an all-zero or constant gradient), the
single largest ``|g|`` (lowest index among ties) is sent. NaN/Inf raise ``ValueError``.
Two backends compute the same thing: fused C kernels (:mod:`compressors.native`: one pass for
the stage-1 statistics, one for the selection) for contiguous float32 CPU tensors, and plain torch
ops (any device, any floating dtype, no device->host sync except the one sizing each stage's
selection).
When the statistics or the threshold overflow (huge finite ``|g|``), the selection is computed on
``g / 2^⌈log₂ max|g|⌉`` (all three fits are scale-equivariant; a power of two keeps it exact) and
the threshold scaled back.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from compressors import estimators, native
from compressors._validate import raise_if_not_finite
from compressors.adaptive import StageController
from compressors.base import Compressor
from compressors.selection import Workspace, argmax_fallback, indices_above, magnitude
from compressors.sparse import Sparse


GUESS_MARGIN = 0.9
"""Native path, SIDCo-E/-P: the statistics pass also collects ``|g| > 0.9·η₁(previous call)``.
When this call's ``η₁`` is not below that guess (the usual case in training, where gradient
scales drift slowly) stage 1's exceedances are taken from that superset (and later stages
select from it) instead of a second pass over the whole vector; otherwise the second pass runs. Stage 1 is bit-identical
either way; later stages may differ in the last float32 bits of their sums (summation order)."""


class Moments(NamedTuple):
    """What a fit needs, as 0-d float64 tensors: mean, variance (divisor n), mean of ln (or None)."""

    mean: torch.Tensor
    var: torch.Tensor | None = None
    mean_log: torch.Tensor | None = None


def stage_probabilities(density: float, stages: int, first_ratio: float) -> list[float]:
    """Tail mass per stage: ``[p₁, p₂, …]`` with product ``density``.

    One stage (``[density]``) when ``stages == 1`` or ``density >= first_ratio``.
    """
    if stages == 1 or density >= first_ratio:
        return [density]
    rest = (density / first_ratio) ** (1.0 / (stages - 1))
    return [first_ratio] + [rest] * (stages - 1)


class SIDCo(Compressor):
    """Base of the three SIDCo variants; subclasses provide the first- and later-stage fits.

    Options: ``stages`` — an int ≥ 1 or ``"adaptive"`` (default; see
    :class:`compressors.adaptive.StageController`); ``first_ratio`` — tail mass of stage 1 in
    (0, 1) (default 0.25); ``window`` and ``band`` of the adaptive controller (5 calls, ±20 %);
    ``backend`` — ``"auto"`` (default: the fused C kernels for contiguous float32 CPU tensors when
    they are available, torch otherwise) or ``"torch"`` (always the pure-torch path).
    """

    name = "sidco"
    first_needs_var = False
    first_needs_log = False
    tail_needs_var = True

    def __init__(self, density: float, stages: int | str = "adaptive", first_ratio: float = 0.25,
                 window: int = 5, band: float = 0.2, backend: str = "auto"):
        super().__init__(density)
        if backend not in ("auto", "torch"):
            raise ValueError(f"backend must be 'auto' or 'torch', got {backend!r}")
        self.backend_choice = backend
        if isinstance(first_ratio, bool) or not isinstance(first_ratio, (int, float)) or not 0 < first_ratio < 1:
            raise ValueError(f"first_ratio must be in (0, 1), got {first_ratio!r}")
        self.first_ratio = float(first_ratio)
        self.controller: StageController | None = None
        self.fixed_stages: int | None = None
        if stages == "adaptive":
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise ValueError(f"window must be an int >= 1, got {window!r}")
            if isinstance(band, bool) or not isinstance(band, (int, float)) or not 0 < band < 1:
                raise ValueError(f"band must be in (0, 1), got {band!r}")
            self.controller = StageController(self.density, window=window, band=float(band))
        elif isinstance(stages, int) and not isinstance(stages, bool) and stages >= 1:
            self.fixed_stages = stages
        else:
            raise ValueError(f"stages must be an int >= 1 or 'adaptive', got {stages!r}")
        self._workspace = Workspace()
        self._guesses: dict[int, float] = {}

    @property
    def stages(self) -> int:
        """Stage count the next call will use."""
        if self.controller is not None:
            return self.controller.stages
        return self.fixed_stages

    def first_threshold(self, moments: Moments, p: float) -> torch.Tensor:
        """Stage-1 threshold for tail mass ``p`` from the moments of all magnitudes."""
        raise NotImplementedError

    def tail_threshold(self, moments: Moments, p: float) -> torch.Tensor:
        """Later-stage threshold (above the shift) from the moments of the shifted exceedances."""
        return estimators.gpareto_threshold(moments.mean, moments.var, p)

    def _compress(self, grad: torch.Tensor) -> Sparse:
        probs = stage_probabilities(self.density, self.stages, self.first_ratio)
        if self.backend_choice == "auto" and native.usable(grad):
            sparse = self._compress_native(grad, probs)
            self.backend = "native"
        else:
            sparse = self._compress_torch(grad, probs)
        if self.controller is not None:
            self.controller.observe(sparse.selected, grad.numel())
        return sparse

    def _compress_native(self, grad: torch.Tensor, probs: list[float]) -> Sparse:
        n = grad.numel()
        guess = None if self.first_needs_log else self._guesses.get(n)
        speculative = None
        if guess is None:
            sums = native.stats(grad, absolute=True, squares=self.first_needs_var, logs=self.first_needs_log)
        else:
            speculative, sums = native.select_above(grad, guess, absolute=True, with_stats=True,
                                                    buffers=self._buffers("guess", n))
        if not (math.isfinite(sums.total) and math.isfinite(sums.total_sq)):
            return self._degenerate(grad, None)
        mean = sums.total / n
        moments = Moments(
            torch.tensor(mean, dtype=torch.float64),
            torch.tensor(max(sums.total_sq / n - mean * mean, 0.0), dtype=torch.float64),
            torch.tensor(estimators.mean_log_from_sums(sums.total_log, sums.positive, n), dtype=torch.float64),
        )
        threshold = self.first_threshold(moments, probs[0]).float()
        eta = float(threshold)
        # `pool` holds every exceedance of `threshold` (with `exact`, nothing else); count, excess
        # and excess_sq describe the exceedances exactly.
        exact = True
        if speculative is not None and eta >= guess and len(probs) > 1:
            pool, exact = speculative, False
            tail = native.stats(pool.magnitudes, absolute=False, shift=eta, squares=True)
            count, excess, excess_sq = tail.positive, tail.total, tail.total_sq
        else:
            if speculative is not None and eta >= guess:
                pool = native.select_above(speculative.magnitudes, eta, absolute=False,
                                           positions=speculative.indices,
                                           buffers=self._buffers("stage1", speculative.indices.numel()))
            else:
                pool = native.select_above(grad, eta, absolute=True, buffers=self._buffers("stage1", n))
            count, excess, excess_sq = pool.indices.numel(), pool.excess, pool.excess_sq
        if not self.first_needs_log and math.isfinite(eta):
            self._guesses = {**dict(list(self._guesses.items())[-7:]), n: eta * GUESS_MARGIN}
        if count == 0:
            return self._degenerate(grad, threshold)
        used = 1
        for p in probs[1:]:
            if count < 2:
                break
            tail_mean = excess / count
            tail_moments = Moments(torch.tensor(tail_mean, dtype=torch.float64),
                                   torch.tensor(max(excess_sq / count - tail_mean * tail_mean, 0.0),
                                                dtype=torch.float64))
            candidate = (float(threshold) + self.tail_threshold(tail_moments, p)).float()
            kept = native.select_above(pool.magnitudes, float(candidate), absolute=False, positions=pool.indices,
                                       buffers=self._buffers(f"stage{used + 1}", pool.indices.numel()))
            if kept.indices.numel() == 0:
                break
            pool, threshold, exact = kept, candidate, True
            count, excess, excess_sq = kept.indices.numel(), kept.excess, kept.excess_sq
            used += 1
        if not exact:
            pool = native.select_above(pool.magnitudes, float(threshold), absolute=False, positions=pool.indices,
                                       buffers=self._buffers("final", pool.indices.numel()))
        indices = pool.indices.long()
        return Sparse(grad.index_select(0, indices), indices, n, threshold, used)

    def _buffers(self, name: str, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reused (int32, float32) selection buffers of capacity ``numel`` for the native path."""
        return (self._workspace.at_least(name + "-idx", numel, torch.int32, torch.device("cpu")),
                self._workspace.at_least(name + "-mag", numel, torch.float32, torch.device("cpu")))

    def _compress_torch(self, grad: torch.Tensor, probs: list[float]) -> Sparse:
        n = grad.numel()
        a = magnitude(grad, self._workspace)
        moments, statistic = self._torch_moments(a)
        threshold = torch.where(torch.isfinite(statistic), self.first_threshold(moments, probs[0]),
                                torch.nan).to(a.dtype)
        selected = indices_above(a, threshold, self._workspace)
        if selected.numel() == 0:
            raise_if_not_finite(grad, statistic)
            return self._degenerate(grad, threshold)
        used = 1
        for p in probs[1:]:
            if selected.numel() < 2:
                break
            exceed = a.index_select(0, selected)
            excess = exceed - threshold
            mean = estimators.mean(excess)
            var = estimators.mean_and_var(excess)[1] if self.tail_needs_var else None
            candidate = (threshold + self.tail_threshold(Moments(mean, var), p)).to(a.dtype)
            keep = torch.nonzero(exceed > candidate).squeeze(1)
            if keep.numel() == 0:
                break
            selected = selected.index_select(0, keep)
            threshold = candidate
            used += 1
        return Sparse(grad.index_select(0, selected), selected, n, threshold, used)

    def _torch_moments(self, a: torch.Tensor) -> tuple[Moments, torch.Tensor]:
        """Stage-1 moments of ``a`` and a statistic that is finite iff ``a`` is (barring overflow)."""
        if self.first_needs_var:
            mean, var = estimators.mean_and_var(a)
            statistic = mean + var
        else:
            mean, var = estimators.mean(a), None
            statistic = mean
        mean_log = None
        if self.first_needs_log:
            work = torch.float64 if a.dtype == torch.float64 else torch.float32
            mean_log = estimators.mean_log_positive(a, self._workspace.get("log", a.numel(), work, a.device))
        return Moments(mean, var, mean_log), statistic

    def _degenerate(self, grad: torch.Tensor, threshold: torch.Tensor | None) -> Sparse:
        """Stage 1 selected nothing, or its statistics overflowed (``threshold`` is then ``None``).

        NaN/Inf raise; overflow of finite data re-runs on ``grad / 2^⌈log₂ max|g|⌉`` (all fits are
        scale-equivariant; dividing by a power of two keeps every comparison exact); otherwise (flat
        data) the largest ``|g|`` is sent.
        """
        raise_if_not_finite(grad)
        a = grad.abs()
        top = float(torch.amax(a))
        overflow = threshold is None or not bool(torch.isfinite(threshold))
        if overflow and top > 0:
            scale = math.ldexp(1.0, math.frexp(top)[1])  # a power of two: scaling is exact
            probs = stage_probabilities(self.density, self.stages, self.first_ratio)
            scaled = self._compress_torch(grad / scale, probs)
            back = (scaled.threshold_tensor.double() * scale).to(grad.dtype)
            return Sparse(grad.index_select(0, scaled.indices), scaled.indices, grad.numel(), back, scaled.stages)
        selected = argmax_fallback(a)
        return Sparse(grad.index_select(0, selected), selected, grad.numel(), threshold, 1)


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
