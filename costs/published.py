"""The numbers the GPU device rules take from published kernel timings.

``profiles/published-<gpu>.json`` hold published GPU timings (kernel rows of
:mod:`costs.device_profile`, each citing where it was published). From them:

- ``launch_s``, the host cost of one eager operation: the median over every published
  ``launch`` row of its seconds per launch, for every GPU;
- a GPU's sustained bandwidth ``B`` (bytes read plus written per second, charged to reads and
  writes alike) and its device→host synchronisation ``S``: the least squares on relative error
  of ``t = launches · launch_s + syncs · S + moved / B`` over its ``copy`` rows (``moved`` = 2 ·
  ``numel`` · ``element_bytes``), linear in ``S`` and ``1/B`` (``S`` held at 0 if it comes out
  below); a GPU whose copy rows include no synchronisation takes the median ``S`` of the others.

Nothing is measured here: the rows are data, read once per process. Units: seconds, bytes/s.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costs import device_profile


@dataclass(frozen=True)
class Published:
    """What a GPU's published rows say: ``bandwidth_Bps`` (``None`` without copy rows),
    ``sync_s`` (``None`` when its copy rows include no synchronisation), how many ``copy`` rows
    they rest on and the file they come from."""

    bandwidth_Bps: float | None
    sync_s: float | None
    copy_rows: int
    file: str


def path(name: str) -> Path:
    """Where the published profile of GPU ``name`` lives (``profiles/published-<name>.json``)."""
    import profiles

    return profiles.HERE / f"published-{name}.json"


@functools.lru_cache(maxsize=16)
def profile(name: str) -> device_profile.DeviceProfile | None:
    """The published profile of GPU ``name``, ``None`` when none is shipped."""
    file = path(name)
    return device_profile.load(file) if file.exists() else None


def names() -> list[str]:
    """GPUs with a shipped published profile."""
    import profiles

    return sorted(p.name.removeprefix("published-").removesuffix(".json") for p in profiles.HERE.glob("published-*.json"))


@functools.lru_cache(maxsize=1)
def launch_s() -> float | None:
    """Seconds per eager operation: the median of every published ``launch`` row (``None`` without one)."""
    per_launch = [r["seconds"] / r["launches"] for name in names() for r in profile(name).kernels
                  if r["kernel"] == "launch" and r["launches"] > 0]
    return statistics.median(per_launch) if per_launch else None


def fit_copies(rows: Sequence[Mapping[str, Any]], launch: float) -> tuple[float | None, float | None]:
    """``(B, S)`` from ``copy`` rows (the module docstring): bandwidth in bytes/s (``None``
    without copy rows) and sync seconds (``None`` when no row includes a synchronisation)."""
    copies = [r for r in rows if r["kernel"] == "copy"]
    if not copies:
        return None, None
    # residual_i = x_i·S + y_i·(1/B) − b_i, with x = syncs/t, y = moved/t, b = 1 − launches·launch/t
    x = [r["syncs"] / r["seconds"] for r in copies]
    y = [2.0 * r["numel"] * r["element_bytes"] / r["seconds"] for r in copies]
    b = [1.0 - r["launches"] * launch / r["seconds"] for r in copies]
    xx, xy, yy = (sum(p * q for p, q in zip(u, v)) for u, v in ((x, x), (x, y), (y, y)))
    xb, yb = sum(p * q for p, q in zip(x, b)), sum(p * q for p, q in zip(y, b))
    det = xx * yy - xy * xy
    if xx > 0 and det > 0:
        sync, inverse = (xb * yy - yb * xy) / det, (yb * xx - xb * xy) / det
        if sync >= 0:
            return 1.0 / inverse, sync
    inverse = yb / yy
    return 1.0 / inverse, (0.0 if xx > 0 else None)


@functools.lru_cache(maxsize=16)
def numbers(name: str) -> Published | None:
    """What the published rows of GPU ``name`` say (``None`` when none are shipped or there is
    no published launch row to take the launches they include off)."""
    shipped, launch = profile(name), launch_s()
    if shipped is None or launch is None:
        return None
    bandwidth, sync = fit_copies(shipped.kernels, launch)
    return Published(bandwidth, sync, sum(r["kernel"] == "copy" for r in shipped.kernels), path(name).name)


@functools.lru_cache(maxsize=1)
def sync_s() -> float | None:
    """The synchronisation of a GPU without rows that include one: the median over the GPUs whose
    published copy rows do (``None`` if none do)."""
    fitted = [n.sync_s for n in map(numbers, names()) if n is not None and n.sync_s is not None]
    return statistics.median(fitted) if fitted else None
