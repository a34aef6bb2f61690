"""Fit α, β and efficiency to the measured collectives in the store and store the fit: one fit
pooling every operation and one per operation (and per worker count where the counts differ),
optionally compared with held-out measurements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import simulator
from emulation.calibration import CalibrationFit, compare, fit, fit_per_op
from results.store import Store

MODEL = "ring alpha-beta, {ops}, weighted by 1/t"


@dataclass(frozen=True)
class Result:
    """A stored calibration: its id, the emulations fitted, the pooled and per-operation fits,
    the stored :class:`simulator.Calibration`, and the held-out comparison rows (see
    :func:`emulation.calibration.compare`)."""

    calibration_id: int
    emulation_ids: list[int]
    pooled: CalibrationFit
    per_op: dict[str, CalibrationFit]
    calibration: simulator.Calibration
    check: list[dict[str, Any]]


def run(store: Store, emulation_ids: Sequence[int] | None = None, check: Sequence[int] = ()) -> Result:
    """Fit the measurements of finished collective emulations (all, or ``emulation_ids``) except
    the held-out ``check`` emulations, store the pooled fit and one row per operation, and compare
    the held-out measurements with the model without and with the new calibration."""
    measured = store.collective_measurements(emulation_ids)
    held_out = set(check)
    rows = [r for r in measured if r["emulation_id"] not in held_out]
    checks = [r for r in measured if r["emulation_id"] in held_out]
    if held_out and not checks:
        raise ValueError(f"--check: no collective measurements in emulation(s) {sorted(held_out)}")
    pooled = fit(rows)
    per_op = fit_per_op(rows)
    emulations = sorted({r["emulation_id"] for r in rows})

    def stored(result: CalibrationFit, ops: str) -> dict[str, Any]:
        return {"alpha_s": result.alpha_s, "beta_s_per_byte": result.beta_s_per_byte,
                "efficiency": result.efficiency, "fit_error_pct": result.median_abs_error_pct,
                "source": {"emulation_ids": emulations, "model": MODEL.format(ops=ops), **result.as_dict()}}

    calibration_id = store.insert_calibration(
        stored(pooled, "all operations"), {op: stored(f, f"{op} only") for op, f in per_op.items()})
    calibration = simulator.Calibration.from_rows(store.calibration_rows(calibration_id))
    return Result(calibration_id, emulations, pooled, per_op, calibration,
                  compare(checks, calibration) if checks else [])
