"""Sweeps: simulate a grid of scenarios into the results store, resumably.

``sidco sweep`` (a local process pool or Dask) and the dashboard's Sweeps page (one thread,
small chunks) both call :func:`run`. The sweep row is found by its configuration, so running
the same sweep again resumes it: every scenario lands exactly once. Two runs of the same sweep
at once share it: each claims the scenarios it computes (:meth:`results.store.Store.claim_scenarios`),
skips those another live run claimed and waits for their rows, so every scenario is computed
once; a run that dies leaves claims the other takes over (at once where it can see the process
ended, else when their lease expires: :mod:`results.claims`), saying while it waits on whom. The compression profile
is decided once (:func:`pipeline.costs.compression_profile`) and kept with the sweep, so a
resumed sweep uses exactly the same costs; each scenario row records the device and where
its compression costs came from (``device``, ``cost_source``), and its stored ``result_json`` the
memory one GPU holds on its point's cluster (:func:`pipeline.memory.memory_of`, as ``sidco compare``
gives it; no column of its own: :func:`scenario_rows` reads it back).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from processes.pool import local_pool
import simulator
from simulator.limits import check_jobs, check_scenario  # check_jobs: the door checks --jobs by it
from pipeline.costs import compression_profile, cost_band
from pipeline.project import Projection, Source, calibration, register
from pipeline.project import options as scenario_options
from pipeline.request import Cluster, check_compressors, pair, sharding_flags, takes_density
from pipeline import quality
from pipeline.compare import ALWAYS
from pipeline.memory import MEMORY_KEYS, memory_of
from pipeline.verdict import judge, memory_gate, rank
from results.claims import CLAIM_LEASE_S
from results.store import Store
from simulator.scenario import TOPOLOGIES
from simulator.sharded import Sharding
from simulator.sweep import RANKED, Grid, SweepContext, chunks, describe, run_sweep, scenario_key

PROFILE_META = "sweep-profile:{}"
WAIT_PAUSE_S = 0.2
"""Seconds between two checks of the scenarios another run of the same sweep computes."""
WAIT_REPORT_S = 30.0
"""Seconds between two reports of a run that still waits on the same other runs."""
WAIT_BATCH = 500
"""Scenario keys per store query while waiting (well under SQLite's bound parameters)."""

DASK_CONNECT_TIMEOUT_S = 10.0
"""How long a Dask sweep waits for the scheduler before the one-line error (seconds)."""


@contextmanager
def executor(dask: str | None, jobs: int) -> Iterator[tuple[Executor, int]]:
    """The sweep's own pool: ``jobs`` local processes, or the executor of the existing Dask
    cluster at address ``dask``; yields (executor, slots)."""
    if dask:
        from distributed import Client

        with Client(dask, timeout=DASK_CONNECT_TIMEOUT_S) as client:
            slots = max(1, sum(client.nthreads().values()))
            yield client.get_executor(pure=False), slots
    else:
        with local_pool(jobs) as pool:
            yield pool, jobs


@dataclass(frozen=True)
class SweepRun:
    """What :func:`run` did: sweep id, scenarios in the grid, stored now, computed by this run,
    whether the sweep existed before, where each (compressor, density)'s costs came from, and
    the sweep's source (registered: a trace has its id)."""

    sweep_id: int
    total: int
    stored: int
    computed: int
    resumed: bool
    cost_sources: dict[str, str] = field(default_factory=dict)
    source: Source | None = None


def grid(*, nodes: Sequence[int], bandwidths_bps: Sequence[float], latencies_s: Sequence[float],
         compressors: Sequence[str], densities: Sequence[float], topologies: Sequence[str],
         ranks: Sequence[int] = (1,)) -> Grid:
    """The sweep grid from parsed axes (machines, bits/s, seconds, names, fractions, names,
    PowerSGD ranks), with the baselines every comparison has (:data:`pipeline.compare.ALWAYS`) in
    front, so each cluster is judged as ``sidco compare`` judges it:
    unknown compressors or topologies are a ValueError naming the first; repeats are dropped;
    densities are kept only when a compressor that takes one is swept."""
    check_compressors(compressors)
    if not compressors:
        raise ValueError("choose at least one compressor")
    compressors = [*ALWAYS, *compressors]
    bad = [t for t in topologies if t not in TOPOLOGIES]
    if bad:
        raise ValueError(f"unknown topology {bad[0]!r}; choose from {', '.join(TOPOLOGIES)}")
    return Grid(
        nodes=tuple(nodes), bandwidths_bps=tuple(bandwidths_bps), latencies_s=tuple(latencies_s),
        compressors=tuple(dict.fromkeys(compressors)),
        densities=tuple(densities) if any(takes_density(n) for n in compressors) else (),
        topologies=tuple(dict.fromkeys(topologies)),
        ranks=tuple(dict.fromkeys(ranks)),
    )


def description(source: Source, origin: str | None = None) -> dict[str, Any]:
    """The JSON description of ``source`` that goes into a sweep's configuration."""
    if source.kind == "layout":
        out: dict[str, Any] = {"layout": source.ref, "device_flops_per_s": source.device_flops_per_s,
                               "batch_size": source.batch_size, "precision": source.precision}
    else:
        out = {"trace": source.ref}
        if source.by_flops or source.compute_scale != 1.0:
            out.update(precision=source.precision, compute_scale=source.compute_scale)
    if origin:
        out["origin"] = origin
    return out


SHARDING_FIELDS = tuple(f.name for f in fields(Sharding))
"""The fields of a sweep's stored ``--parallel`` family (``options.sharding`` of its configuration)."""


def sharding_of(config_json: str) -> dict[str, Any] | None:
    """The ``--parallel`` family a sweep was projected under, read back from its stored configuration
    (``config_json``, :meth:`results.store.Store.sweep`): ``parallel``, ``shard_size`` (GPUs per shard
    group; ``None``: one node), ``reduce_dtype``, ``param_dtype``, ``micro_batch`` (sequences per
    accumulation step; ``None``: one step) and ``checkpointing``, checked as
    :class:`simulator.sharded.Sharding` checks them; ``None`` for plain DDP with every default.
    ValueError (one line) when the stored value is not those fields."""
    held = json.loads(config_json).get("options", {}).get("sharding")
    if held is None:
        return None
    if not isinstance(held, dict) or set(held) != set(SHARDING_FIELDS):
        raise ValueError(f"a sweep's stored --parallel family is not its fields ({', '.join(SHARDING_FIELDS)}): "
                         f"{held!r:.80}")
    Sharding(**held)
    return {name: held[name] for name in SHARDING_FIELDS}


def sharding_text(held: Mapping[str, Any]) -> str:
    """The flags that give the ``--parallel`` family ``held`` (:func:`sharding_of`), e.g.
    ``--parallel hsdp --micro-batch 2 --checkpointing`` (:func:`pipeline.request.sharding_flags`)."""
    return sharding_flags(Sharding(**held)).strip()


def _profile(store: Store, sweep_id: int, source: Source, grid: Grid,
             profile_file: str | None) -> simulator.CompressionProfile | None:
    """The sweep's compression profile, pinned once in the store: a resumed sweep, or a
    concurrent run of the same configuration, uses exactly the costs stored first."""
    key = PROFILE_META.format(sweep_id)
    text = store.get_meta(key)
    if text is None:
        pairs = grid.pairs()
        profile = (compression_profile(store, trace_id=source.trace_id, device=source.device, pairs=pairs,
                                       profile_file=profile_file) if pairs else None)
        text = store.pin_meta(key, "null" if profile is None else profile.to_json())
    return None if text == "null" else simulator.CompressionProfile.from_json(text)


def run(store: Store, projection: Projection, grid: Grid, executor: Executor, *, fidelity: str = "analytic",
        options: Mapping[str, Any] | None = None, origin: str | None = None, chunk_size: int = 200,
        in_flight: int = 2, started: Callable[[int, int], None] | None = None,
        progress: Callable[[int, int], None] | None = None,
        waiting: Callable[[str], None] | None = None) -> SweepRun:
    """Run (or resume) the sweep of ``grid`` on ``projection``'s workload (a resolved
    :class:`pipeline.request.WorkloadRequest`: the grid gives the clusters and the pairs);
    scenarios are simulated on ``executor`` in chunks of ``chunk_size`` with at most
    ``in_flight`` chunks pending. Every point is checked against the simulator's limits (the
    request's message budget, :func:`simulator.limits.check_scenario`) before the sweep row is
    written.

    Every row's ``result_json`` carries its memory per GPU (:data:`pipeline.memory.MEMORY_KEYS`:
    :func:`pipeline.memory.memory_of` on the point's nodes, the sweep's ``--parallel`` family and
    PowerSGD's rank), which :func:`scenario_rows` reads back and the verdicts' memory gate reads.

    ``started(sweep_id, already_stored)`` once the sweep row exists; ``progress(stored, total)``
    after each chunk lands; ``waiting(text)`` (one line) when this run waits for scenarios another
    run claimed: on whom, and when their claims are taken over. The calibration the request names
    (``latest``, an id, ``none``) must exist; its profile file comes first in the costs. Costs and
    rows are for the source's modelled device (resolved with it, :func:`pipeline.project.resolve`).
    """
    source = register(store, projection.source)
    request = projection.request
    profile_file, message_budget = request.profile_file, projection.budget
    device = source.device.name
    wl = projection.workload
    options = scenario_options(options or {}, wl)
    constants = calibration(store, request.calibration, required=True)
    described = description(source, origin)
    if device != "cpu" or profile_file is not None:  # cpu replays were the only costs before devices
        described["costs"] = {"device": device, "profile_file": None if profile_file is None else str(profile_file)}
    probe = SweepContext(wl, None, fidelity, constants, options)
    largest = max(grid.nodes)
    for point in grid.points():  # the limits grow with the node count: the largest clusters decide
        if point["nodes"] == largest:
            check_scenario(probe.scenario({**point, "compressor": "none", "density": None}),
                           message_budget=message_budget)
    config = describe(probe, grid, described)
    sweep_id, created = store.get_or_create("sweeps", config, trace_id=source.trace_id, total=len(grid))
    profile = _profile(store, sweep_id, source, grid, profile_file)
    bands = {} if profile is None else {  # the bands a projection of each pair has (pipeline.project.project_pairs)
        key: cost_band(cost, device, key[0], key[1], source.device) for key, cost in profile.costs.items()}
    context = SweepContext(wl, profile, fidelity, constants, options, (source.compute_low, source.compute_high), bands)
    for point in grid.points():  # every scenario checked before anything is simulated
        context.scenario(point)
    store.set_status("sweeps", sweep_id, "running")
    total = len(grid)
    if started:
        started(sweep_id, store.scenario_count(sweep_id))

    def cost_source(row: Mapping[str, Any]) -> str | None:
        if profile is None or row["compressor"] == "none":
            return None
        return profile.cost(row["compressor"], row["density"]).source

    held: dict[tuple[int, str, int], dict[str, Any]] = {}  # memory per (nodes, compressor, rank)

    def with_memory(row: Mapping[str, Any]) -> str:
        result = json.loads(row["result_json"])
        key = (row["nodes"], row["compressor"], int(result.get("rank", 1)))
        if key not in held:
            point = Cluster(row["nodes"], row["bandwidth_bps"], row["latency_s"], row["topology"], fidelity,
                            {**options, "rank": key[2]})
            held[key] = memory_of(projection, row["compressor"], cluster=point)
        return json.dumps({**result, **held[key]}, sort_keys=True)

    def on_rows(rows: list[dict[str, Any]]) -> None:
        store.add_scenarios(sweep_id, ({**row, "device": device, "cost_source": cost_source(row),
                                        "result_json": with_memory(row)} for row in rows))
        if progress:
            progress(store.scenario_count(sweep_id), total)

    owner = uuid.uuid4().hex  # this run: it computes the scenarios it claims, and waits for the others
    awaited: set[str] = set()
    notice = _WaitNotice(sweep_id, waiting or (lambda text: None))

    def claim(keys: list[str]) -> set[str]:
        mine = store.claim_scenarios(sweep_id, keys, owner)
        others = [key for key in keys if key not in mine]
        if others:
            awaited.update(others)
            notice(store.scenario_claims(sweep_id, others))
        return set(keys) - mine

    def compute(points: Iterable[dict[str, Any]]) -> int:
        return run_sweep(context, points, executor, chunk_size=chunk_size, in_flight=in_flight,
                         skip_done=claim, on_rows=on_rows)

    try:
        with store.claims_kept(owner):
            computed = compute(grid.points())
            computed += _await_others(store, sweep_id, grid, awaited, compute,
                                      lambda: progress(store.scenario_count(sweep_id), total) if progress else None,
                                      notice)
    finally:
        store.release_claims(sweep_id, owner)
    store.set_status("sweeps", sweep_id, "done")
    sources = {} if profile is None else {pair(*key).label: cost.source for key, cost in profile.costs.items()}
    return SweepRun(sweep_id, total, store.scenario_count(sweep_id), computed, not created, sources, source)


class _WaitNotice:
    """Tells ``report`` (one line) which other runs of sweep ``sweep_id`` hold scenarios this run
    waits for: when those runs change, and every :data:`WAIT_REPORT_S` seconds while they do not."""

    def __init__(self, sweep_id: int, report: Callable[[str], None]):
        self.sweep_id, self.report = sweep_id, report
        self.owners: frozenset[str] = frozenset()
        self.at_s = 0.0  # time.monotonic() of the last report

    def __call__(self, holders: Mapping[str, Mapping[str, Any]]) -> None:
        """``holders``: key → its claim (:meth:`results.store.Store.scenario_claims`)."""
        live = {key: claim for key, claim in holders.items() if not claim["lapsed"]}
        owners = frozenset(claim["owner"] for claim in live.values())
        if owners and (owners != self.owners or time.monotonic() - self.at_s >= WAIT_REPORT_S):
            self.report(f"sweep {self.sweep_id}: {_waiting_text(live)}")
            self.owners, self.at_s = owners, time.monotonic()


def _await_others(store: Store, sweep_id: int, grid: Grid, waiting: set[str],
                  compute: Callable[[Iterable[dict[str, Any]]], int], tick: Callable[[], None],
                  notice: Callable[[Mapping[str, Mapping[str, Any]]], None], pause_s: float = WAIT_PAUSE_S) -> int:
    """Wait until every scenario of ``waiting`` (keys another run claimed) is stored, checking
    every ``pause_s`` seconds; a scenario whose claim lapsed (its run ended without it, its process
    is gone or its lease expired) is computed here, with ``compute`` (which claims it first).
    Returns the scenarios computed here; ``tick()`` and ``notice(holders)`` (the claims still
    waited for) after each check."""
    computed = 0
    while waiting:
        holders: dict[str, dict[str, Any]] = {}
        for batch in chunks(sorted(waiting), WAIT_BATCH):
            waiting.difference_update(store.stored_scenario_keys(sweep_id, batch))
            claims = store.scenario_claims(sweep_id, [key for key in batch if key in waiting])
            lapsed = {key for key in batch if key in waiting and (key not in claims or claims[key]["lapsed"])}
            if lapsed:
                waiting.difference_update(lapsed)
                computed += compute(point for point in grid.points() if scenario_key(point) in lapsed)
            holders.update((key, claim) for key, claim in claims.items() if key in waiting)
        tick()
        notice(holders)
        if waiting:
            time.sleep(pause_s)
    return computed


def _waiting_text(holders: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: how many scenarios this run waits for, held by which runs (PID, host, last heartbeat)
    and when their claims are taken over if those runs stop beating."""
    now = time.time()
    runs: dict[str, list[Mapping[str, Any]]] = {}
    for claim in holders.values():
        runs.setdefault(claim["owner"], []).append(claim)
    who = "; ".join(f"{len(claims)} held by pid {claims[0]['pid']} on {claims[0]['host'] or 'an unknown host'} "
                    f"(heartbeat {max(0.0, now - claims[0]['heartbeat']):.0f} s ago, taken over at "
                    f"{time.strftime('%H:%M:%S %Z', time.localtime(claims[0]['expires']))} unless it beats again)"
                    for claims in runs.values())
    return (f"waiting for {len(holders)} scenario(s) another run of this sweep computes: {who}; "
            f"a run's claims are taken over when its process ends or its heartbeat stops for "
            f"{CLAIM_LEASE_S:.0f} s")


MEMORY_NOT_STORED = ("not recorded: this scenario was stored before sweeps recorded memory per GPU (a sweep into "
                     "another --store records it)")
"""Why a stored scenario row has no memory per GPU."""


def scenario_rows(store: Store, sweep_id: int, **equal: Any) -> list[dict[str, Any]]:
    """The scenario rows of sweep ``sweep_id`` (:meth:`results.store.Store.scenarios`, filtered by
    ``equal``), each with its memory per GPU as :func:`run` stored it (:data:`pipeline.memory.MEMORY_KEYS`,
    GiB); a row stored before sweeps recorded it has them ``None`` and ``memory_reason``
    (:data:`MEMORY_NOT_STORED`)."""
    return [row if row["memory_gib"] is not None else {**row, "memory_reason": MEMORY_NOT_STORED}
            for row in store.scenarios(sweep_id, fields=MEMORY_KEYS, **equal)]


def findings(store: Store, sweep_id: int, source: Source, rank_: int | None = 1) -> list[dict[str, Any]]:
    """What a sweep of ``source`` (registered: a trace has its id) found, per cluster (nodes,
    bandwidth, latency, topology; fidelity): the verdict of :func:`pipeline.verdict.judge` on its
    stored rows with their quality columns (:func:`pipeline.quality.for_source`, nothing replayed;
    PowerSGD's at ``rank_``, unmeasured when several ranks were swept: ``None``) and memory per GPU
    (:func:`scenario_rows`), the best configuration (the fastest that fits in one GPU's memory, by
    :func:`pipeline.verdict.memory_gate`), its memory per GPU (``memory_gib``, ``activations_counted``,
    ``memory_capacity_gib``, ``fits``) and its speed-up over
    ``none`` and over the best dense baseline that fits (×). A compressor swept at several ranks counts once,
    at its fastest rank that fits."""
    clusters: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in scenario_rows(store, sweep_id):
        key = (row["nodes"], row["bandwidth_bps"], row["latency_s"], row["topology"], row["fidelity"])
        found = pair(row["compressor"], row["density"])
        entry = {**row, "density": found.density}
        tag = found.label
        best = clusters.setdefault(key, {})
        if tag not in best or _ahead(entry, best[tag]):
            best[tag] = entry
    pairs = list(dict.fromkeys(pair(r["compressor"], r["density"]) for rows in clusters.values() for r in rows.values()))
    measured = quality.for_source(store, source, [p for p in pairs if rank_ is not None or p.compressor not in RANKED],
                                  rank=rank_ or 1, run_missing=False)
    out = []
    for (nodes, bandwidth, latency, topology, fidelity), rows in sorted(clusters.items()):
        judged = judge(quality.attach(list(rows.values()), measured))
        top = rank(memory_gate(list(rows.values()))[0])[0]
        out.append({"nodes": nodes, "bandwidth_bps": bandwidth, "latency_s": latency, "topology": topology,
                    "fidelity": fidelity, "best": top["label"], "iteration_s": top["iteration_s"],
                    "speedup": top["speedup"], "speedup_over_baseline": top["speedup_over_baseline"],
                    **{key: top[key] for key in MEMORY_KEYS if key != "memory_parts_gib"}, "verdict": judged})
    return out


def _ahead(row: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether ``row`` stands for its configuration rather than ``other`` (the same one at another
    PowerSGD rank): it fits in one GPU's memory where ``other`` does not, else it is faster."""
    return (row["fits"] is False, row["iteration_s"]) < (other["fits"] is False, other["iteration_s"])
