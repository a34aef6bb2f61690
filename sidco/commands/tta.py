"""``sidco tta``: time to reach a target accuracy (or loss) per compressor on a cluster."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline import project
from pipeline.catalog import TOPOLOGIES
from pipeline.memory import STRATEGY_UNMODELLED
from pipeline.penalty import penalty_lines
from pipeline.request import Request, check_compressors, sharding_flags, sites_text
from pipeline.tta import (check_target, convergence_run, curves_time_to_accuracy, load_curves, projection_of,
                          target_text, time_to_accuracy, verdict_text)
from results.store import Store
from sidco.commands import dump_json
from sidco.commands.compare import memory_cell, memory_legend
from sidco.commands.simulate import (add_latency_args, add_parallel_args, add_scenario_args, add_source_args, cluster,
                                    workload_fields)
from units import Pair, format_bandwidth, format_seconds
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
            "to call' and why. Each row also gives the memory one GPU holds on the cluster (GiB, memory_gib in "
            "--json, as sidco compare gives it); a configuration that does not fit is never named."
            " DiLoCo (sidco converge --sync-every H): every DiLoCo variant of the run's configuration (per H, outer "
            "compressor and density) is ranked with the per-step pairs: its inner steps to the target × the time per "
            "inner step sidco compare projects for diloco on --sites S joined by --wan-bandwidth and --wan-rtt (one "
            "site's step, compute from the synchronous run's trace, plus the outer exchange across the sites over H); "
            "each row says its sync_every, outer compressor and utilization. A DiLoCo run takes the trace and the "
            "per-step pairs of its synchronous run (same model, batch and inner optimizer). After the table, each "
            "variant's held-out loss penalty against the synchronous run at equal tokens (nats, mean ± spread over "
            "paired seeds)."
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


def _strategy_cells(row: dict[str, Any]) -> str:
    """A row's H, outer exchange and utilization (``-`` where unprojected)."""
    outer = "-" if row["outer_compressor"] is None else Pair(row["outer_compressor"], row["outer_density"]).label
    util = "-" if row["utilization"] is None else f"{row['utilization']:.1%}"
    return f" {row['sync_every']:>5} {outer:>12} {util:>6}"


def print_result(result: dict[str, Any], sites: str = "") -> None:
    """The time-to-target table, the verdict and its margin, in text (``sites``: the cluster's
    sites and WAN in words, :func:`pipeline.request.sites_text`)."""
    cluster = result["cluster"]
    target = target_text(result["target"]["accuracy"], result["target"]["loss"])
    if "curves_source" in result:
        what = f"curves {result['curves_source']} ({result['workload']})"
    else:
        what = (f"convergence {result['convergence_id']} ({result['workload']}, trained with {result['workers_trained']} "
                f"workers" + ("" if result["synchronous_id"] == result["convergence_id"] else
                              f"; its synchronous run: convergence {result['synchronous_id']}") + ")")
    print(f"{what}, {result['seeds']} seed(s), on {cluster['nodes']} x {result['device']} ({result['precision']}), "
          f"{format_bandwidth(cluster['bandwidth_bps'])}, {format_seconds(cluster['latency_s'])} one-way latency, "
          f"{cluster['topology']}, {cluster['fidelity']}{sites}"
          f"{', ' + cluster['parallel'] if 'parallel' in cluster else ''}; target: {target}")
    rows = result["rows"]
    lowcomm = any("utilization" in r for r in rows)
    width = max(10, *(len(r["label"]) for r in rows))
    header = (f"{'config':<{width}} {'iterations':>14} {'iteration':>11} {'time to target':>22} {'mem GiB':>7}"
              + (f" {'H':>5} {'outer':>12} {'util':>6}" if lowcomm else "") + "  note")
    print(header)
    print("-" * len(header))
    for row in rows:
        print((f"{row['label']:<{width}} {_iterations(row):>14} {_seconds(row['iteration_s']):>11} {_time(row):>22} "
               f"{memory_cell(row)}" + (_strategy_cells(row) if lowcomm else "") + f"  {row['reason'] or ''}").rstrip())
    sources = "; ".join(f"{name}: {source}" for name, source in sorted(result["cost_sources"].items()))
    print("iterations = to the first evaluation at the target (mean ± sample standard deviation over the seeds); "
          f"iteration = projected seconds per iteration on {result['device']}; compute: {result['compute_source']}; "
          f"compression costs: {sources or 'none needed'}; {memory_legend(rows)}")
    diloco = [r for r in rows if r["compressor"] == "diloco"]
    if lowcomm:
        print("H = inner steps between syncs across sites (1: every step); outer = the pseudo-gradient's compressor; "
              "util = compute (forward, backward, optimizer) / time per (inner) step")
    if diloco:
        print(f"diloco: memory {STRATEGY_UNMODELLED}")
        print(f"diloco: iterations = inner steps; iteration = one site's step (compute from trace #{result['trace_id']} "
              f"of the synchronous run, convergence {result['synchronous_id']}: same model, per-worker batch and inner "
              "optimizer; a DiLoCo run records no trace) + its outer exchange across the sites / H, as sidco compare "
              "projects diloco")
    if result.get("workers_trained") not in (None, cluster["nodes"]):
        print(f"note: the run trained with {result['workers_trained']} workers (global batch "
              f"{result['workers_trained']} x per-worker batch); the projection assumes the same iterations "
              f"on {cluster['nodes']} nodes")
    if diloco and cluster["sites"] > 1 and result["workers_trained"] != cluster["sites"]:
        print(f"note: the DiLoCo runs trained {result['workers_trained']} sites of one worker; the projection assumes "
              f"the same inner steps on {cluster['sites']} sites of {cluster['nodes'] // cluster['sites']} nodes")
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
        if curves is None:  # the trace of the run's synchronous run, its device resolved once
            run = convergence_run(store, args.convergence)
            result = time_to_accuracy(store, projection_of(store, run, chosen, **fields), run, **targets)
        else:
            result = curves_time_to_accuracy(store, asked, curves, **targets)
    flags = sharding_flags(chosen.options.get("sharding")).strip()
    if flags:  # the --parallel family the iteration was projected under
        result["cluster"]["parallel"] = flags
    if args.json:
        print(dump_json(result))
    else:
        print_result(result, sites_text(chosen))
    return 0
