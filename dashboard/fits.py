"""The distribution-fit picture: histogram of |g| with SIDCo's fitted densities.

The fits use SIDCo's closed-form estimators (see docs/method.md) and
:mod:`scipy.stats` for the densities:

- exponential: MLE scale ``β = mean(a)``;
- gamma: approximate MLE shape ``α = (3 − s + √((s−3)² + 24s)) / (12s)`` with
  ``s = ln mean(a) − mean(ln a)`` (zeros excluded), scale ``mean(a)/α``;
- generalized Pareto (location 0): moments, ``r = μ²/v``, ``ξ = (1 − r)/2``,
  ``σ = μ(r + 1)/2``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats


def fit_exponential(a: np.ndarray) -> dict[str, float]:
    """Exponential fit of ``a`` (≥ 0): ``{"scale": β}``."""
    return {"scale": float(np.mean(a))}


def fit_gamma(a: np.ndarray) -> dict[str, float]:
    """Gamma fit of ``a`` (≥ 0) by SIDCo's approximate MLE: ``{"shape": α, "scale": β}``."""
    positive = a[a > 0]
    if positive.size == 0:
        raise ValueError("gamma fit needs at least one non-zero |g|")
    mean = float(np.mean(positive))
    s = math.log(mean) - float(np.mean(np.log(positive)))
    if s <= 0:
        raise ValueError("gamma fit: all non-zero |g| are equal")
    shape = (3.0 - s + math.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    return {"shape": shape, "scale": float(np.mean(a)) / shape}


def fit_gpareto(a: np.ndarray) -> dict[str, float]:
    """Generalized-Pareto fit (location 0) of ``a`` by moments: ``{"shape": ξ, "scale": σ}``."""
    mean = float(np.mean(a))
    var = float(np.var(a))
    if var <= 0 or mean <= 0:
        raise ValueError("generalized-Pareto fit needs |g| with positive mean and variance")
    r = mean * mean / var
    return {"shape": 0.5 * (1.0 - r), "scale": 0.5 * mean * (r + 1.0)}


def histogram(gradient: np.ndarray, bins: int = 80, density_target: float | None = None,
              max_samples: int = 2_000_000, seed: int = 0) -> dict[str, Any]:
    """Histogram of ``|gradient|`` with the three fitted densities evaluated on a grid.

    Returns JSON-ready ``{"edges", "density", "x", "fits": [{"name", "label", "params", "pdf"}],
    "numel", "threshold"}``; ``threshold`` is the exact top-``density_target`` value of |g|.
    Vectors longer than ``max_samples`` are subsampled uniformly (seeded) for the fits.
    """
    a = np.abs(np.asarray(gradient, dtype=np.float64).ravel())
    if a.size == 0:
        raise ValueError("empty gradient")
    if not np.all(np.isfinite(a)):
        raise ValueError("gradient contains NaN or Inf")
    if a.size > max_samples:
        a = np.random.default_rng(seed).choice(a, size=max_samples, replace=False)
    top = float(np.quantile(a, 0.9995)) if a.size > 1 else float(a[0])
    top = top if top > 0 else 1.0
    counts, edges = np.histogram(a, bins=bins, range=(0.0, top))
    widths = np.diff(edges)
    density = counts / (a.size * widths)
    x = np.linspace(top / (bins * 4), top, 200)
    fits = []
    candidates = (
        ("exponential", fit_exponential, lambda p: stats.expon.pdf(x, scale=p["scale"]),
         lambda p: f"exponential (β={p['scale']:.3g})"),
        ("gamma", fit_gamma, lambda p: stats.gamma.pdf(x, p["shape"], scale=p["scale"]),
         lambda p: f"gamma (α={p['shape']:.3g}, β={p['scale']:.3g})"),
        ("gpareto", fit_gpareto, lambda p: stats.genpareto.pdf(x, p["shape"], scale=p["scale"]),
         lambda p: f"generalized Pareto (ξ={p['shape']:.3g}, σ={p['scale']:.3g})"),
    )
    for name, fit, pdf, label in candidates:
        try:
            params = fit(a)
        except ValueError:
            continue
        values = np.nan_to_num(pdf(params), nan=0.0, posinf=0.0)
        fits.append({"name": name, "label": label(params), "params": params, "pdf": values.tolist()})
    threshold = None
    if density_target is not None and 0 < density_target < 1:
        threshold = float(np.quantile(a, 1.0 - density_target))
    return {
        "edges": edges.tolist(),
        "density": density.tolist(),
        "x": x.tolist(),
        "fits": fits,
        "numel": int(a.size),
        "threshold": threshold,
    }
