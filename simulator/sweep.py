"""Sweeps: a grid of scenarios, computed in chunks on any ``concurrent.futures`` executor.

The grid is generated lazily (memory stays flat in the number of scenarios); chunks are
submitted with a bounded number in flight and their rows handed to a callback as they
complete (the ``sidco sweep`` command writes them to the results store). A scenario is
identified by :func:`scenario_key`, so a rerun can skip the keys already stored.
``run_chunk`` is a plain module-level function: it runs in local worker processes or
on a Dask cluster (``Client(address).get_executor(pure=False)``) alike.
"""

from __future__ import annotations

import itertools
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Any

import compressors
from compressors import takes_density
from costs import CompressionProfile, density_key
from simulator.band import band
from simulator.calibration import Calibration
from units import check_count, check_density
from simulator.scenario import Scenario
from simulator.simulate import iteration, simulate
from simulator.workload import Workload

RANKED: tuple[str, ...] = tuple(compressors.names("lowrank"))
"""Compressors whose points take a rank from :attr:`Grid.ranks` (the low-rank ones)."""

RESULT_COLUMNS = (
    "iteration_s", "samples_per_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s", "speedup",
    "iteration_s_low", "iteration_s_high", "speedup_low", "speedup_high",
)


@dataclass(frozen=True)
class Grid:
    """The axes of a sweep (units: bits/s, seconds). ``none`` and each compressor that takes no
    density are simulated once per cluster;
    ``ranks`` is PowerSGD's rank axis (only ``powersgd`` points carry a rank)."""

    nodes: tuple[int, ...]
    bandwidths_bps: tuple[float, ...]
    latencies_s: tuple[float, ...]
    compressors: tuple[str, ...]
    densities: tuple[float, ...]
    topologies: tuple[str, ...] = ("ring",)
    ranks: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        for name in ("nodes", "bandwidths_bps", "latencies_s", "compressors", "topologies"):
            if not getattr(self, name):
                raise ValueError(f"sweep grid needs at least one value of {name}")
        for n in self.nodes:
            check_count(n, "nodes")
        if any(not b > 0 for b in self.bandwidths_bps):
            raise ValueError("bandwidths must be > 0 bits/s")
        for d in self.densities:
            check_density(d, "sweep density")
        if not self.ranks:
            raise ValueError("sweep grid needs at least one value of ranks")
        for r in self.ranks:
            check_count(r, "ranks")
        if any(takes_density(c) for c in self.compressors) and not self.densities:
            raise ValueError("compressors that take a density need --densities")

    def _combinations(self) -> list[dict[str, Any]]:
        """The (compressor, density[, rank]) part of every point: ``none`` once with no density, a
        compressor that takes no density (the casts, PowerSGD) once at density 1 (it sends what its
        dtype or rank sets, projected as a comparison projects it), a sparsifier at every density."""
        combos: list[dict[str, Any]] = []
        for c in self.compressors:
            densities = (None,) if c == "none" else self.densities if takes_density(c) else (1.0,)
            ranks = self.ranks if c in RANKED else (None,)
            combos += [{"compressor": c, "density": d, **({"rank": r} if r is not None else {})}
                       for d in densities for r in ranks]
        return combos

    def pairs(self) -> list[tuple[str, float]]:
        """The (compressor, density) of every point but ``none``'s, repeats dropped."""
        return list(dict.fromkeys((c["compressor"], c["density"]) for c in self._combinations()
                                  if c["compressor"] != "none"))

    def points(self) -> Iterator[dict[str, Any]]:
        """Every scenario point, cluster by cluster (lazily)."""
        combos = self._combinations()
        for topology, nodes, bw, lat in itertools.product(self.topologies, self.nodes, self.bandwidths_bps, self.latencies_s):
            for combo in combos:
                yield {"topology": topology, "nodes": nodes, "bandwidth_bps": float(bw), "latency_s": float(lat), **combo}

    def __len__(self) -> int:
        return (len(self.topologies) * len(self.nodes) * len(self.bandwidths_bps) * len(self.latencies_s)
                * len(self._combinations()))


def scenario_key(point: dict[str, Any]) -> str:
    """A canonical, human-readable identifier of a scenario point."""
    density = "-" if point["density"] is None else f"{density_key(point['density']):g}"
    rank = f"|r={point['rank']}" if point.get("rank") is not None else ""
    return (f"{point['topology']}|n={point['nodes']}|bw={point['bandwidth_bps']:.6g}|lat={point['latency_s']:.6g}"
            f"|{point['compressor']}|d={density}{rank}")


