"""Compare: every (compressor, density) of one scenario, ranked, beside the dense baselines.

``sidco compare`` calls :func:`compare`: one process projects every pair with
:func:`pipeline.project.project` (the same projection as ``sidco simulate`` and the What-if
page) and :func:`pipeline.verdict.rank` orders them. ``none``, ``fp16`` and ``powersgd``
(:data:`ALWAYS`) are always compared; compressors whose message ignores the density (the
casts, PowerSGD, ``none``) are projected once, with ``density`` ``None``. Units: seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compressors import takes_density
from pipeline import project as projection
from pipeline.verdict import rank
from results.store import Store

ALWAYS: tuple[str, ...] = ("none", "fp16", "powersgd")
"""The baselines every comparison includes, whatever compressors are asked for."""


def pairs(names: Sequence[str], densities: Sequence[float]) -> list[tuple[str, float | None]]:
    """The (compressor, density) pairs compared: :data:`ALWAYS` and ``names`` (repeats dropped),
    a density-free compressor once with ``None``, every sparsifier at each of ``densities``."""
    chosen = projection.check_compressors(list(dict.fromkeys([*ALWAYS, *names])))
    sparse = [n for n in chosen if takes_density(n)]
    if sparse and not densities:
        raise ValueError(f"{sparse[0]} needs densities (--densities)")
    return ([(n, None) for n in chosen if not takes_density(n)]
            + [(n, float(d)) for d in dict.fromkeys(densities) for n in sparse])


def compare(store: Store, source: projection.Source, cluster: projection.Cluster, names: Sequence[str],
            densities: Sequence[float], *, device: str, profile_file: str | Path | None = None,
            calibration_choice: str | int = "none") -> list[dict[str, Any]]:
    """Project every pair of :func:`pairs` on ``cluster`` and rank them fastest first
    (:func:`pipeline.verdict.rank`): each row is the :func:`pipeline.project.project` result
    plus ``density`` (``None`` for density-free compressors), ``label``, ``rank`` and
    ``speedup_over_baseline``. ``calibration_choice``: as :func:`pipeline.project.project`."""
    chosen = pairs(names, densities)
    free = [n for n, d in chosen if d is None]
    rows = [{**r, "density": None}
            for r in projection.project(store, source, cluster, free, 1.0, device=device, profile_file=profile_file,
                                        calibration_choice=calibration_choice)]
    for density in dict.fromkeys(d for _, d in chosen if d is not None):
        sparse = [n for n, d in chosen if d == density]
        rows += [{**r, "density": density}
                 for r in projection.project(store, source, cluster, sparse, density, device=device,
                                             profile_file=profile_file, calibration_choice=calibration_choice)]
    return rank(rows)
