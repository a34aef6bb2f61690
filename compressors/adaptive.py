"""Adaptive number of SIDCo stages: keep the windowed achieved/target ratio in a band.

``ρ = (selected / n) / δ``. The controller averages ρ over the calls made since the last change
of stage count (at most ``window`` of them). Once ``min_calls`` calls are in and the average is
outside ``[1 − band, 1 + band]`` it moves the stage count ``M`` by one within ``[1, ⌈log₂(1/δ)⌉]``. Which way to move depends on the data (heavy
tails over-select less with more stages, light tails the opposite), so the rule is error-driven:
keep moving in the current direction while ``|log ρ|`` improves, reverse when the last move made
it worse, and stay put at a stage count whose both neighbours were measured worse.
"""

from __future__ import annotations

import math
from collections import deque


def max_stages(density: float) -> int:
    """Upper bound of the stage count for ``density``: ``max(1, ⌈log₂(1/δ)⌉)``."""
    return max(1, math.ceil(math.log2(1.0 / density) - 1e-12))


class StageController:
    """Chooses the stage count for the next call from the achieved densities of past calls."""

    def __init__(self, density: float, initial: int = 1, window: int = 5, band: float = 0.2,
                 min_calls: int = 2):
        self.density = density
        self.upper = max_stages(density)
        self.stages = min(max(1, initial), self.upper)
        self.window = window
        self.band = band
        self.min_calls = min(min_calls, window)
        self.direction = 1
        self._ratios: deque[float] = deque(maxlen=window)
        self._errors: dict[int, float] = {}

    @property
    def windowed_ratio(self) -> float | None:
        """Mean achieved/target ratio of the calls since the last change (``None`` before any)."""
        return sum(self._ratios) / len(self._ratios) if self._ratios else None

    def observe(self, selected: int, numel: int) -> None:
        """Record one call's outcome and possibly change :attr:`stages` for the next call."""
        self._ratios.append((selected / numel) / self.density)
        if len(self._ratios) < self.min_calls:
            return
        rho = self.windowed_ratio
        if 1.0 - self.band <= rho <= 1.0 + self.band:
            return
        error = abs(math.log(max(rho, 1e-12)))
        previous = self._errors.get(self.stages - self.direction)
        if previous is not None and error > previous:
            self.direction = -self.direction
        self._errors[self.stages] = error
        nxt = self._next()
        if nxt != self.stages:
            self.stages = nxt
            self._ratios.clear()

    def _next(self) -> int:
        here = self._errors[self.stages]
        for direction in (self.direction, -self.direction):
            candidate = self.stages + direction
            if not 1 <= candidate <= self.upper:
                continue
            known = self._errors.get(candidate)
            if known is None or known < here:
                self.direction = direction
                return candidate
        return self.stages
