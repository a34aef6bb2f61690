"""Memory per GPU of a projection's rows: the one function every door's rows carry it from.

``sidco compare``, ``simulate``, ``sweep`` and ``tta`` and the dashboard's What-if and Sweeps pages
put :func:`memory_of` on every row (:data:`MEMORY_KEYS`, GiB), so a configuration reads the same
wherever it is shown; the formulas are :mod:`costs.memory`'s, the state held as the row's
``--parallel`` family holds it (:func:`memory_setting`). A row whose memory is not modelled (a
low-communication strategy, :data:`STRATEGY_UNMODELLED`) carries :func:`unmodelled`: every key
``None`` and ``memory_reason``. Every verdict leaves out what does not fit by
:func:`pipeline.verdict.memory_gate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from costs import memory
from simulator import sharded
from pipeline import project as projections
from pipeline.request import Cluster

MEMORY_KEYS: tuple[str, ...] = ("memory_gib", "memory_parts_gib", "activations_counted", "memory_capacity_gib",
                                "fits")
"""What a row holds in one GPU's memory (:func:`costs.memory.per_gpu`; GiB, ``fits`` ``None`` on a device of
unknown capacity)."""


def memory_of(projection: projections.Projection, compressor: str, held: dict[str, Any] | None = None,
              cluster: Cluster | None = None) -> dict[str, Any]:
    """The memory per GPU of ``compressor`` under ``projection`` on ``cluster`` (``None``: the
    projection's; a sweep passes each point's) by :func:`costs.memory.per_gpu`: ``memory_gib``,
    ``memory_parts_gib``, ``activations_counted``, ``memory_capacity_gib``, ``fits`` (GiB), its
    state held as the cluster's ``--parallel`` family holds it (``held``: :func:`memory_setting`,
    computed here when not given) and PowerSGD's at the cluster's ``rank``."""
    cluster = projection.cluster if cluster is None else cluster
    workload = projection.workload
    return memory.per_gpu(compressor, workload.nbytes // workload.itemsize, [layer.shape for layer in workload.layers],
                          projection.source.device.name, int(cluster.options.get("rank", 1)),
                          **(memory_setting(projection, cluster) if held is None else held))


def memory_setting(projection: projections.Projection, cluster: Cluster | None = None) -> dict[str, Any]:
    """The keyword arguments of :func:`costs.memory.per_gpu` for the ``--parallel`` family of
    ``cluster`` (``None``: the projection's): how the states are sharded, FSDP's working set
    (bytes) and, for a model from its config, the activations of one micro-batch (bytes)."""
    cluster = projection.cluster if cluster is None else cluster
    held = cluster.options.get("sharding") or sharded.Sharding()
    workload = projection.workload
    gpus = int(cluster.options.get("gpus_per_node", 1))
    workers = cluster.nodes * gpus
    out: dict[str, Any] = {"parallel": held.parallel}
    if held.sharded:
        gathered, unsharded = sharded.working_numel(workload)
        out["shard"] = (held.shard_size or gpus) if held.parallel == "hsdp" else workers
        out["working_param_bytes"] = gathered * sharded.DTYPE_BYTES[held.param_dtype]
        out["working_grad_bytes"] = unsharded * sharded.DTYPE_BYTES[held.reduce_dtype]
    model = projection.request.model
    if model is not None:
        from traces import llm

        config = llm.load(model)
        out["activations"] = memory.activation_bytes(config.layers, config.hidden, config.vocab,
                                                     llm.tokens_of(model, projection.request.tokens),
                                                     held.micro_batch or workload.batch_size, held.checkpointing)
    return out


STRATEGY_UNMODELLED = ("not modelled for a low-communication strategy: besides a per-step replica's states each "
                       "site keeps the global parameters and the outer optimizer's momentum, which costs/memory.py "
                       "does not count")
"""Why a DiLoCo or streaming row (``sidco compare``, ``sidco tta``) has no memory per GPU."""


def unmodelled(reason: str) -> dict[str, Any]:
    """The memory keys of a row whose memory is not modelled: each of :data:`MEMORY_KEYS` ``None``
    and ``memory_reason`` (one line, why)."""
    return {**dict.fromkeys(MEMORY_KEYS), "memory_reason": reason}


def capacity_gib(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The device memory (GiB) the first of ``rows`` that states one gives, ``None`` when none does."""
    return next((r["memory_capacity_gib"] for r in rows if r.get("memory_capacity_gib") is not None), None)


def memory_text(row: Mapping[str, Any]) -> str:
    """``row``'s memory per GPU in words: ``memory_gib`` against the device's capacity (GiB) and whether
    it fits, what it counts; ``memory_reason`` where it is not modelled."""
    if row.get("memory_gib") is None:
        return f"not modelled: {row.get('memory_reason') or 'no memory recorded'}"
    counted = ("parameters, gradients, optimizer states, compressor state"
               + (" and activations" if row.get("activations_counted") else "; activations not counted"))
    room = row.get("memory_capacity_gib")
    if room is None:
        return f"{row['memory_gib']:.1f} GiB ({counted}); the device's capacity is unknown"
    return (f"{row['memory_gib']:.1f} GiB of {room:.1f} GiB: {'fits' if row['fits'] else 'does not fit'} "
            f"({counted})")
