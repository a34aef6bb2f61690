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
from simulator import sharded
from pipeline import project as projections
from pipeline import quality
from pipeline.memory import memory_of, memory_setting
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
    the memory per GPU (:func:`pipeline.memory.memory_of`: ``memory_gib``, ``memory_capacity_gib``, ``fits``,
    under the ``--parallel`` family) and ``collective``/``collectives`` (what the
    compressor replaces; each collective's bytes, total and exposed time). Pairs the ``--parallel``
    cannot run are left out (:func:`split_refused` lists them with the reason)."""
    projection = projections.registered(store, projection)
    powersgd_rank = int(projection.cluster.options.get("rank", 1))
    projection = split_refused(projection)[0]
    measured = quality.for_source(store, projection.source, list(projection.pairs), rank=powersgd_rank,
                                  progress=progress)
    held = memory_setting(projection)
    rows = [{**result, "density": density, **collective_fields(result),
             **memory_of(projection, result["compressor"], held)}
            for (_, density), result in projections.project_pairs(store, projection)]
    return projection, quality.attach(rank(rows), measured)


def split_refused(projection: projections.Projection) -> tuple[projections.Projection, list[dict[str, Any]]]:
    """``projection`` without the pairs its ``--parallel`` cannot run (:func:`pipeline.request.refused`),
    and a row for each: ``compressor``, ``density``, ``label``, ``rank`` ``None`` and ``refused`` (the reason, one line)."""
    held = projection.cluster.options.get("sharding")
    reasons = requests.refused("ddp" if held is None else held.parallel, [pair.compressor for pair in projection.pairs])
    kept, refused = [], []
    for pair in projection.pairs:
        reason = reasons.get(pair.compressor)
        if reason is None:
            kept.append(pair)
        else:
            refused.append({"compressor": pair.compressor, "density": pair.density, "label": pair.label,
                            "rank": None, "refused": reason})
    return replace(projection, pairs=tuple(kept)), refused


def collective_fields(result: dict[str, Any]) -> dict[str, Any]:
    """A DDP result's ``collective`` and ``collectives`` as the sharded plan reports them
    (:func:`simulator.sharded.summarize`): the bucket all-reduce, its bytes, total and exposed time."""
    if "collectives" in result:
        return {}
    label = sharded.collective_label("ddp", result["compressor"])
    return {"collective": label, "collectives": {label: {
        "stream": "all-reduce", "per": "step", "count": result["buckets"], "bytes_per_gpu": result["wire_bytes"],
        "total_s": result["comm_s"], "exposed_s": result["exposed_comm_s"], "compressed": result["compressor"] != "none"}}}


def headroom(rows: Sequence[dict[str, Any]]) -> str | None:
    """What compression can touch, from the ``none`` row of ``rows``: each collective's total and
    exposed time in the step, and the most compressing the gradient collective its ``collective``
    names can save (its exposed time over the step: what is hidden behind compute saves nothing);
    ``None`` without a ``none`` row."""
    none = next((r for r in rows if r.get("compressor") == "none" and "collectives" in r), None)
    if none is None:
        return None
    step = none["iteration_s"]
    parts = [f"{name} {c['total_s'] * 1e3:.1f} ms ({c['exposed_s'] * 1e3:.1f} ms exposed)"
             for name, c in none["collectives"].items()]
    target = none["collectives"].get(none["collective"])
    bound = "" if target is None or step <= 0 else (
        f"; compressing the {none['collective']} saves at most {target['exposed_s'] / step:.1%} of the step")
    return f"of a {step * 1e3:.1f} ms step without compression: " + ", ".join(parts) + bound
