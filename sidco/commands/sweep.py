"""``sidco sweep``: simulate a grid of clusters × compressors × densities into the results store.

Rows stream into the ``scenarios`` table chunk by chunk (one transaction each), keyed by
``(sweep_id, scenario_key)``; rerunning the same command resumes the sweep and computes
only the missing scenarios. Work fans out over local processes or, with ``--dask``, an
existing Dask cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterator

from tqdm import tqdm

import simulator
from sidco.commands.simulate import (
    add_scenario_args,
    add_source_args,
    build_profile,
    load_calibration,
    load_source,
    positive_int,
    scenario_options,
)
from results.store import Store
from simulator.scenario import TOPOLOGIES
from simulator.sweep import Grid, SweepContext, describe, run_sweep
from simulator.units import parse_bandwidth, parse_density, parse_duration, parse_list

PROFILE_META = "sweep-profile:{}"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` subcommand."""
    parser = subparsers.add_parser(
        "sweep",
        help="simulate a grid of scenarios into the results store (resumable, local or Dask)",
        description=(
            "Simulate every combination of --nodes, --bandwidth (bits/s, e.g. 1Gbit,10Gbit), --latency "
            "(e.g. 50us), --topology and compressor × density (plus 'none' once per cluster) and store "
            "one row per scenario in the scenarios table of the results store. Rerunning the same "
            "command resumes: each scenario is stored exactly once."
        ),
    )
    add_source_args(parser)
    parser.add_argument("--nodes", required=True, help="comma-separated machine counts, e.g. 2,4,8,16,32,64")
    parser.add_argument("--bandwidth", required=True, help="comma-separated bandwidths, e.g. 1Gbit,10Gbit,25Gbit")
    parser.add_argument("--latency", default="50us", help="comma-separated latencies, e.g. 5us,50us (default 50us)")
    parser.add_argument("--compressors", default="all",
                        help="comma-separated compressor names, or all (default; includes none)")
    parser.add_argument("--densities", default="0.01,0.001", help="comma-separated densities (default 0.01,0.001)")
    parser.add_argument("--rank", default="1",
                        help="comma-separated PowerSGD ranks r (columns of P and Q per layer), swept for powersgd "
                             "only (default 1)")
    parser.add_argument("--topology", default="ring",
                        help=f"comma-separated topologies from {', '.join(TOPOLOGIES)} (default ring)")
    parser.add_argument("--dask", metavar="tcp://HOST:PORT", help="run on an existing Dask scheduler")
    parser.add_argument("--jobs", default=str(os.cpu_count() or 1),
                        help="local worker processes (default: CPU count)")
    parser.add_argument("--chunk-size", default="200", help="scenarios per task (default 200)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_scenario_args(parser)
    parser.set_defaults(func=run, fidelity="analytic")


def parse_grid(args: argparse.Namespace) -> Grid:
    """The sweep axes from the command line (strict units)."""
    import compressors

    names = compressors.names() if args.compressors.strip() == "all" else parse_list(args.compressors, str)
    unknown = [n for n in names if n not in compressors.names()]
    if unknown:
        raise ValueError(f"unknown compressor {unknown[0]!r}; choose from {', '.join(compressors.names())}")
    topologies = parse_list(args.topology, str)
    bad = [t for t in topologies if t not in TOPOLOGIES]
    if bad:
        raise ValueError(f"unknown topology {bad[0]!r}; choose from {', '.join(TOPOLOGIES)}")

    return Grid(
        nodes=tuple(parse_list(args.nodes, lambda t: positive_int(t, "--nodes"))),
        bandwidths_bps=tuple(parse_list(args.bandwidth, parse_bandwidth)),
        latencies_s=tuple(parse_list(args.latency, parse_duration)),
        compressors=tuple(dict.fromkeys(names)),
        densities=tuple(parse_list(args.densities, parse_density)) if any(n != "none" for n in names) else (),
        topologies=tuple(dict.fromkeys(topologies)),
        ranks=tuple(dict.fromkeys(parse_list(args.rank, lambda t: positive_int(t, "--rank")))),
    )


@contextmanager
def make_executor(dask: str | None, jobs: int) -> Iterator[tuple[Executor, int]]:
    """A local process pool, or the executor of an existing Dask cluster; yields (executor, slots)."""
    if dask:
        from distributed import Client

        with Client(dask, timeout="10s") as client:
            slots = max(1, sum(client.nthreads().values()))
            yield client.get_executor(pure=False), slots
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            yield pool, jobs


def _profile(store: Store, sweep_id: int, created: bool, trace: Any, grid: Grid, device: str):
    """The sweep's compression profile: measured/loaded once, kept in the store's meta table
    so a resumed sweep uses exactly the same costs."""
    key = PROFILE_META.format(sweep_id)
    if not created:
        row = store.query("SELECT value FROM meta WHERE key=?", (key,))
        if row:
            text = row[0]["value"]
            return None if text == "null" else simulator.CompressionProfile.from_json(text)
    pairs = [(c, d) for c in grid.compressors if c != "none" for d in grid.densities]
    profile = build_profile(store, trace, pairs, device)
    with store.transaction() as cur:
        cur.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)",
                    (key, "null" if profile is None else profile.to_json()))
    return profile


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep; print a summary (JSON with --json)."""
    grid = parse_grid(args)
    jobs = positive_int(args.jobs, "--jobs")
    chunk_size = positive_int(args.chunk_size, "--chunk-size")
    workload, trace, source = load_source(args)
    options = scenario_options(args, workload)
    with Store(args.store) as store:
        calibration = load_calibration(store, args.calibration)
        context = SweepContext(workload, None, args.fidelity, calibration, options)
        config = describe(context, grid, source)
        trace_id = store.register_trace(os.fspath(trace), trace.manifest) if trace is not None else None
        sweep_id, created = store.get_or_create("sweeps", config, trace_id=trace_id, total=len(grid))
        profile = _profile(store, sweep_id, created, trace, grid, args.profile_device)
        context = SweepContext(workload, profile, args.fidelity, calibration, options)
        for point in grid.points():
            context.scenario(point)
        done_before = store.query("SELECT COUNT(*) AS n FROM scenarios WHERE sweep_id=?", (sweep_id,))[0]["n"]
        bar = tqdm(total=len(grid), initial=done_before, unit="scenario", desc=f"sweep {sweep_id}",
                   file=sys.stderr, disable=args.no_progress)

        def skip_done(keys: list[str]) -> set[str]:
            marks = ",".join("?" for _ in keys)
            rows = store.query(
                f"SELECT scenario_key FROM scenarios WHERE sweep_id=? AND scenario_key IN ({marks})", (sweep_id, *keys)
            )
            return {r["scenario_key"] for r in rows}

        def on_rows(rows: list[dict[str, Any]]) -> None:
            store.insert_many("scenarios", ({"sweep_id": sweep_id, **r} for r in rows), or_ignore=True)
            bar.update(len(rows))

        with make_executor(args.dask, jobs) as (executor, slots):
            computed = run_sweep(context, grid.points(), executor, chunk_size=chunk_size, in_flight=2 * slots,
                                 skip_done=skip_done, on_rows=on_rows)
        bar.close()
        store.set_status("sweeps", sweep_id, "done")
        stored = store.query("SELECT COUNT(*) AS n FROM scenarios WHERE sweep_id=?", (sweep_id,))[0]["n"]
    summary = {"sweep_id": sweep_id, "total": len(grid), "stored": stored, "computed": computed,
               "resumed": not created, "store": str(args.store), "fidelity": args.fidelity}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"sweep {sweep_id}: {stored}/{len(grid)} scenarios stored in {args.store} "
              f"({computed} computed now{', resumed' if not created else ''}; fidelity {args.fidelity})")
    return 0
