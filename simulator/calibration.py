"""Calibration constants fitted from measured collectives (the emulation part produces them)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """Fitted α–β constants.

    ``alpha_s``: software overhead per message (s), added to the link latency;
    ``beta_s_per_byte``: seconds per byte at the calibration's reference bandwidth (kept
    for reference); ``efficiency``: the fraction of nominal bandwidth a collective achieves
    (> 0); links run at ``efficiency × bandwidth``.
    """

    alpha_s: float
    beta_s_per_byte: float
    efficiency: float

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0 and math.isfinite(self.alpha_s)):
            raise ValueError(f"calibration alpha_s must be >= 0 s, got {self.alpha_s!r}")
        if not (self.efficiency > 0 and math.isfinite(self.efficiency)):
            raise ValueError(f"calibration efficiency must be > 0, got {self.efficiency!r}")
        if not self.beta_s_per_byte >= 0:
            raise ValueError(f"calibration beta_s_per_byte must be >= 0, got {self.beta_s_per_byte!r}")

    def latency(self, latency_s: float) -> float:
        """Effective per-message latency (s)."""
        return latency_s + self.alpha_s

    def bandwidth(self, bandwidth_bps: float) -> float:
        """Effective link bandwidth (bits/s)."""
        return bandwidth_bps * self.efficiency
