"""One collective on an idle cluster: :func:`collective_time`, at either fidelity.

The closed forms (``analytic``) and step programs (``des``) live with their topologies
(:mod:`simulator.topologies`, whose docstring tables the α–β forms); this module checks the
arguments, applies a calibration and runs the step program as link-level messages on a
:class:`~simulator.links.Fabric`, which with no contention agrees with the closed form to
rounding (tests check 1e-6 relative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simulator import topologies
from simulator.calibration import Calibration
from simulator.limits import check_collective
from simulator.links import Fabric, Level
from simulator.topologies import ring_terms
from units import check_count

__all__ = ["FIDELITIES", "OPS", "algorithms", "check_args", "collective_time", "ring_terms", "topology_for"]
"""``ring_terms`` is :func:`simulator.topologies.ring_terms`, named here for the emulation's calibration."""

OPS = (*topologies.KINDS, "ps")
PS_ALGORITHMS = ("sharded", "dedicated")


def algorithms(op: str) -> tuple[str, ...]:
    """The algorithms of ``op``: the registered topologies offering that kind of collective; the
    parameter server answers the ``ps`` op (push + pull), sharded over the workers or on
    dedicated servers."""
    if op == "ps":
        return PS_ALGORITHMS
    return tuple(name for name, cls in topologies.REGISTRY.items() if op in cls.kinds and not cls.takes_servers)


FIDELITIES = ("analytic", "des")


def topology_for(op: str, algorithm: str, nodes: int, *, gpus: int = 1, servers: int = 0,
                 intra: Level | None = None) -> tuple[topologies.Topology, str]:
    """The topology running ``op`` with ``algorithm`` and the kind of collective it runs."""
    if op == "ps":
        return topologies.ParameterServer(nodes, servers=servers if algorithm == "dedicated" else 0), "allreduce"
    return topologies.get(algorithm)(nodes, gpus=gpus, intra=intra), op


def check_args(op: str, algorithm: str, nodes: int, bandwidth_bps: float, latency_s: float, fidelity: str) -> None:
    """Raise ValueError naming the first invalid argument."""
    if op not in OPS:
        raise ValueError(f"unknown collective op {op!r}; choose from {', '.join(OPS)}")
    if algorithm not in algorithms(op):
        raise ValueError(f"algorithm {algorithm!r} not available for {op}; choose from {', '.join(algorithms(op))}")
    if fidelity not in FIDELITIES:
        raise ValueError(f"unknown fidelity {fidelity!r}; choose analytic or des")
    check_count(nodes, "nodes")
    if not bandwidth_bps > 0 or not math.isfinite(bandwidth_bps):
        raise ValueError(f"bandwidth must be > 0 bits/s, got {bandwidth_bps!r}")
    if not latency_s >= 0 or not math.isfinite(latency_s):
        raise ValueError(f"latency must be >= 0 s, got {latency_s!r}")


def collective_time(
    op: str,
    nbytes: float,
    nodes: int,
    bandwidth_bps: float,
    latency_s: float,
    algorithm: str = "ring",
    fidelity: str = "des",
    *,
    sizes: Sequence[float] | None = None,
    padded: bool = True,
    gpus_per_node: int = 1,
    intra_bandwidth_bps: float = 2.4e12,
    intra_latency_s: float = 2e-6,
    servers: int = 0,
    calibration: Calibration | None = None,
) -> float:
    """Time in seconds of one collective on an idle cluster.

    ``op``: ``allreduce`` | ``reduce_scatter`` | ``allgather`` | ``alltoall`` (the reduce-scatter by
    all-to-all, :mod:`simulator.topologies`) | ``ps`` (push + pull);
    ``algorithm``: a topology offering ``op`` (:func:`algorithms`: ``ring``, ``hierarchical``, and
    for an all-reduce ``halving-doubling`` and ``tree``), ``sharded`` | ``dedicated`` for ``ps``;
    ``nbytes``: the full buffer (bytes) for allreduce/reduce_scatter/alltoall/ps (for a sparse ``ps``
    the aggregated buffer pulled back), one rank's contribution for allgather; ``sizes``:
    bytes per rank of an all-gather or of sparse ``ps`` pushes; ``nodes``: ranks (nodes of ``gpus_per_node`` GPUs for
    ``hierarchical``); ``bandwidth_bps``: per-link bandwidth in bits/s; ``latency_s``: per
    message (s); ``padded``: all-gather pads every block to the largest (as gloo needs);
    ``servers``: dedicated parameter servers (``ps`` with ``algorithm="dedicated"``);
    ``calibration``: fitted constants; ``op``'s own α (added to ``latency_s``) and efficiency
    (× ``bandwidth_bps``) at ``nodes`` ranks apply to the inter-node links (see
    :meth:`Calibration.fit_for`: else ``op``'s fit, else the pooled one).
    """
    check_args(op, algorithm, nodes, bandwidth_bps, latency_s, fidelity)
    if calibration is not None:
        bandwidth_bps = calibration.bandwidth(bandwidth_bps, op, nodes)
        latency_s = calibration.latency(latency_s, op, nodes)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if op == "ps" and algorithm == "dedicated" and not 1 <= servers <= nodes:
        raise ValueError(f"dedicated parameter servers must be 1..nodes, got {servers}")
    B = bandwidth_bps / 8.0
    topology, kind = topology_for(op, algorithm, nodes, servers=servers, intra=Level(intra_bandwidth_bps / 8.0,
                                  intra_latency_s), gpus=gpus_per_node if algorithm == "hierarchical" else 1)
    m = None if sizes is None else np.asarray(sizes, dtype=float)
    if m is not None and len(m) != nodes:
        raise ValueError(f"sizes must give one size per rank ({nodes}), got {len(m)}")
    ranks = topology.workers + topology.extra_ranks
    check_collective(ranks, 0 if fidelity == "des" or padded else nodes)
    phase = topology.collective(kind, nbytes, Level(B, latency_s), m, padded)
    if fidelity == "analytic":
        return phase.analytic_s
    check_collective(ranks, len(phase.plan))
    fabric = Fabric(ranks, Level(B, latency_s), gpus=topology.gpus, intra=topology.intra)
    finish = fabric.run(phase.plan, phase.nbytes, np.zeros(ranks), phase.sizes)
    return float(finish.max())
