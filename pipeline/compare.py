"""Compare: every (compressor, density) of one scenario, ranked, beside the dense baselines.

``sidco compare`` fills one :class:`pipeline.request.Request` and calls :func:`compare`: one
process projects every pair with :func:`pipeline.project.project` (the same projection as
``sidco simulate`` and the What-if page) on the request's source, resolved once, and
:func:`pipeline.verdict.rank` orders them. ``none``, ``fp16`` and ``powersgd``
(:data:`ALWAYS`) are always compared; compressors whose message ignores the density (the
casts, PowerSGD, ``none``) are projected once, with ``density`` ``None``. Every row carries
what it sends (:mod:`pipeline.quality`: achieved density, energy vs Top-k, where they come
from), measured before the projection, so replays it runs are the trace's replays the cost policy
reads. Units: seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from compressors.work import REGISTRY
from costs import memory
from pipeline import project as projections
from pipeline import quality
from pipeline import request as requests
from pipeline.verdict import rank
from results.store import Store
from units import Pair

ALWAYS: tuple[str, ...] = tuple(c.name for c in REGISTRY if c.always_compared)
"""The baselines every comparison includes, whatever compressors are asked for (the cards marked
``always_compared``: ``none``, ``fp16`` and PowerSGD)."""


def pairs(names: Sequence[str], densities: Sequence[float]) -> list[Pair]:
    """The (compressor, density) pairs compared: :data:`ALWAYS` and ``names`` (repeats dropped)
    by the request's rule (:func:`pipeline.request.pairs`)."""
    return requests.pairs([*ALWAYS, *names], densities)


def with_baselines(request: requests.Request) -> requests.Request:
    """``request`` with :data:`ALWAYS` in front of its compressors (repeats dropped)."""
    return replace(request, compressors=tuple(dict.fromkeys([*ALWAYS, *request.compressors])))


def compare(store: Store, projection: projections.Projection,
            progress: Callable[[str, int, int], None] | None = None) -> tuple[projections.Projection,
                                                                               list[dict[str, Any]]]:
    """Project every pair of ``projection`` (resolved from a request with the baselines,
    :func:`with_baselines`) and rank them fastest first (:func:`pipeline.verdict.rank`): the
    projection, its trace registered in the store, and the rows, each the
    :func:`pipeline.project.project` result (``density`` ``None`` for density-free compressors)
    plus ``label``, ``rank``, ``speedup_over_baseline``, the quality columns
    (:data:`pipeline.quality.COLUMNS`, by :data:`pipeline.quality.QUALITY_RULE`: a trace's
    missing replays run first, ``progress(what, calls_done, calls_total)`` after every call) and
    the memory per GPU (:func:`costs.memory.per_gpu`: ``memory_gib``, ``memory_capacity_gib``, ``fits``)."""
    projection = projections.registered(store, projection)
    powersgd_rank = int(projection.cluster.options.get("rank", 1))
    measured = quality.for_source(store, projection.source, list(projection.pairs), rank=powersgd_rank,
                                  progress=progress)
    workload = projection.workload
    shapes = [layer.shape for layer in workload.layers]
    rows = [{**result, "density": density,
             **memory.per_gpu(result["compressor"], workload.nbytes // workload.itemsize, shapes,
                              projection.source.device.name, powersgd_rank)}
            for (_, density), result in projections.project_pairs(store, projection)]
    return projection, quality.attach(rank(rows), measured)
