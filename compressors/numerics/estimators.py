"""Closed-form tail fits of gradient magnitudes and their thresholds (SIDCo's estimators).

Two kinds of function. Statistics (:func:`mean`, :func:`mean_and_var`, :func:`mean_log_positive`)
reduce a 1-D tensor of non-negative magnitudes ``x`` to 0-d float64 tensors on its device (sums
accumulate in float32, float64 for float64 input). The fits and thresholds take those statistics
as Python floats (0-d CPU tensors are accepted) and a tail mass ``p`` in (0, 1], and return
Python floats: the threshold ``η`` with ``P(X > η) = p`` under the fitted law. SIDCo reads a
stage's statistics to the host once and does this scalar algebra there (a handful of float
operations, and SciPy's inverse incomplete gamma), never as device operations. Degenerate inputs
(``μ = 0``, ``v = 0``, a single element, ``ξ ≈ 0``, zeros in ``ln x``) are handled explicitly.
"""

from __future__ import annotations

import math

import torch

from scipy.special.cython_special import gammainccinv

XI_EPS = 1e-8
"""``|ξ|`` below this uses the exponential limit ``σ·ln(1/p)`` of the generalized Pareto threshold."""

S_FLOOR = 1e-6
"""``s = ln μ − mean(ln x)`` below this is within float32 logarithm error of 0 (constant data);
it is taken as ``S_FLOOR`` (``α ≈ 5·10⁵``) so that every backend gives the same threshold."""

VAR_FLOOR = 1e-6
"""A variance below ``VAR_FLOOR·μ²`` is within float32 rounding of the moments of constant data
(``Σx²/n − μ²`` from float32 sums); it is taken as 0 so that every backend gives the same threshold."""

ALPHA_RANGE = (1e-4, 1e6)
"""Gamma shape estimates are clamped to this range (``s → 0`` for constant data gives ``α → ∞``)."""


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` as a 0-d float64 tensor (accumulated in float32/float64)."""
    return torch.sum(x, dtype=_acc_dtype(x)).double() / max(x.numel(), 1)


def mean_and_var(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance (divisor n) of ``x``, 0-d float64 tensors."""
    mu = mean(x)
    second = torch.linalg.vector_norm(x, 2, dtype=_acc_dtype(x)).double() ** 2 / max(x.numel(), 1)
    return mu, torch.clamp(second - mu * mu, min=0.0)


def exponential_threshold(mu: float, p: float) -> float:
    """Exponential (MLE scale ``β = μ``) threshold: ``η = β·ln(1/p)``."""
    return float(mu) * -math.log(p)


def _degenerate(mu: float, var: float) -> bool:
    """Whether the moments fit has no usable variance: ``v`` below :data:`VAR_FLOOR`·μ², or ``μ²/v``
    not finite."""
    return not var > VAR_FLOOR * mu * mu or not math.isfinite(mu * mu / var)


def gpareto_params(mu: float, var: float) -> tuple[float, float]:
    """Generalized Pareto (location 0) shape and scale ``(ξ, σ)`` by the method of moments:
    ``r = μ²/v``, ``ξ = ½(1 − r)``, ``σ = ½·μ·(r + 1)`` (``v = 1`` stands in where ``v`` is below
    :data:`VAR_FLOOR`·μ² or ``μ²/v`` is not finite; :func:`gpareto_threshold` handles that case)."""
    mu, var = float(mu), float(var)
    r = mu * mu / (1.0 if _degenerate(mu, var) else var)
    return 0.5 * (1.0 - r), 0.5 * mu * (r + 1.0)


def gpareto_threshold(mu: float, var: float, p: float) -> float:
    """Generalized Pareto (location 0) threshold from the method of moments.

    ``r = μ²/v``, ``ξ = ½(1 − r)``, ``σ = ½·μ·(r + 1)``, ``η = (σ/ξ)(p^(−ξ) − 1)``, written as
    ``σ·expm1(−ξ ln p)/ξ``; for ``|ξ| < XI_EPS`` the limit ``σ·ln(1/p)``. ``v = 0`` (constant or
    single-element data; below :data:`VAR_FLOOR`) takes the ``v → 0`` limit ``η = μ`` (the upper end
    of the fitted support).
    """
    mu, var = float(mu), float(var)
    if _degenerate(mu, var):
        return mu
    xi, sigma = gpareto_params(mu, var)
    log_p = math.log(p)
    if abs(xi) < XI_EPS:
        return -sigma * log_p
    try:
        return sigma * math.expm1(-xi * log_p) / xi
    except OverflowError:
        return math.inf


def gamma_shape(mu: float, mean_log: float) -> float:
    """Approximate MLE of the gamma shape: ``s = ln μ − mean(ln x)``,
    ``α = (3 − s + √((s − 3)² + 24 s)) / (12 s)``, clamped to :data:`ALPHA_RANGE`; ``s`` is
    floored at :data:`S_FLOOR`."""
    mu, mean_log = float(mu), float(mean_log)
    s = max(math.log(mu) - mean_log if mu > 0 else S_FLOOR, S_FLOOR)
    alpha = (3.0 - s + math.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    return min(max(alpha, ALPHA_RANGE[0]), ALPHA_RANGE[1])


LOG_FLOOR = float(torch.finfo(torch.float32).tiny)
"""Magnitudes below the smallest normal float32 are floored to it inside ``ln`` (zeros excluded)."""


def mean_log_positive(x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``ln max(x, LOG_FLOOR)`` over the strictly positive elements of ``x``, float64 0-d.

    Zeros are excluded (their ``ln`` would be −∞). ``scratch`` (optional) is a float32 (float64
    for float64 ``x``) buffer of ``x``'s size to hold the logarithms.
    """
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    if scratch is None:
        scratch = torch.empty(x.shape, dtype=work, device=x.device)
    logs = torch.clamp(x, min=LOG_FLOOR, out=scratch) if x.dtype == work else scratch.copy_(x).clamp_(min=LOG_FLOOR)
    torch.log_(logs)
    positive = torch.count_nonzero(x).double()
    zeros = x.numel() - positive
    total = torch.sum(logs, dtype=work).double() - zeros * math.log(LOG_FLOOR)
    return total / torch.clamp(positive, min=1.0)


def mean_log_from_sums(total_log: float, positive: int, numel: int) -> float:
    """The same mean from one-pass sums over ``ln max(x, LOG_FLOOR)`` of all ``numel`` elements."""
    return (total_log - (numel - positive) * math.log(LOG_FLOOR)) / max(positive, 1)


def gamma_threshold(mu: float, mean_log: float, p: float) -> float:
    """Gamma threshold ``η = β·Q⁻¹(α, p)`` with ``β = μ/α`` (the true inverse,
    ``scipy.special.gammainccinv``; no closed-form shortcut)."""
    return gamma_quantile(mu, gamma_shape(mu, mean_log), p)


def gamma_quantile(mu: float, alpha: float, p: float) -> float:
    """The threshold of :func:`gamma_threshold` for a shape ``alpha`` already estimated
    (:func:`gamma_shape`): ``(μ/α)·Q⁻¹(α, p)``, several tail masses of one fit paying for the
    shape once. ``Q⁻¹`` is SciPy's ``gammainccinv`` called on floats (its scalar entry point in
    ``scipy.special.cython_special``: the same function without the ufunc's dispatch)."""
    return float(mu) / alpha * gammainccinv(alpha, float(p))
