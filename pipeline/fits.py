"""The distribution-fit picture: histogram of |g| with SIDCo's fitted densities.

The fitted parameters are SIDCo's own, computed by :mod:`compressors.numerics.estimators` on the
float32 magnitudes (as the compressor sees an fp32 gradient); :mod:`scipy.stats` only draws
the densities:

- exponential: scale ``β = μ`` (``μ`` the mean of all magnitudes, zeros included);
- gamma: shape ``α`` from ``s = ln μ − mean(ln a)`` (the mean of ``ln`` over the non-zero
  magnitudes, :func:`compressors.numerics.estimators.gamma_shape`), scale ``μ/α``;
- generalized Pareto (location 0): moments, ``r = μ²/v``, ``ξ = (1 − r)/2``,
  ``σ = μ(r + 1)/2`` (:func:`compressors.numerics.estimators.gpareto_params`).

A law is left out of the picture (``ValueError``) where its fit is degenerate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import stats

from compressors.numerics import estimators


def _magnitudes(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.abs(np.asarray(a, dtype=np.float32)).ravel())


def fit_exponential(a: np.ndarray) -> dict[str, float]:
    """Exponential fit of magnitudes ``a``: ``{"scale": β}`` (SIDCo-E's estimator)."""
    mu = float(estimators.mean(_magnitudes(a)))
    if not mu > 0:
        raise ValueError("exponential fit needs a non-zero |g|")
    return {"scale": mu}


def fit_gamma(a: np.ndarray) -> dict[str, float]:
    """Gamma fit of magnitudes ``a``: ``{"shape": α, "scale": β}`` (SIDCo-GP's first stage)."""
    x = _magnitudes(a)
    if int(torch.count_nonzero(x)) == 0:
        raise ValueError("gamma fit needs at least one non-zero |g|")
    mu = estimators.mean(x)
    alpha = estimators.gamma_shape(mu, estimators.mean_log_positive(x))
    return {"shape": float(alpha), "scale": float(mu / alpha)}


def fit_gpareto(a: np.ndarray) -> dict[str, float]:
    """Generalized-Pareto fit (location 0) of magnitudes ``a``: ``{"shape": ξ, "scale": σ}`` (SIDCo-P's estimator)."""
    mu, var = estimators.mean_and_var(_magnitudes(a))
    if not float(var) > 0 or not float(mu) > 0:
        raise ValueError("generalized-Pareto fit needs |g| with positive mean and variance")
    xi, sigma = estimators.gpareto_params(mu, var)
    return {"shape": float(xi), "scale": float(sigma)}


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


def trace_axes(path: str) -> tuple[list[int], list[int]]:
    """The recorded iterations and worker indices of the trace at ``path`` (what the quality
    page offers to pick); ValueError or OSError when it cannot be read."""
    import traces

    trace = traces.open(path)
    return list(trace.iterations), list(range(trace.workers))


def gradient_histogram(path: str, iteration: int, worker: int, density_target: float | None = None) -> dict[str, Any]:
    """:func:`histogram` of the recorded 1-D gradient of (``iteration``, ``worker``) in the trace at
    ``path`` (one worker, the whole vector, before error feedback); ValueError or OSError when it
    cannot be read."""
    import traces

    grad = traces.open(path).gradient(int(iteration), int(worker)).detach().cpu().numpy()
    return histogram(grad, density_target=density_target)
