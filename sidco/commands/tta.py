"""``sidco tta``: time to reach a target accuracy (or loss) per compressor on a cluster."""

from __future__ import annotations

import argparse
import json
from typing import Any

from convergence.tta import check_target, target_text
from pipeline import project
from pipeline.tta import label, resolve, time_to_accuracy, trace_path
from results.store import Store
from sidco.commands.simulate import add_precision_arg, add_scenario_args, positive_int, scenario_options
from simulator.scenario import TOPOLOGIES
from simulator.units import format_bandwidth, format_seconds, parse_bandwidth, parse_duration
from sidco.commands import COMMANDS


def add_target_args(parser: argparse.ArgumentParser) -> None:
    """``--target-accuracy`` / ``--target-loss`` (one of them)."""
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target-accuracy", type=float, metavar="A",
                        help="held-out accuracy to reach, a fraction in (0, 1], e.g. 0.6")
    target.add_argument("--target-loss", type=float, metavar="L",
                        help="held-out loss (cross-entropy, nats) to get down to, e.g. 1.2")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tta`` subcommand."""
    parser = subparsers.add_parser(
        "tta",
        help=COMMANDS["tta"],
        description=(
            "For every (compressor, density) of a convergence run (sidco converge): the iterations it needed "
            "to reach the target (first held-out evaluation at or past it), the projected time of one "
            "iteration on --nodes machines with --bandwidth links (the simulator, with compute from the "
            "run's trace and compression costs from its replay), and their product, the time to target "
            "(seconds). A run that never reaches the target gets null and the reason. Prints the winner "
            "and its margin over the runner-up."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--convergence", default="latest", metavar="ID|latest",
                        help="convergence run id, or latest (default)")
    parser.add_argument("--nodes", required=True, help="machines (an integer >= 1)")
    parser.add_argument("--bandwidth", required=True, help="NIC bandwidth per direction, e.g. 1Gbit or 1.25GB/s")
    parser.add_argument("--latency", default="50us", help="per-message latency, e.g. 50us (default 50us)")
    parser.add_argument("--topology", choices=TOPOLOGIES, default="ring",
                        help="ring (default), halving-doubling, tree, ps, hierarchical")
    parser.add_argument("--device", default="cpu", metavar="NAME",
                        help="device whose compression costs the projection uses: the run's replay on it, else its "
                             "stored profile (default cpu)")
    add_precision_arg(parser)
    add_target_args(parser)
    add_scenario_args(parser)
    parser.set_defaults(func=run, fidelity="analytic")


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def print_result(result: dict[str, Any]) -> None:
    """The time-to-target table, the winner and its margin, in text."""
    cluster = result["cluster"]
    target = target_text(result["target"]["accuracy"], result["target"]["loss"])
    print(f"convergence {result['convergence_id']} ({result['workload']}, trained with {result['workers_trained']} "
          f"workers) on {cluster['nodes']} nodes, {format_bandwidth(cluster['bandwidth_bps'])}, "
          f"{format_seconds(cluster['latency_s'])} latency, {cluster['topology']}, {cluster['fidelity']}; "
          f"target: {target}")
    header = f"{'compressor':<10} {'density':>8} {'iterations':>10} {'iteration':>11} {'time to target':>15}  note"
    print(header)
    print("-" * len(header))
    for row in result["rows"]:
        iterations = "-" if row["iterations_to_target"] is None else str(row["iterations_to_target"])
        print(f"{row['compressor']:<10} {row['density']:>8g} {iterations:>10} {_seconds(row['iteration_s']):>11} "
              f"{_seconds(row['time_to_target_s']):>15}  {row['reason'] or ''}")
    sources = "; ".join(f"{name}: {source}" for name, source in sorted(result["cost_sources"].items()))
    print(f"iterations = to the first evaluation at the target; iteration = projected seconds per iteration "
          f"(device {result['device']}); compression costs: {sources or 'none needed'}")
    if result["workers_trained"] != cluster["nodes"]:
        print(f"note: the run trained with {result['workers_trained']} workers (global batch "
              f"{result['workers_trained']} x per-worker batch); the projection assumes the same iterations "
              f"on {cluster['nodes']} nodes")
    winner = result["winner"]
    if winner is None:
        print(f"winner: none ({result['reason']})")
        return
    line = f"winner: {label(winner['compressor'], winner['density'])} reaches {target} in {_seconds(winner['time_to_target_s'])}"
    runner = result["runner_up"]
    if runner is not None:
        line += (f", {_seconds(result['margin_s'])} ({result['margin_ratio']:.2f}x) ahead of "
                 f"{label(runner['compressor'], runner['density'])}")
        if result.get("within_error"):
            line += ": within the model's error (their time bands overlap)"
    print(line)


def run(args: argparse.Namespace) -> int:
    """Compute and print the time-to-target table."""
    check_target(args.target_accuracy, args.target_loss)
    nodes = positive_int(args.nodes, "--nodes")
    bandwidth = parse_bandwidth(args.bandwidth)
    latency = parse_duration(args.latency)
    with Store(args.store) as store:
        run_row = resolve(store, args.convergence)
        source = project.trace_source(store, path=trace_path(store, run_row))
        options = scenario_options(args, project.workload(source))
        cluster = project.Cluster(nodes, bandwidth, latency, args.topology, args.fidelity, options)
        result = time_to_accuracy(store, run_row["id"], target_accuracy=args.target_accuracy,
                                  target_loss=args.target_loss, cluster=cluster, device=args.device,
                                  calibrated=args.calibration, precision=args.precision)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print_result(result)
    return 0

