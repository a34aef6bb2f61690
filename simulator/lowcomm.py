"""Low-communication training across sites: DiLoCo and Streaming DiLoCo, projected per inner step.

A site trains on its own for ``H`` inner steps (``sync_every``): inside the site the per-step
all-reduce still runs (the *inner step*: the scenario on one site's nodes, no WAN,
:func:`one_site`), nothing crosses the WAN. Then the sites exchange the pseudo-gradient (the
change of the parameters over the H steps, the model's size) through the *outer compressor*
(``none``: fp32; any compressor of the testbed at ``outer_density``) with an all-reduce, or an
all-gather for a sparsifier, across the sites (:class:`simulator.topologies.Sites`): the *outer
exchange*, projected as an iteration of that exchange alone (no compute, one bucket per
fragment, :func:`outer_scenario`), so its compression, wire and collective follow the per-step
model exactly, at either fidelity.

- ``diloco`` (Douillard et al. 2023, arXiv 2311.08105): the outer exchange blocks the sites.
  Per inner step: ``t = t_in + t_out / H``.
- ``streaming`` (Douillard et al. 2025, arXiv 2501.18512): the parameters are split into ``F``
  fragments (contiguous layers, balanced by bytes); one fragment syncs every ``H/F`` inner steps
  and its exchange overlaps the next ``H/F`` inner steps, waiting only for what does not fit:
  ``t = t_in + Σ_f max(0, t_f − (H/F)·t_in) / H``. The exchange's traffic inside a site is
  assumed not to slow the inner steps' all-reduces (the WAN is the bottleneck).

Both give the time per inner step amortised (``iteration_s``), the WAN's exposed time per inner
step (``wan_exposed_s``: what the strategy adds to one site training alone), the compute
utilization (forward + backward + optimizer ÷ wall time, the figure INTELLECT-1 and Streaming
DiLoCo publish) and the smallest H that hides the link (``hiding_sync_every``: the smallest H with
every fragment's exchange inside its window of H/F inner steps, ``⌈F·max_f t_f / t_in⌉``; blocking
DiLoCo still pays its exchange at every sync, so for it this is the H where the same exchange,
overlapped, would hide). The loss penalty of syncing every H steps is not modelled here: it is
measured by real training (``sidco converge``). Units: seconds, bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from simulator.scenario import Scenario
from simulator.simulate import iteration
from simulator.workload import Workload
from units import check_count

STRATEGIES = ("diloco", "streaming")
"""The low-communication strategies, as ``sidco compare`` names them beside the compressors."""


@dataclass(frozen=True)
class Strategy:
    """One low-communication configuration: ``name`` (:data:`STRATEGIES`), ``sync_every`` H
    (inner steps between syncs of a fragment), ``fragments`` F (``streaming``; ``diloco`` has
    one), the ``outer_compressor`` and its ``outer_density`` (``None`` for one that takes none)."""

    name: str
    sync_every: int
    fragments: int = 1
    outer_compressor: str = "none"
    outer_density: float | None = None

    def __post_init__(self) -> None:
        if self.name not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.name!r}; choose from {', '.join(STRATEGIES)}")
        check_count(self.sync_every, "--sync-every")
        check_count(self.fragments, "--fragments")
        if self.name == "diloco" and self.fragments != 1:
            raise ValueError("diloco syncs the whole model at once (one fragment); streaming takes --fragments")


def check_fragments(workload: Workload, fragments: int) -> None:
    """ValueError (one line) unless ``fragments`` is 1 … the workload's layers."""
    check_count(fragments, "--fragments")
    if fragments > len(workload.layers):
        raise ValueError(f"--fragments {fragments} is more than the workload's {len(workload.layers)} layers "
                         "(a fragment is a group of whole layers)")


def fragments_of(workload: Workload, fragments: int) -> list[Workload]:
    """``workload``'s layers in ``fragments`` contiguous groups of about equal bytes (each at least
    one layer), each as a workload of no compute (the outer exchange computes nothing)."""
    check_fragments(workload, fragments)
    sizes = np.array([layer.nbytes for layer in workload.layers], dtype=float)
    middle = np.cumsum(sizes) - sizes / 2
    wanted = np.searchsorted(middle, workload.nbytes * np.arange(1, fragments) / fragments)
    bounds = [0]
    for k, cut in enumerate(wanted.tolist(), start=1):  # each fragment at least one layer, in order
        bounds.append(min(max(cut, bounds[-1] + 1), len(sizes) - fragments + k))
    bounds.append(len(sizes))
    return [Workload(tuple(layer._replace(backward_s=0.0) for layer in workload.layers[a:b]), 0.0, 0.0,
                     workload.batch_size, workload.itemsize, workload.name) for a, b in zip(bounds, bounds[1:])]


