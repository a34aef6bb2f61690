"""Synthetic traces with known distribution parameters, written in the real trace format.

Each (iteration, worker) gradient is drawn independently from a seeded
``numpy.random.Generator`` (seed sequence ``[seed, iteration, worker]``), so the
same call always writes the same values. ``|g|`` follows the named family:

========================  ==============================================  =========================
kind                      law of ``g``                                     parameters (defaults)
========================  ==============================================  =========================
``laplace``               Laplace(0, b): ``|g|`` ~ Exponential(scale b)   ``scale=1e-3``
``gamma``                 random sign × Gamma(shape α, scale β)           ``shape=0.5, scale=1e-3``
``gpareto``               random sign × GPD(ξ, σ), location 0             ``xi=0.2, scale=1e-3``
``student_t``             scale × Student-t(ν)                            ``df=3.0, scale=1e-3``
``gaussian_mixture``      Σ wᵢ N(0, σᵢ²)                                   ``weights=(0.9, 0.1), sigmas=(1e-4, 1e-2)``
========================  ==============================================  =========================
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from traces.errors import TraceError
from traces.format import TraceWriter
from traces.reader import Trace, open_trace

KINDS = ("laplace", "gamma", "gpareto", "student_t", "gaussian_mixture")

_DEFAULTS: dict[str, dict[str, Any]] = {
    "laplace": {"scale": 1e-3},
    "gamma": {"shape": 0.5, "scale": 1e-3},
    "gpareto": {"xi": 0.2, "scale": 1e-3},
    "student_t": {"df": 3.0, "scale": 1e-3},
    "gaussian_mixture": {"weights": [0.9, 0.1], "sigmas": [1e-4, 1e-2]},
}


def _positive(kind: str, params: Mapping[str, Any], *names: str) -> None:
    for name in names:
        value = params[name]
        if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
            raise TraceError(f"synthetic {kind}: parameter {name} must be a finite number > 0, got {value!r}")


def _signs(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.random(n) < 0.5, -1.0, 1.0)


def _laplace(rng: np.random.Generator, n: int, p: Mapping[str, Any]) -> np.ndarray:
    return rng.laplace(0.0, p["scale"], n)


def _gamma(rng: np.random.Generator, n: int, p: Mapping[str, Any]) -> np.ndarray:
    return _signs(rng, n) * rng.gamma(p["shape"], p["scale"], n)


def _gpareto(rng: np.random.Generator, n: int, p: Mapping[str, Any]) -> np.ndarray:
    u = 1.0 - rng.random(n)  # in (0, 1]
    xi, sigma = p["xi"], p["scale"]
    magnitude = -sigma * np.log(u) if abs(xi) < 1e-12 else sigma / xi * (u ** (-xi) - 1.0)
    return _signs(rng, n) * magnitude


def _student_t(rng: np.random.Generator, n: int, p: Mapping[str, Any]) -> np.ndarray:
    return p["scale"] * rng.standard_t(p["df"], n)


def _mixture(rng: np.random.Generator, n: int, p: Mapping[str, Any]) -> np.ndarray:
    weights = np.asarray(p["weights"], dtype=np.float64)
    sigmas = np.asarray(p["sigmas"], dtype=np.float64)
    component = rng.choice(len(weights), size=n, p=weights / weights.sum())
    return rng.standard_normal(n) * sigmas[component]


_SAMPLERS: dict[str, Callable[[np.random.Generator, int, Mapping[str, Any]], np.ndarray]] = {
    "laplace": _laplace,
    "gamma": _gamma,
    "gpareto": _gpareto,
    "student_t": _student_t,
    "gaussian_mixture": _mixture,
}


def _validate(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    if kind not in _DEFAULTS:
        raise TraceError(f"unknown synthetic kind {kind!r}; choose one of {', '.join(KINDS)}")
    unknown = set(params) - set(_DEFAULTS[kind])
    if unknown:
        raise TraceError(f"synthetic {kind}: unknown parameter(s) {sorted(unknown)}; known: {sorted(_DEFAULTS[kind])}")
    merged = {**_DEFAULTS[kind], **params}
    if kind == "gaussian_mixture":
        weights, sigmas = list(merged["weights"]), list(merged["sigmas"])
        if not weights or len(weights) != len(sigmas):
            raise TraceError("synthetic gaussian_mixture: weights and sigmas must be non-empty and of equal length")
        if not all(np.isfinite(w) and w > 0 for w in weights) or not all(np.isfinite(s) and s > 0 for s in sigmas):
            raise TraceError("synthetic gaussian_mixture: weights and sigmas must be finite and > 0")
        merged["weights"], merged["sigmas"] = [float(w) for w in weights], [float(s) for s in sigmas]
    elif kind == "gpareto":
        _positive(kind, merged, "scale")
        if not (isinstance(merged["xi"], (int, float)) and 0 <= merged["xi"] < 1):
            raise TraceError(f"synthetic gpareto: xi must be in [0, 1), got {merged['xi']!r}")
    else:
        _positive(kind, merged, *_DEFAULTS[kind])
    return merged


def sample(kind: str, numel: int, seed: int, iteration: int = 0, worker: int = 0, **params: Any) -> torch.Tensor:
    """Draw one 1-D float32 gradient of ``numel`` elements from ``kind`` (see module docstring)."""
    merged = _validate(kind, params)
    rng = np.random.default_rng([int(seed), int(iteration), int(worker)])
    return torch.from_numpy(_SAMPLERS[kind](rng, int(numel), merged).astype(np.float32))


def synthetic(
    out_dir: str | os.PathLike[str],
    kind: str,
    numel: int,
    workers: int = 1,
    iterations: int = 1,
    seed: int = 0,
    *,
    layers: Sequence[tuple[str, Sequence[int]]] | None = None,
    timings: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    **params: Any,
) -> Trace:
    """Write a synthetic trace at ``out_dir`` and return it opened.

    ``numel`` elements per gradient, ``workers`` workers, recorded iterations
    ``1..iterations``. ``layers`` (name, shape) splits the vector into layers (their
    sizes must sum to ``numel``; default one layer ``"synthetic"``). ``timings``
    defaults to zero compute times (no compute was measured). ``params`` are the
    family's parameters (module docstring); they are stored in the manifest under
    ``synthetic``.
    """
    merged = _validate(kind, params)
    if numel < 1 or workers < 1 or iterations < 1:
        raise TraceError(f"{out_dir}: numel, workers and iterations must be >= 1")
    layer_list = [("synthetic", (int(numel),))] if layers is None else [(n, tuple(s)) for n, s in layers]
    if sum(int(np.prod(s)) for _, s in layer_list) != numel:
        raise TraceError(f"{out_dir}: layer shapes do not sum to numel={numel}")
    times = {
        "forward_s": 0.0,
        "backward_s": [0.0] * len(layer_list),
        "optimizer_s": 0.0,
        "batch_size": 1,
        "device": "cpu",
        "measured": False,
    }
    if timings is not None:
        times.update(timings)
    with TraceWriter(
        out_dir, workload=f"synthetic-{kind}", layers=[(n, s, "float32") for n, s in layer_list], workers=workers, overwrite=overwrite
    ) as writer:
        for iteration in range(1, iterations + 1):
            writer.write_iteration(iteration, [sample(kind, numel, seed, iteration, w, **merged) for w in range(workers)])
        path = writer.close(
            timings=times, extra={"synthetic": {"kind": kind, "params": merged, "seed": int(seed)}, "every": 1}
        )
    return open_trace(path)
