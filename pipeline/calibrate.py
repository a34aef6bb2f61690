"""Fit α, β and efficiency to the measured collectives in the store and store the fit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emulation.calibration import CalibrationFit, fit
from results.store import Store

MODEL = "ring alpha-beta, weighted by 1/t"


def run(store: Store, emulation_ids: Sequence[int] | None = None) -> tuple[int, dict[str, Any], CalibrationFit]:
    """Fit the measurements of finished collective emulations (all, or ``emulation_ids``);
    returns ``(calibration_id, source description, fit)``."""
    rows = store.collective_measurements(emulation_ids)
    result = fit(rows)
    source = {"emulation_ids": sorted({r["emulation_id"] for r in rows}), "model": MODEL, **result.as_dict()}
    calibration_id = store.add_calibration(result.alpha_s, result.beta_s_per_byte, result.efficiency, source,
                                           fit_error_pct=result.median_abs_error_pct)
    return calibration_id, source, result
