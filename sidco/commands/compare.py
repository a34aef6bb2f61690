"""``sidco compare``: every (compressor, density) of one scenario, ranked, with a verdict.

Maps the arguments to one :class:`pipeline.request.Request` and calls
:func:`pipeline.compare.compare` (the projection of ``sidco simulate``, once per pair, in one
process) and :func:`pipeline.verdict.verdict`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tqdm import tqdm

from pipeline import compare as comparison
from pipeline import project as projection
from pipeline import quality
from pipeline.catalog import TOPOLOGIES, compressor_names
from pipeline.costs import KERNEL_BAND_NOTE
from pipeline.request import Request
from pipeline.settle import judge
from pipeline.verdict import BASELINES, TIE_MARGIN
from results.store import Store
from sidco.commands.simulate import add_parallel_args, add_scenario_args, add_source_args, cluster, workload_fields
from units import format_bandwidth, format_seconds, parse_density, parse_list
from sidco.commands import COMMANDS, dump_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand."""
    parser = subparsers.add_parser(
        "compare",
        help=COMMANDS["compare"],
        description=(
            "Project one data-parallel iteration of a trace (or full-size layout) on NODES machines with "
            "per-direction NIC links of BANDWIDTH (bits/s) for every compressor at every density, in one "
            "process, and rank them by iteration time. none, fp16 and powersgd are always compared; "
            "compressors whose message ignores the density (none, fp16, bf16, powersgd) appear once. Each "
            "row: iteration time and its breakdown (ms), speed-up over none and over the best dense "
            f"baseline ({', '.join(BASELINES)}), where its compression costs come from. The verdict names "
            "the winner and its margins, or says 'too close to call' when the runner-up is inside the "
            f"projection's error band (without one: less than {TIE_MARGIN:.0%} slower). "
            "Each row also says what it sends: achieved density (and its ratio to the target), energy vs "
            f"Top-k and where they come from: {quality.QUALITY_RULE}. The verdict weighs them: "
            f"{quality.CALL_RULE}; faster configurations it does not call are listed apart. Where the store holds "
            "a sidco converge run of the trace, the verdict ranks by time to accuracy instead and says so. "
            "With --parallel each row names the collective its compressor replaces and the time of every "
            "collective (total and exposed), and a compressor the plan cannot run is refused with the reason. "
            "--json prints {\"verdict\": {...}, \"rows\": [...], \"refused\": [...], \"headroom\": \"...\"}."
        ),
    )
    add_source_args(parser)
    parser.add_argument("--nodes", required=True, help="machines (an integer >= 1)")
    parser.add_argument("--bandwidth", required=True, help="NIC bandwidth per direction, e.g. 25Gbit or 1.25GB/s")
    parser.add_argument("--latency", default="50us", help="per-message latency, e.g. 50us (default 50us)")
    parser.add_argument("--compressors", default="all",
                        help="comma-separated compressor names, or all (default); none, fp16 and powersgd are "
                             "always added")
    parser.add_argument("--densities", default="0.1,0.01,0.001",
                        help="comma-separated densities for the sparsifiers (default 0.1,0.01,0.001)")
    parser.add_argument("--rank", default="1", help="PowerSGD's rank r, columns of P and Q per layer (default 1)")
    parser.add_argument("--topology", choices=TOPOLOGIES,
                        help="ring, halving-doubling, tree, ps or hierarchical (default: ring, or hierarchical "
                             "with --gpus-per-node above 1)")
    add_scenario_args(parser)
    add_parallel_args(parser)
    parser.set_defaults(func=run, fidelity="analytic")


def _number(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.4g}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f}"


