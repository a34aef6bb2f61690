"""SIDCo-E, SIDCo-P and SIDCo-GP: statistical thresholds with multi-stage peak-over-threshold.

Stage 1 fits all magnitudes ``a = |g|`` and takes the threshold ``η₁`` for tail mass ``p₁``
(``first_ratio``, 0.25 by default, when ``M > 1`` and ``δ < first_ratio``; otherwise a single stage
with ``p = δ``). Stage ``m`` keeps the exceedances of ``η_{m−1}``, shifts them by ``η_{m−1}``,
refits (exponential stays exponential; SIDCo-P and the later stages of SIDCo-GP use the
generalized Pareto law) and sets ``η_m = η_{m−1} + threshold(p_m)`` with
``p_m = (δ/p₁)^(1/(M−1))``. Only stage 1 touches the whole vector.

Tie rule: an element is sent when ``|g| > η`` (strictly greater), where ``η`` is first rounded to
the gradient's dtype; ``Sparse.threshold`` reports that rounded ``η``.
Guards: if a stage leaves no exceedances, stages stop and the last threshold that selected
something is kept; if even stage 1 selects nothing (e.g. an all-zero or constant gradient), the
single largest ``|g|`` (lowest index among ties) is sent. NaN/Inf raise ``ValueError``.
When the statistics or the threshold overflow (huge finite ``|g|``), the selection is computed on
``g / max|g|`` (all three fits are scale-equivariant) and the threshold scaled back.
"""

from __future__ import annotations

import torch

from compressors import estimators
from compressors._validate import raise_if_not_finite
from compressors.adaptive import StageController, max_stages
from compressors.base import Compressor
from compressors.selection import Workspace, argmax_fallback, indices_above, magnitude
from compressors.sparse import Sparse


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
    (0, 1) (default 0.25); ``window`` and ``band`` of the adaptive controller (5 calls, ±20 %).
    """

    name = "sidco"

    def __init__(self, density: float, stages: int | str = "adaptive", first_ratio: float = 0.25,
                 window: int = 5, band: float = 0.2):
        super().__init__(density)
        if isinstance(first_ratio, bool) or not isinstance(first_ratio, (int, float)) or not 0 < first_ratio < 1:
            raise ValueError(f"first_ratio must be in (0, 1), got {first_ratio!r}")
        self.first_ratio = float(first_ratio)
        self.controller: StageController | None = None
        if stages == "adaptive":
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise ValueError(f"window must be an int >= 1, got {window!r}")
            if isinstance(band, bool) or not isinstance(band, (int, float)) or not 0 < band < 1:
                raise ValueError(f"band must be in (0, 1), got {band!r}")
            self.controller = StageController(self.density, window=window, band=float(band))
            self.fixed_stages = None
        elif isinstance(stages, int) and not isinstance(stages, bool) and stages >= 1:
            self.fixed_stages = stages
        else:
            raise ValueError(f"stages must be an int >= 1 or 'adaptive', got {stages!r}")
        self._workspace = Workspace()

    @property
    def stages(self) -> int:
        """Stage count the next call will use."""
        if self.controller is not None:
            return self.controller.stages
        return min(self.fixed_stages, max_stages(self.density)) if self.density < 1 else 1

    def _first_threshold(self, a: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage-1 threshold over all magnitudes and a statistic that is finite iff ``a`` is."""
        raise NotImplementedError

    def _tail_threshold(self, excess: torch.Tensor, p: float) -> torch.Tensor:
        """Later-stage threshold (above the shift) fitted to shifted exceedances ``excess``."""
        raise NotImplementedError

    def _compress(self, grad: torch.Tensor) -> Sparse:
        n = grad.numel()
        probs = stage_probabilities(self.density, self.stages, self.first_ratio)
        a = magnitude(grad, self._workspace)
        threshold, statistic = self._first_threshold(a, probs[0])
        threshold = torch.where(torch.isfinite(statistic), threshold, torch.nan).to(a.dtype)
        selected = indices_above(a, threshold, self._workspace)
        if selected.numel() == 0:
            return self._degenerate(grad, a, threshold, statistic)
        used = 1
        for p in probs[1:]:
            exceed = a.index_select(0, selected)
            candidate = (threshold + self._tail_threshold(exceed - threshold, p)).to(a.dtype)
            keep = torch.nonzero(exceed > candidate).squeeze(1)
            if keep.numel() == 0:
                break
            selected = selected.index_select(0, keep)
            threshold = candidate
            used += 1
        if self.controller is not None:
            self.controller.observe(selected.numel(), n)
        return Sparse(grad.index_select(0, selected), selected, n, threshold, used)

    def _degenerate(self, grad: torch.Tensor, a: torch.Tensor, threshold: torch.Tensor,
                    statistic: torch.Tensor) -> Sparse:
        """Stage 1 selected nothing: bad input, overflowing statistics, or flat data."""
        raise_if_not_finite(grad, statistic)
        scale = torch.amax(a)
        if not bool(torch.isfinite(threshold)) and bool(scale > 0):
            scaled = self._compress(grad / scale)
            return Sparse(grad.index_select(0, scaled.indices), scaled.indices, grad.numel(),
                          (scaled.threshold_tensor.double() * scale.double()).to(a.dtype), scaled.stages)
        selected = argmax_fallback(a)
        if self.controller is not None:
            self.controller.observe(1, grad.numel())
        return Sparse(grad.index_select(0, selected), selected, grad.numel(), threshold, 1)


class SIDCoE(SIDCo):
    """SIDCo-E: exponential fit of ``|g|`` (double-exponential ``g``), ``η = μ·ln(1/p)`` per stage."""

    name = "sidco-e"

    def _first_threshold(self, a, p):
        mu = estimators.mean(a)
        return estimators.exponential_threshold(mu, p), mu

    def _tail_threshold(self, excess, p):
        return estimators.exponential_threshold(estimators.mean(excess), p)


class SIDCoP(SIDCo):
    """SIDCo-P: generalized Pareto (moments) fit of ``|g|`` in every stage."""

    name = "sidco-p"

    def _first_threshold(self, a, p):
        mu, var = estimators.mean_and_var(a)
        return estimators.gpareto_threshold(mu, var, p), mu + var

    def _tail_threshold(self, excess, p):
        mu, var = estimators.mean_and_var(excess)
        return estimators.gpareto_threshold(mu, var, p)


class SIDCoGP(SIDCo):
    """SIDCo-GP: gamma fit (approximate MLE of the shape, true ``Q⁻¹``) in stage 1, generalized
    Pareto in later stages."""

    name = "sidco-gp"

    def _first_threshold(self, a, p):
        mu = estimators.mean(a)
        scratch = self._workspace.get("log", a.numel(), a.dtype, a.device)
        mean_log = estimators.mean_log_positive(a, scratch)
        return estimators.gamma_threshold(mu, mean_log, p), mu

    def _tail_threshold(self, excess, p):
        mu, var = estimators.mean_and_var(excess)
        return estimators.gpareto_threshold(mu, var, p)
