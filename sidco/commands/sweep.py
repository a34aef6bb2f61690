"""``sidco sweep``: simulate a grid of clusters × compressors × densities into the results store.

Parses the grid and calls :func:`pipeline.sweep.run`: rows stream into the ``scenarios``
table chunk by chunk, rerunning the same command resumes the sweep. Work fans out over
local processes or, with ``--dask``, an existing Dask cluster.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any

from tqdm import tqdm

import pipeline.sweep
from pipeline.catalog import TOPOLOGIES, compressor_names
from pipeline.memory import capacity_gib
from pipeline.verdict import fit_note
from pipeline import project as projection
from pipeline.request import (WorkloadRequest, default_topology, one_way_latencies, pair, refused,
                              takes_density)
from pipeline.sweep import Grid, check_jobs
from pipeline.tta import check_target, convergence_run, per_step_run, sweep_time_to_target, target_text, trace_path
from results.store import Store
from sidco.commands import dump_json
from sidco.commands.compare import memory_cell, memory_legend, say
from sidco.commands.tta import add_target_args
from sidco.commands.simulate import (add_latency_args, add_parallel_args, add_scenario_args, add_source_args,
                                     scenario_options, sharding_option, workload_fields)
from units import format_bandwidth, format_seconds, parse_bandwidth, parse_count, parse_density, parse_list
from sidco.commands import COMMANDS

MAX_CHUNK_SIZE = 100_000
"""Scenarios per task at most (a chunk's rows are held in memory until they land)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` subcommand."""
    parser = subparsers.add_parser(
        "sweep",
        help=COMMANDS["sweep"],
        description=(
            "Simulate every combination of --nodes, --bandwidth (bits/s, e.g. 1Gbit,10Gbit), --latency "
            "(one-way, e.g. 50us), --topology and compressor × density (plus the baselines none, fp16 and powersgd "
            "that compare always has, once per cluster) and store "
            "one row per scenario in the scenarios table of the results store. Rerunning the same "
            "command resumes: each scenario is stored exactly once. With --convergence and a target, every "
            "scenario also gets the iterations that run needed to reach the target and the time to target "
            "(iterations x iteration time, seconds); without --trace/--layout the run's trace is swept. Every "
            "scenario also records the memory one GPU holds (GiB, as sidco compare gives it); a configuration that "
            "does not fit is never a cluster's best nor its verdict."
        ),
    )
    add_source_args(parser, required=False)
    parser.add_argument("--convergence", metavar="ID|latest",
                        help="convergence run (sidco converge) whose iterations to target give each scenario "
                             "a time to target")
    add_target_args(parser)
    parser.add_argument("--nodes", required=True, help="comma-separated machine counts, e.g. 2,4,8,16,32,64")
    parser.add_argument("--bandwidth", required=True, help="comma-separated bandwidths, e.g. 1Gbit,10Gbit,25Gbit")
    add_latency_args(parser, several=True)
    parser.add_argument("--compressors", default="all",
                        help="comma-separated compressor names, or all (default; includes none)")
    parser.add_argument("--densities", default="0.01,0.001", help="comma-separated densities (default 0.01,0.001)")
    parser.add_argument("--rank", default="1",
                        help="comma-separated PowerSGD ranks r (columns of P and Q per layer), swept for powersgd "
                             "only (default 1)")
    parser.add_argument("--topology",
                        help=f"comma-separated topologies from {', '.join(TOPOLOGIES)} (default: ring, or "
                             "hierarchical with --gpus-per-node above 1)")
    parser.add_argument("--dask", metavar="tcp://HOST:PORT", help="run on an existing Dask scheduler")
    parser.add_argument("--jobs", default=str(os.cpu_count() or 1),
                        help="local worker processes (default: CPU count)")
    parser.add_argument("--chunk-size", default="200", help="scenarios per task (default 200)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_scenario_args(parser)
    add_parallel_args(parser)
    parser.set_defaults(func=run, fidelity="analytic")


def parse_grid(args: argparse.Namespace) -> Grid:
    """The sweep axes from the command line (strict units)."""
    names = compressor_names() if args.compressors.strip() == "all" else parse_list(args.compressors, str)
    return pipeline.sweep.grid(
        nodes=parse_list(args.nodes, lambda t: parse_count(t, "--nodes")),
        bandwidths_bps=parse_list(args.bandwidth, parse_bandwidth),
        latencies_s=one_way_latencies(args.latency, args.rtt),
        compressors=names,
        densities=parse_list(args.densities, parse_density) if any(takes_density(n) for n in names) else (),
        topologies=parse_list(args.topology, str) if args.topology else
        [default_topology(parse_count(args.gpus_per_node, "--gpus-per-node"))],
        ranks=parse_list(args.rank, lambda t: parse_count(t, "--rank")),
    )


def without_refused(grid: Grid, parallel: str) -> tuple[Grid, list[str]]:
    """``grid`` without the compressors ``--parallel`` cannot run (:func:`pipeline.request.refused`;
    its densities dropped when no compressor left takes one), and the reason for each, one line."""
    reasons = refused(parallel, grid.compressors)
    kept = tuple(name for name in grid.compressors if name not in reasons)
    densities = grid.densities if any(takes_density(name) for name in kept) else ()
    return replace(grid, compressors=kept, densities=densities), list(reasons.values())


def _convergence_source(args: argparse.Namespace) -> None:
    """Check --convergence / target / source together; sweep the run's trace when no source is given."""
    targeted = args.target_accuracy is not None or args.target_loss is not None
    if args.convergence is None:
        if targeted:
            raise ValueError("--target-accuracy/--target-loss need --convergence ID|latest")
        if not args.trace and not args.layout and not args.model:
            raise ValueError("give --trace DIR, --layout NAME, --model NAME|FILE or --convergence ID")
        return
    if not targeted:
        raise ValueError("--convergence needs --target-accuracy A or --target-loss L")
    check_target(args.target_accuracy, args.target_loss)
    if not args.trace and not args.layout and not args.model:
        with Store(args.store) as store:
            args.trace = trace_path(store, per_step_run(convergence_run(store, args.convergence)))


def _print_time_to_target(result: dict[str, Any]) -> None:
    target = target_text(result["target"]["accuracy"], result["target"]["loss"])
    print(f"time to {target} (convergence {result['convergence_id']}), fastest per cluster:")
    for w in result["winners"]:
        margin = "" if w["margin_ratio"] is None else f", {w['margin_ratio']:.2f}x ahead of the runner-up"
        print(f"  {w['nodes']:>5} nodes {format_bandwidth(w['bandwidth_bps']):>12} {w['topology']:<10} "
              f"{pair(w['compressor'], w['density']).label:<16} "
              f"{format_seconds(w['time_to_target_s'])}{margin}")
    unreached = sum(1 for r in result["rows"] if r["time_to_target_s"] is None)
    if unreached:
        print(f"  {unreached} scenario(s) without a time to target (never reached it, or not trained): see --json")


def _print_findings(found: list[dict[str, Any]]) -> None:
    """The best configuration of each cluster that fits in one GPU's memory, its speed-ups and memory
    per GPU, one table row per cluster in
    :data:`~sidco.commands.compare.WIDTH` columns, then each cluster's decision (whether to compress,
    with what) under the table, wrapped at that width as ``compare``'s verdict is."""
    say("found, per cluster (speed-up of the best configuration that fits over none and over the best dense "
        "baseline; its memory per GPU):")
    print(f"  {'#':>2} {'nodes':>5} {'bandwidth':>12} {'1-way lat':>9} {'topology':<16} {'best':<16} {'vs none':>8} "
          f"{'vs dense':>8} {'mem GiB':>7}")
    for number, f in enumerate(found, 1):
        vs_dense = "" if f["speedup_over_baseline"] is None else f"{f['speedup_over_baseline']:.3f}x"
        print(f"  {number:>2} {f['nodes']:>5} {format_bandwidth(f['bandwidth_bps']):>12} "
              f"{format_seconds(f['latency_s']):>9} {f['topology']:<16} {f['best']:<16} {f['speedup']:>7.3f}x "
              f"{vs_dense:>8} {memory_cell(f)}".rstrip())
    say(memory_legend(found) + "; a best marked ! means no configuration of its cluster fits", "  ")
    say("verdict per cluster (# as in the table):")
    for number, f in enumerate(found, 1):
        unfit = f["verdict"]["does_not_fit"]
        say(f"  {number:>2} verdict: {f['verdict']['headline']}" + (f"; {fit_note(unfit)}" if unfit else ""), " " * 5)


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep; print a summary (JSON with --json)."""
    _convergence_source(args)
    grid, reasons = without_refused(parse_grid(args), args.parallel)
    for reason in reasons:
        print(f"refused: {reason}", file=sys.stderr)
    jobs = parse_count(args.jobs, "--jobs")
    if not args.dask:
        check_jobs(jobs)
    chunk_size = parse_count(args.chunk_size, "--chunk-size")
    if chunk_size > MAX_CHUNK_SIZE:
        raise ValueError(f"--chunk-size {chunk_size} is too large (at most {MAX_CHUNK_SIZE:,} scenarios per task)")
    asked = projection.resolve(WorkloadRequest(**workload_fields(args)))  # the grid varies the rest
    source = asked.source
    options = {**scenario_options(args), **sharding_option(args)}
    with Store(args.store) as store:
        bars: list[tqdm] = []  # opened once the sweep is checked and its row exists

        def started(sweep_id: int, stored: int) -> None:
            bars.append(tqdm(total=len(grid), initial=stored, unit="scenario", desc=f"sweep {sweep_id}",
                             file=sys.stderr, disable=args.no_progress))

        def progress(stored: int, total: int) -> None:
            bars[0].update(stored - bars[0].n)

        try:
            with pipeline.sweep.executor(args.dask, jobs) as (executor, slots):
                done = pipeline.sweep.run(
                    store, asked, grid, executor, fidelity=args.fidelity, options=options, chunk_size=chunk_size,
                    in_flight=2 * slots, started=started, progress=progress,
                    waiting=lambda text: tqdm.write(text, file=sys.stderr),
                )
        finally:
            for bar in bars:
                bar.close()
        found = pipeline.sweep.findings(store, done.sweep_id, done.source, grid.ranks[0] if len(grid.ranks) == 1 else None)
        rows = pipeline.sweep.scenario_rows(store, done.sweep_id) if args.json else []
        held = pipeline.sweep.sharding_of(store.sweep(done.sweep_id)["config_json"])
        tta = None
        if args.convergence is not None:
            tta = sweep_time_to_target(store, done.sweep_id, args.convergence, target_accuracy=args.target_accuracy,
                                       target_loss=args.target_loss)
    summary = {"sweep_id": done.sweep_id, "total": done.total, "stored": done.stored, "computed": done.computed,
               "resumed": done.resumed, "store": str(args.store), "fidelity": args.fidelity, "device": source.device.name,
               "compute_source": source.compute, "cost_sources": done.cost_sources,
               "memory_capacity_gib": capacity_gib(found), "findings": found, "rows": rows}
    if held is not None:  # the --parallel family the grid was projected under, as stored, and what it refused
        summary.update(parallel=pipeline.sweep.sharding_text(held), sharding=held, refused=reasons)
    if tta is not None:
        summary["time_to_target"] = tta
    if args.json:
        print(dump_json(summary))
    else:
        say(f"sweep {done.sweep_id}: {done.stored}/{done.total} scenarios stored in {args.store} "
            f"({done.computed} computed now{', resumed' if done.resumed else ''}; fidelity {args.fidelity}"
            f"{'; ' + pipeline.sweep.sharding_text(held) if held is not None else ''})", "  ")
        say(f"device {source.device.name}: compute from {source.compute}", "  ")
        by_source: dict[str, list[str]] = {}
        for pair, where in sorted(done.cost_sources.items()):
            by_source.setdefault(where, []).append(pair)
        for where, pairs in by_source.items():
            say(f"  costs from {where}: {len(pairs)} pair(s) ({', '.join(pairs)})", " " * 4)
        _print_findings(found)
        if tta is not None:
            _print_time_to_target(tta)
    return 0
