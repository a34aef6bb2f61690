"""A scenario: one workload on one cluster with one compressor, and its validation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compressors.messages.wire import ALLGATHER, collective
from costs import CompressionProfile
from simulator.calibration import Calibration
from simulator import topologies
from simulator.limits import check_scenario
from units import check_bandwidth, check_count, check_density, check_latency
from simulator.workload import (
    BUCKET_MODES,
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    Workload,
)

if TYPE_CHECKING:
    from simulator import sharded

TOPOLOGIES = topologies.NAMES
FIDELITIES = ("analytic", "des")
COMPRESS_ON = ("compute", "comm")


@dataclass(frozen=True)
class Scenario:
    """Everything :func:`simulator.simulate` needs. Units: bits/s, seconds, bytes.

    ``nodes``: machines (each one worker, or ``gpus_per_node`` workers with the
    ``hierarchical`` topology); ``bandwidth_bps``/``latency_s``: each NIC's per-direction
    link; ``topology``: ``ring`` | ``halving-doubling`` | ``tree`` all-reduce, ``ps``
    (parameter server sharded over the workers, or on ``ps_servers`` dedicated servers),
    ``hierarchical`` (intra-node links ``intra_bandwidth_bps``/``intra_latency_s``);
    ``oversubscription`` ≥ 1 divides the bandwidth through the switch core; ``compressor``
    / ``density``: ``none`` sends dense gradients; ``profile``: compression costs
    (required unless ``none``); ``bucket_mode``: ``ddp`` | ``single`` | ``layer``;
    ``compressor_options``: the compressor's keyword options (as for ``compressors.create``;
    they decide its collective, :func:`compressors.messages.wire.collective`: ``randomk`` with a
    ``seed`` all-reduces its values, without one it all-gathers values + indices);
    ``compress_on``: the stream compression runs on; ``padded``: sparse all-gathers pad
    to the largest message (as gloo needs; counts are exchanged first); ``jitter``:
    coefficient of variation of each worker's compute time (lognormal, seeded by
    ``seed``); ``interference``: compute runs ``1 + interference`` times slower while the
    worker's communication stream transfers; ``stragglers`` workers are slowed by ``straggler_slowdown``; ``timeline``:
    also return the iteration's events; ``rank``: PowerSGD's rank r (columns of P and Q per
    matrix; only ``powersgd`` uses it); ``sites``: the nodes split evenly into that many sites
    joined by a WAN of ``wan_bandwidth_bps`` (bits/s per site and direction) and ``wan_rtt_s``
    (round trip, s; each message pays half of it), collectives across them hierarchical
    (:class:`simulator.topologies.Sites`; one site: the topology alone).
    """

    workload: Workload
    nodes: int
    bandwidth_bps: float
    latency_s: float
    compressor: str = "none"
    density: float | None = None
    topology: str = "ring"
    fidelity: str = "analytic"
    profile: CompressionProfile | None = None
    calibration: Calibration | None = None
    bucket_mode: str = "ddp"
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES
    gpus_per_node: int = 1
    intra_bandwidth_bps: float = 2.4e12
    intra_latency_s: float = 2e-6
    oversubscription: float = 1.0
    ps_servers: int = 0
    padded: bool = True
    compress_on: str = "compute"
    jitter: float = 0.0
    interference: float = 0.0
    stragglers: int = 0
    straggler_slowdown: float = 1.5
    seed: int = 0
    timeline: bool = False
    compressor_options: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 1
    sharding: sharded.Sharding | None = None
    sites: int = 1
    wan_bandwidth_bps: float | None = None
    wan_rtt_s: float | None = None

    def __post_init__(self) -> None:
        check_count(self.nodes, "nodes")
        for name in ("bandwidth_bps", "intra_bandwidth_bps"):
            check_bandwidth(getattr(self, name), name)
        for name in ("latency_s", "intra_latency_s"):
            check_latency(getattr(self, name), name)
        for name in ("jitter", "interference"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        topology = topologies.get(self.topology)
        if self.fidelity not in FIDELITIES:
            raise ValueError(f"unknown fidelity {self.fidelity!r}; choose analytic or des")
        if self.bucket_mode not in BUCKET_MODES:
            raise ValueError(f"unknown bucket mode {self.bucket_mode!r}; choose from {', '.join(BUCKET_MODES)}")
        if self.compress_on not in COMPRESS_ON:
            raise ValueError(f"compress_on must be compute or comm, got {self.compress_on!r}")
        if self.gpus_per_node < 1 or (self.gpus_per_node > 1 and topology.levels < 2):
            raise ValueError(f"{self.gpus_per_node} GPUs per node need the hierarchical topology: the {self.topology} "
                             "model has one worker per node (leave --topology out to get hierarchical)")
        if not self.oversubscription >= 1:
            raise ValueError(f"oversubscription must be >= 1, got {self.oversubscription!r}")
        if self.ps_servers < 0 or self.ps_servers > self.workers or (self.ps_servers and not topology.takes_servers):
            raise ValueError(f"ps_servers must be 0..workers ({self.workers}) with the ps topology")
        if not 0 <= self.stragglers <= self.workers or not self.straggler_slowdown > 0:
            raise ValueError(f"stragglers must be 0..{self.workers} with a slowdown > 0")
        check_count(self.rank, "rank")
        topologies.check_sites(self.nodes, self.sites, self.topology)
        if self.sites > 1:
            if self.wan_bandwidth_bps is None or self.wan_rtt_s is None:
                raise ValueError(f"{self.sites} sites need the WAN between them: its bandwidth and round-trip time")
            check_bandwidth(self.wan_bandwidth_bps, "WAN bandwidth")
            check_latency(self.wan_rtt_s, "WAN round-trip time")
        if self.compressor != "none":
            check_density(self.density, f"density for {self.compressor}")
            if self.profile is None:
                raise ValueError(f"compressor {self.compressor} needs a compression profile (replay results)")
            self.profile.cost(self.compressor, self.density)
        from simulator import sharded  # it plans on the scenario's own helpers (simulator.iteration)

        sharded.check(self)
        check_scenario(self)

    @property
    def workers(self) -> int:
        """Data-parallel workers (GPUs): nodes × gpus_per_node."""
        return self.nodes * self.gpus_per_node

    @property
    def message(self) -> str:
        """The kind of message the compressor sends: ``sparse``, ``dense`` (``none``, ``fp16``,
        ``bf16``) or ``lowrank`` (``powersgd``)."""
        import compressors

        return "dense" if self.compressor == "none" else compressors.message_kind(self.compressor)

    @property
    def sparse(self) -> bool:
        """Whether gradients travel as sparse (values + indices) messages through an all-gather
        (:func:`compressors.messages.wire.collective`); otherwise they are all-reduced."""
        return collective(self.compressor, self.compressor_options) == ALLGATHER
