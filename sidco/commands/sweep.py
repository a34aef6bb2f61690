"""``sidco sweep``: simulate a grid of clusters × compressors × densities into the results store.

Parses the grid and calls :func:`pipeline.sweep.run`: rows stream into the ``scenarios``
table chunk by chunk, rerunning the same command resumes the sweep. Work fans out over
local processes or, with ``--dask``, an existing Dask cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from collections.abc import Iterator

from tqdm import tqdm

import pipeline.sweep
from pipeline.project import workload
from results.store import Store
from sidco.commands.simulate import add_scenario_args, add_source_args, parse_source, positive_int, scenario_options
from simulator.scenario import TOPOLOGIES
from simulator.sweep import Grid
from simulator.units import parse_bandwidth, parse_density, parse_duration, parse_list


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
    return pipeline.sweep.grid(
        nodes=parse_list(args.nodes, lambda t: positive_int(t, "--nodes")),
        bandwidths_bps=parse_list(args.bandwidth, parse_bandwidth),
        latencies_s=parse_list(args.latency, parse_duration),
        compressors=names,
        densities=parse_list(args.densities, parse_density) if any(n != "none" for n in names) else (),
        topologies=parse_list(args.topology, str),
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


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep; print a summary (JSON with --json)."""
    grid = parse_grid(args)
    jobs = positive_int(args.jobs, "--jobs")
    chunk_size = positive_int(args.chunk_size, "--chunk-size")
    with Store(args.store) as store:
        source, device = parse_source(args, store)
        options = scenario_options(args, workload(source))
        bars: list[tqdm] = []  # opened once the sweep is checked and its row exists

        def started(sweep_id: int, stored: int) -> None:
            bars.append(tqdm(total=len(grid), initial=stored, unit="scenario", desc=f"sweep {sweep_id}",
                             file=sys.stderr, disable=args.no_progress))

        def progress(stored: int, total: int) -> None:
            bars[0].update(stored - bars[0].n)

        try:
            with make_executor(args.dask, jobs) as (executor, slots):
                done = pipeline.sweep.run(
                    store, source, grid, executor, fidelity=args.fidelity, options=options,
                    calibrated=args.calibration, device=device, profile_file=args.profile,
                    chunk_size=chunk_size,
                    in_flight=2 * slots, started=started, progress=progress,
                )
        finally:
            for bar in bars:
                bar.close()
    summary = {"sweep_id": done.sweep_id, "total": done.total, "stored": done.stored, "computed": done.computed,
               "resumed": done.resumed, "store": str(args.store), "fidelity": args.fidelity, "device": device,
               "compute_source": source.compute, "cost_sources": done.cost_sources}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"sweep {done.sweep_id}: {done.stored}/{done.total} scenarios stored in {args.store} "
              f"({done.computed} computed now{', resumed' if done.resumed else ''}; fidelity {args.fidelity})")
        print(f"device {device}: compute from {source.compute}")
        for pair, where in sorted(done.cost_sources.items()):
            print(f"  costs of {pair}: {where}")
    return 0