def one_site(sc: Scenario) -> Scenario:
    """``sc`` on one site's nodes alone (no WAN): the inner step of a low-communication strategy,
    and what the WAN is measured against."""
    return replace(sc, nodes=sc.nodes // sc.sites, sites=1, wan_bandwidth_bps=None, wan_rtt_s=None,
                   stragglers=min(sc.stragglers, sc.workers // sc.sites), timeline=False)


def outer_scenario(sc: Scenario, fragment: Workload, strategy: Strategy, profile: Any) -> Scenario:
    """The outer exchange of ``fragment`` (a workload of no compute) across ``sc``'s sites through
    the strategy's outer compressor (``profile``: its compression costs), as one bucket."""
    compressor = strategy.outer_compressor
    density = None if compressor == "none" else (strategy.outer_density or 1.0)
    return replace(sc, workload=fragment, compressor=compressor, density=density,
                   profile=None if compressor == "none" else profile, bucket_mode="single", jitter=0.0,
                   stragglers=0, interference=0.0, timeline=False)


def amortised_s(inner_s: float, exchange_s: list[float], sync_every: int, overlapped: bool) -> float:
    """Seconds per inner step: ``inner_s`` plus the exchanges (``exchange_s``, one per fragment,
    s) spread over ``sync_every`` inner steps; blocking (DiLoCo) or ``overlapped`` each with the
    ``sync_every/F`` inner steps after it (Streaming DiLoCo; the module docstring)."""
    if not overlapped:
        return inner_s + sum(exchange_s) / sync_every
    window = sync_every / len(exchange_s) * inner_s
    return inner_s + sum(max(0.0, t - window) for t in exchange_s) / sync_every


def hiding_sync_every(inner_s: float, exchange_s: list[float]) -> int | None:
    """The smallest H whose window of H/F inner steps (``inner_s`` each) holds every fragment's
    exchange (``exchange_s``, s): ``⌈F·max_f t_f / t_in⌉``; ``None`` when an inner step takes no time."""
    if not inner_s > 0:
        return None
    return max(1, math.ceil(len(exchange_s) * max(exchange_s) / inner_s * (1 - 1e-12)))


def project(sc: Scenario, strategy: Strategy, profile: Any) -> dict[str, Any]:
    """``strategy`` on ``sc``'s cluster (more than one site; ``sc.compressor`` is ignored: inside
    a site the inner step all-reduces uncompressed; ``profile``: the outer compressor's
    compression costs, ``None`` for ``none``). Returns the inner step's breakdown (s) with the
    WAN's exposed time added to ``exposed_comm_s``, and ``iteration_s`` (per inner step,
    amortised), ``inner_step_s``, ``outer_exchange_s`` (all fragments, s), ``fragment_s`` (each),
    ``wan_exposed_s``, ``utilization``, ``hiding_sync_every``, ``sync_every``, ``fragments``,
    ``outer_compressor``, ``outer_density``, ``outer_wire_bytes`` (per worker, bytes)."""
    if sc.sites < 2:
        raise ValueError(f"{strategy.name} syncs across sites: give --sites 2 or more (and the WAN between them)")
    inner = iteration(replace(one_site(sc), compressor="none", density=None, profile=None))
    exchanges = [iteration(outer_scenario(sc, part, strategy, profile))
                 for part in fragments_of(sc.workload, strategy.fragments)]
    exchange_s = [r["iteration_s"] for r in exchanges]
    t_in = inner["iteration_s"]
    step = amortised_s(t_in, exchange_s, strategy.sync_every, strategy.name == "streaming")
    compute = inner["forward_s"] + inner["backward_s"] + inner["optimizer_s"]
    wan = step - t_in
    return {
        **inner,
        "iteration_s": step,
        "samples_per_s": sc.workload.batch_size * sc.workers / step if step > 0 else float("inf"),
        "exposed_comm_s": inner["exposed_comm_s"] + wan,
        "workers": sc.workers,
        "inner_step_s": t_in,
        "outer_exchange_s": sum(exchange_s),
        "fragment_s": exchange_s,
        "wan_exposed_s": wan,
        "utilization": compute / step if step > 0 else 1.0,
        "hiding_sync_every": hiding_sync_every(t_in, exchange_s),
        "sync_every": strategy.sync_every,
        "fragments": strategy.fragments,
        "outer_compressor": strategy.outer_compressor,
        "outer_density": strategy.outer_density,
        "outer_wire_bytes": sum(r["wire_bytes"] for r in exchanges),
    }


def per_step_fields(sc: Scenario, result: dict[str, Any]) -> dict[str, Any]:
    """The strategy columns of a per-step row (``result``, the projection of ``sc``): ``sync_every``
    1, one fragment, no outer compressor, ``utilization`` (compute ÷ iteration time) and
    ``wan_exposed_s`` (its iteration time minus that of one site alone with the same compressor,
    s; 0 with one site)."""
    step = result["iteration_s"]
    compute = result["forward_s"] + result["backward_s"] + result["optimizer_s"]
    alone = iteration(one_site(sc))["iteration_s"] if sc.sites > 1 else step
    return {"sync_every": 1, "fragments": 1, "outer_compressor": None, "outer_density": None,
            "utilization": compute / step if step > 0 else 1.0, "wan_exposed_s": step - alone}