@dataclass(frozen=True)
class SweepContext:
    """What every chunk needs besides its points (sent once per chunk, small)."""

    workload: Workload
    profile: CompressionProfile | None
    fidelity: str = "analytic"
    calibration: Calibration | None = None
    options: dict[str, Any] = field(default_factory=dict)
    compute_band: tuple[float, float] = (1.0, 1.0)
    cost_bands: dict[tuple[str, float | None], tuple[float, float]] = field(default_factory=dict)
    """Factors on compute times and on each (compressor, density)'s costs spanning their
    measured error (:func:`simulator.band.band` gives every row its band)."""

    def scenario(self, point: dict[str, Any]) -> Scenario:
        """The :class:`Scenario` of ``point``; per-scenario seed derived from its key."""
        seed = zlib.crc32(scenario_key(point).encode()) ^ int(self.options.get("seed", 0))
        opts = {k: v for k, v in self.options.items() if k != "seed"}
        return Scenario(
            self.workload, point["nodes"], point["bandwidth_bps"], point["latency_s"], point["compressor"],
            point["density"], topology=point["topology"], fidelity=self.fidelity,
            profile=self.profile if point["compressor"] != "none" else None, calibration=self.calibration,
            seed=seed, rank=point.get("rank", 1), **opts,
        )


def run_chunk(context: SweepContext, points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Simulate ``points``; return one row per point with the ``scenarios`` table columns
    (except ``sweep_id``; the error band's keys, :data:`simulator.band.BAND_KEYS`, are in
    ``result_json``). The ``none`` baseline of each cluster is computed once per chunk."""
    baselines: dict[tuple, dict[str, Any]] = {}
    rows = []
    for point in points:
        scenario = context.scenario(point)
        cluster = (point["topology"], point["nodes"], point["bandwidth_bps"], point["latency_s"])
        if point["compressor"] == "none":
            result = simulate(scenario)
            baselines[cluster] = result
        else:
            if cluster not in baselines:
                none_point = {k: v for k, v in point.items() if k != "rank"} | {"compressor": "none", "density": None}
                baselines[cluster] = iteration(replace(context.scenario(none_point), timeline=False))
            result = simulate(scenario, baseline=baselines[cluster])
        if "rank" in point:
            result["rank"] = point["rank"]
        costs = (1.0, 1.0) if point["compressor"] == "none" else context.cost_bands.get(
            (point["compressor"], density_key(point["density"])), (1.0, 1.0))
        result.update(band(scenario, result, context.compute_band, costs))
        rows.append({
            "scenario_key": scenario_key(point), **{k: v for k, v in point.items() if k != "rank"},
            "fidelity": context.fidelity,
            **{col: result[col] for col in RESULT_COLUMNS},
            "result_json": json.dumps(result, sort_keys=True),
        })
    return rows


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``size`` items (the last may be shorter)."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def run_sweep(
    context: SweepContext,
    points: Iterable[dict[str, Any]],
    executor: Executor,
    *,
    chunk_size: int = 200,
    in_flight: int = 4,
    skip_done: Callable[[list[str]], set[str]] = lambda keys: set(),
    on_rows: Callable[[list[dict[str, Any]]], None],
    on_skipped: Callable[[int], None] = lambda n: None,
) -> int:
    """Run ``points`` in chunks on ``executor``; returns the number of scenarios computed.

    ``skip_done(keys)`` returns the keys already done (they are not recomputed; their count
    goes to ``on_skipped``); ``on_rows`` receives each finished chunk's rows in the calling
    process. At most ``in_flight`` chunks are outstanding, so memory does not grow with
    the grid.
    """
    if chunk_size < 1 or in_flight < 1:
        raise ValueError("chunk size and in-flight chunks must be >= 1")
    pending: set[Future] = set()
    computed = 0

    def drain(block_until: int) -> None:
        nonlocal pending, computed
        while len(pending) > block_until:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                rows = future.result()
                computed += len(rows)
                on_rows(rows)

    for batch in chunks(points, chunk_size):
        done_keys = skip_done([scenario_key(p) for p in batch])
        todo = [p for p in batch if scenario_key(p) not in done_keys]
        if len(todo) < len(batch):
            on_skipped(len(batch) - len(todo))
        if todo:
            pending.add(executor.submit(run_chunk, context, todo))
            drain(in_flight - 1)
    drain(0)
    return computed


def describe(context: SweepContext, grid: Grid, source: dict[str, Any]) -> dict[str, Any]:
    """The configuration that identifies a sweep (reruns with the same one resume it), plain JSON: an
    option held as a dataclass (the ``--parallel`` family's :class:`simulator.sharded.Sharding`) as its
    fields (``parallel``, ``shard_size``, ``reduce_dtype``, ``param_dtype``, ``micro_batch``,
    ``checkpointing``)."""
    return {
        "source": source,
        "grid": {k: v for k, v in asdict(grid).items() if k != "ranks" or tuple(v) != (1,)},
        "fidelity": context.fidelity,
        "options": {name: asdict(value) if is_dataclass(value) else value for name, value in context.options.items()},
        "calibration": None if context.calibration is None else asdict(context.calibration),
        "profile": None if context.profile is None else context.profile.source,
    }
