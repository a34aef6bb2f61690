"""Fit α (s), β (s/byte) and an efficiency factor to measured collective times.

Model (the ring α–β forms of :func:`simulator.collectives.ring_terms`), for measurement ``i``
of ``op_i`` on ``p_i`` workers, ``n_i`` bytes (an all-gather's gathered output), link ``B_i``
bits/s, with ``(steps_i, volume_i) = ring_terms(op_i, p_i)``:

    t_i ≈ steps_i·α + volume_i·n_i·8/(efficiency·B_i)

Linear least squares in (α, 1/efficiency), weighted by 1/t_i so small and large messages
count alike (relative error); α is constrained to ≥ 0. ``beta_s_per_byte`` is the fitted
seconds per byte at the reference bandwidth (the slowest measured link), i.e.
``8/(efficiency·B_ref)``. Meaning for a simulator: use ``alpha_s`` per message and an
effective link rate of ``efficiency × bandwidth``.

:func:`fit` pools every operation; :func:`fit_per_op` fits each operation on its own
measurements (gloo's all-gather reaches a different fraction of the link than its
all-reduce), which :class:`simulator.Calibration` carries in ``ops``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from simulator.collectives import ring_terms


@dataclass(frozen=True)
class CalibrationFit:
    """Fitted constants with the quality of the fit (relative residuals)."""

    alpha_s: float
    beta_s_per_byte: float
    efficiency: float
    reference_bandwidth_bps: float
    points: int
    median_abs_error_pct: float
    max_abs_error_pct: float

    def as_dict(self) -> dict[str, Any]:
        """The fit as a plain dict (JSON-serialisable)."""
        return asdict(self)


def _design(rows: list[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    terms = [ring_terms(r["op"], int(r["workers"])) for r in rows]
    a = np.array([steps for steps, _ in terms], dtype=float)
    b = np.array(
        [volume * float(r["nbytes"]) * 8.0 / float(r["bandwidth_bps"]) for (_, volume), r in zip(terms, rows)],
        dtype=float,
    )
    return a, b


def fit(measurements: Iterable[Mapping[str, Any]]) -> CalibrationFit:
    """Fit α, β and efficiency to ``measurements`` (dicts with op, workers, nbytes, bandwidth_bps,
    seconds). Raises ``ValueError`` with fewer than two usable (shaped, timed) measurements."""
    rows = [r for r in measurements if r.get("bandwidth_bps") and float(r["seconds"]) > 0]
    if len(rows) < 2:
        raise ValueError(
            f"calibration needs at least 2 shaped collective measurements, found {len(rows)}; "
            "run 'sidco emulate collective' first"
        )
    t = np.array([float(r["seconds"]) for r in rows])
    a, b = _design(rows)
    weights = 1.0 / t
    matrix = np.column_stack([a, b]) * weights[:, None]
    (alpha, inverse_eff), *_ = np.linalg.lstsq(matrix, t * weights, rcond=None)
    if alpha < 0:
        alpha = 0.0
        inverse_eff = float(np.sum(b * weights * weights * t) / np.sum((b * weights) ** 2))
    if inverse_eff <= 0:
        raise ValueError("calibration failed: the measured times do not grow with message size")
    efficiency = 1.0 / float(inverse_eff)
    reference = min(float(r["bandwidth_bps"]) for r in rows)
    predicted = a * alpha + b * inverse_eff
    errors = np.abs(predicted - t) / t * 100.0
    return CalibrationFit(
        alpha_s=float(alpha),
        beta_s_per_byte=8.0 / (efficiency * reference),
        efficiency=efficiency,
        reference_bandwidth_bps=reference,
        points=len(rows),
        median_abs_error_pct=float(np.median(errors)),
        max_abs_error_pct=float(np.max(errors)),
    )


def fit_per_op(measurements: Iterable[Mapping[str, Any]]) -> dict[str, CalibrationFit]:
    """One :func:`fit` per operation (``op``) that has at least two usable measurements and, for
    an operation measured at more than one worker count, one per count (key ``"<op>@<workers>"``)
    with at least two measurements."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in measurements:
        if r.get("bandwidth_bps") and float(r["seconds"]) > 0:
            groups.setdefault(str(r["op"]), []).append(r)
    for op, rows in list(groups.items()):
        counts = sorted({int(r["workers"]) for r in rows})
        if len(counts) > 1:
            for p in counts:
                groups[f"{op}@{p}"] = [r for r in rows if int(r["workers"]) == p]
    return {key: fit(rows) for key, rows in sorted(groups.items()) if len(rows) >= 2}


def compare(measurements: Iterable[Mapping[str, Any]], calibration: Any) -> list[dict[str, Any]]:
    """Each shaped measurement (``op, workers, nbytes, bandwidth_bps, seconds``) beside the
    simulator's analytic time for it without and with ``calibration`` (a
    :class:`simulator.Calibration`): ``uncalibrated_s``, ``calibrated_s`` (s) and their
    signed errors ``uncalibrated_error_pct``, ``calibrated_error_pct`` (% of the measurement).
    An all-gather's ``nbytes`` is its gathered output, so each rank contributes ``nbytes/p``."""
    import simulator

    out = []
    for r in measurements:
        if not r.get("bandwidth_bps") or not float(r["seconds"]) > 0:
            continue
        p, seconds = int(r["workers"]), float(r["seconds"])
        nbytes = float(r["nbytes"]) / p if r["op"] == "allgather" else float(r["nbytes"])
        times = {
            label: simulator.collective_time(r["op"], nbytes, p, float(r["bandwidth_bps"]), 0.0, fidelity="analytic",
                                             calibration=cal)
            for label, cal in (("uncalibrated", None), ("calibrated", calibration))
        }
        out.append({
            "op": r["op"], "workers": p, "nbytes": int(r["nbytes"]), "bandwidth_bps": float(r["bandwidth_bps"]),
            "seconds": seconds,
            **{f"{label}_s": t for label, t in times.items()},
            **{f"{label}_error_pct": (t - seconds) / seconds * 100.0 for label, t in times.items()},
        })
    return out