def print_table(rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    """The ranked rows (times in ms) and the verdict line."""
    print(f"{'#':>2} {'config':<16} {'iter ms':>9} {'fwd ms':>9} {'bwd ms':>9} {'compr ms':>9} {'comm ms':>9} "
          f"{'idle ms':>9} {'opt ms':>9} {'vs none':>8} {'vs dense':>8} {'ach δ':>9} {'ach/tgt':>7} {'E/topk':>7}"
          "  costs from | quality from")
    for r in rows:
        vs_dense = "" if r["speedup_over_baseline"] is None else f"{r['speedup_over_baseline']:.3f}x"
        print(f"{r['rank']:>2} {r['label']:<16} {_ms(r['iteration_s'])} {_ms(r['forward_s'])} {_ms(r['backward_s'])} "
              f"{_ms(r['compress_s'])} {_ms(r['exposed_comm_s'])} {_ms(r['idle_s'])} {_ms(r['optimizer_s'])} "
              f"{r['speedup']:>7.3f}x {vs_dense:>8} {_number(r['achieved_density'], 9)} "
              f"{_number(r['achieved_over_target'], 7)} {_number(r['energy_vs_topk'], 7)}"
              f"  {r['cost_source'] or '-'} | {r['quality_source']}")
    print("ms per iteration: fwd/bwd compute, compr = compression on the critical path, comm = communication "
          "not hidden behind backward, idle, opt = optimizer; vs none / vs dense = speed-up (x) over none and over "
          "the best dense baseline; ach δ = achieved density (mean over replayed calls), ach/tgt = achieved / target "
          "density, E/topk = squared norm sent / that of exact Top-k at the same density (none, casts: 1; powersgd: "
          "its captured share)")
    print(f"verdict: {result['text']}")


def run(args: argparse.Namespace) -> int:
    """Project every pair, rank, print the table and the verdict (JSON with --json)."""
    names = compressor_names() if args.compressors.strip() == "all" else parse_list(args.compressors, str)
    request = comparison.with_baselines(
        Request(cluster(args), tuple(names), tuple(parse_list(args.densities, parse_density)), **workload_fields(args)))
    asked = projection.resolve(request)  # the device resolved once; bad input stops before any store is opened
    refused = comparison.split_refused(asked)[1]
    with Store(args.store) as store, tqdm(desc="quality", unit="call", file=sys.stderr, disable=None,
                                          leave=False) as bar:

        def progress(what: str, done: int, total: int) -> None:
            bar.set_description(what, refresh=False)
            bar.total = total
            bar.update(done - bar.n)

        asked, rows = comparison.compare(store, asked, progress=progress)
        result = judge(store, asked, rows)
    if args.json:
        print(dump_json({"verdict": result, "rows": rows, "refused": refused, "headroom": comparison.headroom(rows)}))
        return 0
    c = request.cluster
    print(f"{len(rows)} configurations on {c.nodes} nodes ({rows[0]['workers']} workers), {c.topology}, "
          f"{format_bandwidth(c.bandwidth_bps)}, {format_seconds(c.latency_s)} latency, fidelity {c.fidelity}"
          f"{'' if args.parallel == 'ddp' else ', --parallel ' + args.parallel}; "
          f"device {asked.source.device.name}: compute from {asked.source.compute}")
    print(f"workload: {projection.workload_text(rows[0])}")
    print(f"kernel costs: {KERNEL_BAND_NOTE}")
    print_table(rows, result)
    if args.parallel != "ddp":
        print_sharded(rows, refused)
    return 0


def print_sharded(rows: list[dict[str, Any]], refused: list[dict[str, Any]]) -> None:
    """What each row's compressor replaces, memory per GPU, what compression can touch and the
    configurations the ``--parallel`` refuses (one line each)."""
    for r in rows:
        fits = "" if r.get("fits") is None else (" (fits)" if r["fits"] else " (DOES NOT FIT)")
        print(f"  {r['label']:<16} replaces {r['collective']}; {r['memory_gib']:.1f} GiB per GPU{fits}")
    touch = comparison.headroom(rows)
    if touch:
        print(f"headroom: {touch}")
    for r in refused:
        print(f"refused: {r['label']}: {r['refused']}")
