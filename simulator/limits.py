"""What the simulator can compute: memory and work of a scenario, checked before any allocation.

Both fidelities keep per-(bucket, worker) arrays (compute, compression and wire sizes,
and the schedule of every bucket on every worker), so their memory grows linearly in
workers × buckets; ``des`` adds one SimPy process per worker. Collective plans are made
step by step (:mod:`simulator.plans`), so no p × p array is ever held. The ``des``
fidelity's *time* is its number of link-level messages, which a ring or a ring
all-gather makes quadratic in ranks (2(p−1) steps of p messages): that is bounded
separately. The closed forms are O(p) per bucket except the uneven (``padded=False``)
ring all-gather recurrence, O(p²).

:func:`check_scenario` is the one check the CLI, sweeps and the dashboard share; it
raises ``ValueError`` with a one-line reason and the largest node count that fits.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from compressors.messages.wire import counts_first
from simulator import topologies
from units import format_count
from simulator.links import Level

if TYPE_CHECKING:
    from simulator.scenario import Scenario

MEMORY_BUDGET_BYTES = 1 << 30
"""Memory one scenario may use (bytes): 1 GiB."""

MESSAGE_BUDGET = 2_000_000_000
"""Link-level messages (``des``) or recurrence cells (uneven all-gather) one scenario may
take: 2·10⁹ is one to two minutes on one core."""

BYTES_PER_WORKER_BUCKET = 8 * 32
"""float64 entries per (bucket, worker): ~14 schedule/cost arrays plus temporaries."""

DES_BYTES_PER_WORKER = 8 * 1024
"""A SimPy process, its generator and events, per worker (bytes)."""

JOB_BYTES = 300 * 2**20
"""Resident memory of one worker process (a sweep's local worker or an emulated rank: Python +
torch + numpy), bytes."""


def collective_messages(topology: str, nodes: int, *, gpus: int = 1, servers: int = 0, sparse: bool = False,
                        padded: bool = True) -> int:
    """Link-level messages of one bucket's collective(s) on ``nodes`` machines (``des`` work):
    :meth:`simulator.topologies.Topology.messages` of ``topology``."""
    return topologies.get(topology)(nodes, gpus=gpus, servers=servers).messages(sparse, padded)


def estimate(sc: Scenario) -> tuple[int, int]:
    """``(bytes, work)`` of simulating ``sc`` (and its ``none`` baseline): peak memory in bytes
    and link-level messages (``des``) or uneven all-gather recurrence cells (``analytic``)."""
    buckets = len(sc.workload.buckets(sc.bucket_mode, sc.bucket_cap_bytes, sc.first_bucket_bytes))
    return _estimate(sc, sc.nodes, buckets)


def _estimate(sc: Scenario, nodes: int, buckets: int) -> tuple[int, int]:
    if sc.sites > 1 and nodes % sc.sites == 0:  # the links' speeds change no message count
        topology = topologies.Sites(nodes, sites=sc.sites, wan=Level(1.0, 0.0), gpus=sc.gpus_per_node,
                                    inside=sc.topology)
    else:
        topology = topologies.get(sc.topology)(nodes, gpus=sc.gpus_per_node, servers=sc.ps_servers)
    ranks = topology.workers + topology.extra_ranks
    memory = BYTES_PER_WORKER_BUCKET * buckets * ranks
    if sc.fidelity == "des":
        memory += DES_BYTES_PER_WORKER * ranks
        work = buckets * topology.messages(sc.sparse, sc.padded, counts_first(sc.compressor))
        if sc.compressor != "none":
            work += buckets * topology.messages()
    else:
        work = buckets * topology.recurrence_cells(sc.sparse, sc.padded)
    return memory, work


def _largest_nodes(sc: Scenario, buckets: int, memory_budget: int, message_budget: int) -> int:
    """The largest node count whose estimate fits both budgets (0 if none)."""
    def fits(n: int) -> bool:
        memory, work = _estimate(sc, n, buckets)
        return memory <= memory_budget and work <= message_budget

    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def check_scenario(sc: Scenario, *, memory_budget_bytes: int = MEMORY_BUDGET_BYTES,
                   message_budget: int = MESSAGE_BUDGET) -> None:
    """Raise ``ValueError`` (one line: the need, the budget, the largest node count that fits)
    when ``sc`` would need more than ``memory_budget_bytes`` bytes or ``message_budget``
    messages. Allocates nothing that grows with the node count."""
    buckets = len(sc.workload.buckets(sc.bucket_mode, sc.bucket_cap_bytes, sc.first_bucket_bytes))
    memory, work = _estimate(sc, sc.nodes, buckets)
    if memory <= memory_budget_bytes and work <= message_budget:
        return
    largest = _largest_nodes(sc, buckets, memory_budget_bytes, message_budget)
    gpus = f" × {sc.gpus_per_node} GPUs" if sc.gpus_per_node > 1 else ""
    where = f"{format_count(sc.nodes)} nodes{gpus} × {buckets} buckets ({sc.fidelity}, {sc.topology})"
    if memory > memory_budget_bytes:
        need = f"needs ~{format_count(memory / 2**30, 1)} GiB of memory (limit {memory_budget_bytes / 2**30:g} GiB)"
    else:
        unit = "link-level messages" if sc.fidelity == "des" else "all-gather recurrence steps"
        need = f"needs ~{work:.2g} {unit} (limit {message_budget:.2g})"
    hint = "; try --fidelity analytic" if sc.fidelity == "des" else ""
    raise ValueError(f"{where} {need}: at most {format_count(largest)} nodes fit{hint}")


def max_jobs() -> int:
    """The most worker processes (sweep jobs, emulated ranks) to start here: 4 per core, and what
    memory allows."""
    cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 4 * cores * JOB_BYTES
    return max(1, min(4 * cores, memory // JOB_BYTES))


def check_jobs(jobs: int) -> None:
    """Raise ``ValueError`` when ``jobs`` local worker processes exceed :func:`max_jobs`."""
    limit = max_jobs()
    if jobs > limit:
        raise ValueError(f"--jobs {jobs} is more than this machine can run (at most {limit}: 4 per core, "
                         f"~{JOB_BYTES // 2**20} MiB each)")


def check_collective(ranks: int, steps: int, *, memory_budget_bytes: int = MEMORY_BUDGET_BYTES,
                     message_budget: int = MESSAGE_BUDGET) -> None:
    """Raise ``ValueError`` when one link-level collective of ``steps`` steps over ``ranks``
    ranks would exceed the memory (~16 float64 per rank) or message budget."""
    memory, work = 16 * 8 * ranks, steps * ranks
    if memory > memory_budget_bytes:
        raise ValueError(f"a collective over {format_count(ranks)} ranks needs "
                         f"~{format_count(memory / 2**30, 1)} GiB of memory "
                         f"(limit {memory_budget_bytes / 2**30:g} GiB)")
    if work > message_budget:
        raise ValueError(f"a des collective over {format_count(ranks)} ranks in {format_count(steps)} steps "
                         f"needs ~{work:.2g} link-level "
                         f"messages (limit {message_budget:.2g}); use fidelity='analytic'")
