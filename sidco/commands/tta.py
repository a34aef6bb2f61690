"""``sidco tta``: time to reach a target accuracy (or loss) per compressor on a cluster."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline import project
from pipeline.catalog import TOPOLOGIES
from pipeline.penalty import loss_penalties, penalty_lines
from pipeline.request import Request, check_compressors, sharding_flags
from pipeline.tta import (check_target, convergence_run, curves_time_to_accuracy, load_curves, target_text,
                          time_to_accuracy, trace_path, verdict_text)
from results.store import Store
from sidco.commands import dump_json
from sidco.commands.simulate import (add_latency_args, add_parallel_args, add_scenario_args, add_source_args, cluster,
                                    workload_fields)
from units import format_bandwidth, format_seconds
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
            "For every (compressor, density) of a convergence run (sidco converge; every seed of its "
            "configuration) or of curves measured elsewhere (--curves): the iterations it needed to reach the "
            "target (first held-out evaluation at or past it; mean and spread over the seeds), the projected "
            "time of one iteration on --nodes machines of --device with --bandwidth links (the projection of "
            "sidco simulate --trace ... --device: compute of the trace projected onto the device, compression "
            "costs by the one cost policy), and their product, the time to target (seconds). A run that never "
            "reaches the target gets null and the reason. Names the winner only when its margin over the "
            "runner-up exceeds both the seed spread and the projection's error band; otherwise says 'too close "
            "to call' and why."
            " DiLoCo (sidco converge --sync-every H): after the table of a synchronous run, and instead of it for a "
            "DiLoCo run, each DiLoCo run of the same configuration's held-out loss penalty against the synchronous "
            "run at equal tokens (nats, mean ± spread over paired seeds)."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--convergence", default="latest", metavar="ID|latest",
                        help="convergence run id, or latest (default); its trace is the workload")
    parser.add_argument("--curves", metavar="FILE",
                        help='curves from your own training instead of a convergence run: JSON {"source", "rows": '
                             '[{compressor, density, iteration, loss, accuracy[, eval_loss, seed]}]} or the same '
                             "columns as CSV (sidco converge --json writes it); the workload whose iteration is "
                             "projected is --trace, --layout or --model")
    parser.add_argument("--nodes", required=True, help="machines (an integer >= 1)")
    parser.add_argument("--bandwidth", required=True, help="NIC bandwidth per direction, e.g. 1Gbit or 1.25GB/s")
    add_latency_args(parser)
    parser.add_argument("--topology", choices=TOPOLOGIES,
                        help="ring, halving-doubling, tree, ps or hierarchical (default: ring, or hierarchical "
                             "with --gpus-per-node above 1)")
    add_source_args(parser, required=False)
    add_target_args(parser)
    add_scenario_args(parser)
    add_parallel_args(parser)
    parser.set_defaults(func=run, fidelity="analytic")


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def _iterations(row: dict[str, Any]) -> str:
    if row["iterations_to_target"] is None:
        return "-"
    if row["iterations_spread"] is None:
        return f"{row['iterations_to_target']:g}"
    return f"{row['iterations_to_target']:.4g} ± {row['iterations_spread']:.2g}"


def _time(row: dict[str, Any]) -> str:
    if row["time_to_target_s"] is None:
        return "-"
    text = _seconds(row["time_to_target_s"])
    return text if row["time_spread_s"] is None else f"{text} ± {_seconds(row['time_spread_s'])}"


def print_result(result: dict[str, Any]) -> None:
    """The time-to-target table, the verdict and its margin, in text."""
    cluster = result["cluster"]
    target = target_text(result["target"]["accuracy"], result["target"]["loss"])
    what = (f"curves {result['curves_source']} ({result['workload']})" if "curves_source" in result else
            f"convergence {result['convergence_id']} ({result['workload']}, trained with {result['workers_trained']} "
            f"workers)")
    print(f"{what}, {result['seeds']} seed(s), on {cluster['nodes']} x {result['device']} ({result['precision']}), "
          f"{format_bandwidth(cluster['bandwidth_bps'])}, {format_seconds(cluster['latency_s'])} one-way latency, "
          f"{cluster['topology']}, {cluster['fidelity']}{', ' + cluster['parallel'] if 'parallel' in cluster else ''}; "
          f"target: {target}")
    header = f"{'compressor':<10} {'density':>8} {'iterations':>14} {'iteration':>11} {'time to target':>22}  note"
    print(header)
    print("-" * len(header))
    for row in result["rows"]:
        density = "-" if row["density"] is None else f"{row['density']:g}"
        print(f"{row['compressor']:<10} {density:>8} {_iterations(row):>14} {_seconds(row['iteration_s']):>11} "
              f"{_time(row):>22}  {row['reason'] or ''}")
    sources = "; ".join(f"{name}: {source}" for name, source in sorted(result["cost_sources"].items()))
    print("iterations = to the first evaluation at the target (mean ± sample standard deviation over the seeds); "
          f"iteration = projected seconds per iteration on {result['device']}; compute: {result['compute_source']}; "
          f"compression costs: {sources or 'none needed'}")
    if result.get("workers_trained") not in (None, cluster["nodes"]):
        print(f"note: the run trained with {result['workers_trained']} workers (global batch "
              f"{result['workers_trained']} x per-worker batch); the projection assumes the same iterations "
              f"on {cluster['nodes']} nodes")
    print(verdict_text(result))
    if result.get("loss_penalty"):
        print("\n".join(penalty_lines(result["loss_penalty"])))


def run(args: argparse.Namespace) -> int:
    """Compute and print the time-to-target table."""
    check_target(args.target_accuracy, args.target_loss)
    chosen = cluster(args)
    if args.curves is None and (args.trace or args.layout or args.model):
        raise ValueError("--trace/--layout/--model name the workload of --curves; a convergence run's trace is its own")
    if args.curves is not None and not (args.trace or args.layout or args.model):
        raise ValueError("--curves needs the workload to project: --trace DIR or --layout NAME (or --model NAME|FILE)")
    curves = load_curves(args.curves) if args.curves is not None else None
    if curves is not None:
        check_compressors(list(dict.fromkeys(r["compressor"] for r in curves["rows"])))
    fields = workload_fields(args)
    asked = None if curves is None else project.resolve(Request(chosen, **fields))  # the device resolved once
    with Store(args.store) as store:
        targets = {"target_accuracy": args.target_accuracy, "target_loss": args.target_loss}
        if curves is None:  # the run's own trace, its device resolved once
            run = convergence_run(store, args.convergence)
            penalty = loss_penalties(store, run)
            if penalty is not None and penalty["diloco_run"]:  # its time per step is not projected here
                print(dump_json({"convergence_id": run["id"], "loss_penalty": penalty}) if args.json else
                      "\n".join([f"convergence {run['id']} is a DiLoCo run (sync every {run['config']['sync_every']} "
                                  "steps): no per-step time to project", *penalty_lines(penalty)]))
                return 0
            asked = project.resolve(Request(chosen, **{**fields, "trace": trace_path(store, run)}), store)
            result = time_to_accuracy(store, asked, run, **targets)
            if penalty is not None:
                result["loss_penalty"] = penalty
        else:
            result = curves_time_to_accuracy(store, asked, curves, **targets)
    flags = sharding_flags(chosen.options.get("sharding")).strip()
    if flags:  # the --parallel family the iteration was projected under
        result["cluster"]["parallel"] = flags
    if args.json:
        print(dump_json(result))
    else:
        print_result(result)
    return 0
