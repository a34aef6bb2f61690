"""Calibration constants fitted from measured collectives (the emulation part produces them).

A calibration holds one pooled fit (every operation alike) and, when the collectives were
measured per operation, one fit per operation (``ops``: ``allreduce``, ``allgather``, ...).
Where an operation was measured at several worker counts it also holds one fit per count,
keyed ``"<op>@<workers>"`` (e.g. ``allgather@2``: gloo's two-rank all-gather sends and
receives on one connection and reaches a smaller share of the link than at three or more
ranks). Each fit is an α (s, added to the link latency of every message step) and an
efficiency (links run at ``efficiency × bandwidth``); :meth:`Calibration.latency` and
:meth:`Calibration.bandwidth` apply the most specific fit there is: the operation's at that
worker count, else the operation's, else the pooled one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field


def _check(alpha_s: float, efficiency: float, what: str) -> None:
    if not (alpha_s >= 0 and math.isfinite(alpha_s)):
        raise ValueError(f"{what} alpha_s must be >= 0 s, got {alpha_s!r}")
    if not (efficiency > 0 and math.isfinite(efficiency)):
        raise ValueError(f"{what} efficiency must be > 0, got {efficiency!r}")


@dataclass(frozen=True)
class OpFit:
    """The fit of one collective operation.

    ``alpha_s``: software overhead per message step (s); ``efficiency``: fraction of the
    nominal bandwidth the operation achieves (> 0); ``fit_error_pct``: median |relative
    residual| of the fit over its own measurements (%), ``None`` when unknown; ``points``:
    measurements fitted.
    """

    alpha_s: float
    efficiency: float
    fit_error_pct: float | None = None
    points: int = 0

    def __post_init__(self) -> None:
        _check(self.alpha_s, self.efficiency, "calibration")


@dataclass(frozen=True)
class Calibration:
    """Fitted α–β constants, pooled and per operation.

    ``alpha_s``: software overhead per message (s), added to the link latency;
    ``beta_s_per_byte``: seconds per byte at the calibration's reference bandwidth (kept
    for reference); ``efficiency``: the fraction of nominal bandwidth a collective achieves
    (> 0); links run at ``efficiency × bandwidth``. ``ops`` maps an operation name
    (``allreduce``, ``allgather``, as in :func:`simulator.collective_time`), or an operation at
    one worker count (``allgather@2``), to its own :class:`OpFit`; operations missing there
    use the pooled constants. ``calibration_id``:
    the store row it was read from (``None`` when built in memory).
    """

    alpha_s: float
    beta_s_per_byte: float
    efficiency: float
    ops: Mapping[str, OpFit] = field(default_factory=dict, hash=False)
    calibration_id: int | None = None

    def __post_init__(self) -> None:
        _check(self.alpha_s, self.efficiency, "calibration")
        if not self.beta_s_per_byte >= 0:
            raise ValueError(f"calibration beta_s_per_byte must be >= 0, got {self.beta_s_per_byte!r}")

    def fit_for(self, op: str | None, workers: int | None = None) -> OpFit:
        """The fit applied to ``op`` on ``workers`` ranks: ``op@workers``'s, else ``op``'s, else
        the pooled one (``op`` ``None``: pooled)."""
        if op is not None:
            for key in ((f"{op}@{workers}",) if workers is not None else ()) + (op,):
                if key in self.ops:
                    return self.ops[key]
        return OpFit(self.alpha_s, self.efficiency)

    def latency(self, latency_s: float, op: str | None = None, workers: int | None = None) -> float:
        """Effective per-message latency (s) of ``op`` on ``workers`` ranks."""
        return latency_s + self.fit_for(op, workers).alpha_s

    def bandwidth(self, bandwidth_bps: float, op: str | None = None, workers: int | None = None) -> float:
        """Effective link bandwidth (bits/s) of ``op`` on ``workers`` ranks."""
        return bandwidth_bps * self.fit_for(op, workers).efficiency

    @classmethod
    def from_rows(cls, rows: list[Mapping]) -> Calibration:
        """Build from the ``calibrations`` rows of one fit: the pooled row (``op`` NULL) and
        one row per operation. Raises ``ValueError`` without a pooled row."""
        pooled = [r for r in rows if _get(r, "op") is None]
        if len(pooled) != 1:
            raise ValueError(f"a calibration needs exactly one pooled row, got {len(pooled)}")
        base = pooled[0]
        ops = {}
        for r in rows:
            if _get(r, "op") is not None:
                source = json.loads(_get(r, "source_json") or "{}")
                ops[str(r["op"])] = OpFit(float(r["alpha_s"]), float(r["efficiency"]),
                                          _get(r, "fit_error_pct"), int(source.get("points", 0)))
        return cls(float(base["alpha_s"]), float(base["beta_s_per_byte"]), float(base["efficiency"]),
                   ops, int(base["id"]) if _get(base, "id") is not None else None)


def _get(row: Mapping, key: str):
    return row[key] if key in row.keys() else None
