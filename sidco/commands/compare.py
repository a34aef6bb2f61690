"""``sidco compare``: every (compressor, density) of one scenario, ranked, with a verdict.

Maps the arguments to one :class:`pipeline.request.Request` and calls
:func:`pipeline.compare.compare` (the projection of ``sidco simulate``, once per pair, in one
process) and :func:`pipeline.verdict.judge` (whether to compress, with what, and what would settle it).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from tqdm import tqdm

from pipeline import compare as comparison
from pipeline import lowcomm
from pipeline import project as projection
from pipeline import quality
from pipeline.catalog import STRATEGIES, TOPOLOGIES, compressor_names
from pipeline.costs import KERNEL_BAND_NOTE
from pipeline.memory import capacity_gib
from pipeline.request import DEFAULT_FRAGMENTS, DEFAULT_SYNC_EVERY, LowComm, Request, sites_text
from pipeline.verdict import BASELINES, TIE_MARGIN, judge
from results.store import Store
from sidco.commands.simulate import (add_latency_args, add_parallel_args, add_scenario_args, add_source_args, cluster,
                                    workload_fields)
from units import Pair, format_bandwidth, format_seconds, parse_count, parse_density, parse_list
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
    add_latency_args(parser)
    parser.add_argument("--compressors", default="all",
                        help="comma-separated compressor names, or all (default); none, fp16 and powersgd are "
                             "always added. With --sites 2 or more, also the low-communication strategies "
                             "diloco (sync every --sync-every inner steps, blocking) and streaming (in --fragments "
                             "fragments, each overlapped with the next inner steps)")
    parser.add_argument("--densities", default="0.1,0.01,0.001",
                        help="comma-separated densities for the sparsifiers (default 0.1,0.01,0.001)")
    parser.add_argument("--rank", default="1", help="PowerSGD's rank r, columns of P and Q per layer (default 1)")
    parser.add_argument("--topology", choices=TOPOLOGIES,
                        help="ring, halving-doubling, tree, ps or hierarchical (default: ring, or hierarchical "
                             "with --gpus-per-node above 1)")
    parser.add_argument("--wide", action="store_true",
                        help=f"print every column (compute, idle and optimizer ms, achieved density, sources in full); "
                             f"the default table fits {WIDTH} columns")
    add_scenario_args(parser)
    add_parallel_args(parser)
    add_lowcomm_args(parser)
    parser.set_defaults(func=run, fidelity="analytic")


def add_lowcomm_args(parser: argparse.ArgumentParser) -> None:
    """How the strategies diloco and streaming sync (:class:`pipeline.request.LowComm`)."""
    group = parser.add_argument_group("low-communication strategies (diloco, streaming in --compressors)")
    group.add_argument("--sync-every", default=str(DEFAULT_SYNC_EVERY), metavar="H",
                       help=f"inner steps between outer syncs (default {DEFAULT_SYNC_EVERY}, DiLoCo's setting)")
    group.add_argument("--fragments", metavar="F",
                       help=f"streaming: fragments of whole layers synced in turn (default {DEFAULT_FRAGMENTS}, or the "
                            "layers when fewer; at most the layers)")
    group.add_argument("--outer-compressor", default="none", metavar="NAME",
                       help="the compressor of the pseudo-gradient's exchange across sites (default none: fp32)")
    group.add_argument("--outer-density", metavar="δ",
                       help="the outer compressor's density, for a sparsifier (e.g. 0.01)")


def lowcomm_request(args: argparse.Namespace) -> LowComm:
    """The strategies' settings from ``--sync-every``, ``--fragments``, ``--outer-compressor`` and
    ``--outer-density`` (their rules are the request's)."""
    return LowComm(parse_count(args.sync_every, "--sync-every"),
                   None if args.fragments is None else parse_count(args.fragments, "--fragments"),
                   args.outer_compressor.strip(),
                   None if args.outer_density is None else parse_density(args.outer_density))


WIDTH = 120
"""Columns the default output fits (``--wide`` prints every column, prose still wrapped at this width)."""


def _number(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.4g}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f}"


def say(text: str, indent: str = "") -> None:
    """``text`` wrapped at :data:`WIDTH` columns, continuation lines indented by ``indent``."""
    print(textwrap.fill(text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False))


def _sources(rows: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """Short keys (c1, c2, ...; q1, ...) for the rows' cost and quality sources, in order of appearance
    (``none`` compresses nothing: its cost source is ``-``)."""
    costs = {src: f"c{i + 1}" for i, src in enumerate(dict.fromkeys(r["cost_source"] for r in rows if r["cost_source"]))}
    qualities = {src: f"q{i + 1}" for i, src in enumerate(dict.fromkeys(r["quality_source"] for r in rows))}
    return costs, qualities


def memory_cell(row: dict[str, Any]) -> str:
    """``memory_gib`` in a 7-column cell, ``!`` after it when it does not fit in the device's memory
    (``-`` where it is not modelled)."""
    if row.get("memory_gib") is None:
        return f"{'-':>6} "
    return f"{row['memory_gib']:>6.1f}" + ("!" if row.get("fits") is False else " ")


def _replaces(row: dict[str, Any], wide: bool) -> str:
    """The collective ``row``'s compressor replaces: in full (``wide``), else its kind (``all-reduce``, …)."""
    collective = row.get("collective") or "-"
    return collective if wide else collective.split(" (")[0]


def print_table(rows: list[dict[str, Any]], result: dict[str, Any], wide: bool = False,
                memory: bool = False) -> None:
    """The ranked rows (times in ms) and the verdict: by default the columns that decide (iteration,
    compression and exposed communication, speed-ups, what each sends) with its cost and quality
    sources as keys listed below, in :data:`WIDTH` columns; ``wide``: every column, sources in full.
    ``memory`` (a model or a ``--parallel`` run): each row's memory per GPU (GiB, ``!`` when it does
    not fit) and the collective its compressor replaces (its kind, named in full below; ``wide``: in full)."""
    costs, qualities = _sources(rows)
    replaced = max((len(_replaces(r, wide)) for r in rows), default=0) if memory else 0
    width = max(16, *(len(r["label"]) for r in rows))
    head = f"{'#':>2} {'config':<{width}} {'iter ms':>9}"
    if wide:
        head += f" {'fwd ms':>9} {'bwd ms':>9}"
    head += f" {'compr ms':>9} {'comm ms':>9}"
    if wide:
        head += f" {'idle ms':>9} {'opt ms':>9}"
    head += f" {'vs none':>8} {'vs dense':>8}"
    if wide:
        head += f" {'ach δ':>9}"
    head += f" {'ach/tgt':>7} {'E/topk':>7}"
    if memory:
        head += f" {'mem GiB':>7} {'replaces':<{replaced}}"
    head += "  " + ("costs from | quality from" if wide else "from")
    print(head)
    for r in rows:
        vs_dense = "" if r["speedup_over_baseline"] is None else f"{r['speedup_over_baseline']:.3f}x"
        line = f"{r['rank']:>2} {r['label']:<{width}} {_ms(r['iteration_s'])}"
        if wide:
            line += f" {_ms(r['forward_s'])} {_ms(r['backward_s'])}"
        line += f" {_ms(r['compress_s'])} {_ms(r['exposed_comm_s'])}"
        if wide:
            line += f" {_ms(r['idle_s'])} {_ms(r['optimizer_s'])}"
        line += f" {r['speedup']:>7.3f}x {vs_dense:>8}"
        if wide:
            line += f" {_number(r['achieved_density'], 9)}"
        line += f" {_number(r['achieved_over_target'], 7)} {_number(r['energy_vs_topk'], 7)}"
        if memory:
            line += f" {memory_cell(r)} {_replaces(r, wide):<{replaced}}"
        line += "  "
        line += (f"{r['cost_source'] or '-'} | {r['quality_source']}" if wide
                 else f"{costs.get(r['cost_source'], '-'):<3} {qualities[r['quality_source']]}")
        print(line)
    if not wide:
        for keys, what in ((costs, "costs from"), (qualities, "quality from")):
            for source, key in keys.items():
                say(f"{key}: {what} {source}", " " * 4)
    say("ms per iteration: " + ("fwd/bwd compute, " if wide else "") + "compr = compression on the critical path, "
        "comm = communication not hidden behind backward" + (", idle, opt = optimizer" if wide else "") +
        "; vs none / vs dense = speed-up (x) over none and over the best dense baseline; "
        + ("ach δ = achieved density (mean over replayed calls), " if wide else "") +
        "ach/tgt = achieved / target density, E/topk = squared norm sent / that of exact Top-k at the same density "
        "(none, casts: 1; powersgd: its captured share)" + (_memory_legend(rows, wide) if memory else "")
        + ("" if wide else "; --wide: every column"))
    if any("utilization" in r for r in rows):
        print_strategies(rows, width)
    say(f"verdict: {result['text']}", " " * 2)


def memory_legend(rows: list[dict[str, Any]]) -> str:
    """What the ``mem GiB`` column (:func:`memory_cell`) of ``rows`` holds, against the device's memory."""
    room = capacity_gib(rows)
    return ("mem GiB = parameters, gradients, optimizer states, compressor state"
            + (" and activations" if any(r.get("activations_counted") for r in rows) else "")
            + " per GPU" + ("" if room is None else f" of {room:.1f} GiB, ! = does not fit"))


def _memory_legend(rows: list[dict[str, Any]], wide: bool) -> str:
    """What the ``mem GiB`` and ``replaces`` columns hold, each collective named in full when ``wide`` is not."""
    text = "; " + memory_legend(rows)
    if wide:
        return text + "; replaces = the collective the compressor replaces"
    kinds: dict[str, dict[str, None]] = {}
    for r in rows:
        if r.get("collective"):
            kinds.setdefault(_replaces(r, False), {})[r["collective"]] = None
    return text + "; replaces = the collective the compressor replaces: " + ", ".join(
        f"{kind} = {' or '.join(full)}" for kind, full in kinds.items())


def print_strategies(rows: list[dict[str, Any]], width: int) -> None:
    """How every row syncs across sites: H, fragments, the outer compressor, compute utilization
    and the WAN's exposed time per (inner) step."""
    print(f"{'#':>2} {'config':<{width}} {'sync_every':>10} {'fragments':>9} {'outer':>12} {'util':>6} "
          f"{'WAN ms':>9} {'hides at H':>10}")
    for r in rows:
        outer = "-" if r["outer_compressor"] is None else Pair(r["outer_compressor"], r["outer_density"]).label
        hides = r.get("hiding_sync_every")
        print(f"{r['rank']:>2} {r['label']:<{width}} {r['sync_every']:>10} {r['fragments']:>9} {outer:>12} "
              f"{r['utilization']:>6.1%} {_ms(r['wan_exposed_s'])} {'-' if hides is None else hides:>10}")
    say("sync_every = inner steps between syncs across sites (1: every step); util = compute (fwd, bwd, opt) / "
        "time per (inner) step; WAN ms = time per step the WAN adds to one site alone; hides at H = the smallest "
        "H whose inner steps hide the outer exchange (overlapped)")


def run(args: argparse.Namespace) -> int:
    """Project every pair, rank, print the table and the verdict (JSON with --json)."""
    names = compressor_names() if args.compressors.strip() == "all" else parse_list(args.compressors, str)
    strategies = tuple(n for n in names if n in STRATEGIES)
    names = [*comparison.ALWAYS, *(n for n in names if n not in STRATEGIES)]
    request = comparison.with_baselines(
        Request(cluster(args), tuple(names), tuple(parse_list(args.densities, parse_density)), strategies=strategies,
                lowcomm=lowcomm_request(args), **workload_fields(args)))
    asked = projection.resolve(request)  # the device resolved once; bad input stops before any store is opened
    refused = comparison.split_refused(asked)[1]
    lowcomm.strategies(asked)
    with Store(args.store) as store, tqdm(desc="quality", unit="call", file=sys.stderr, disable=None,
                                          leave=False) as bar:

        def progress(what: str, done: int, total: int) -> None:
            bar.set_description(what, refresh=False)
            bar.total = total
            bar.update(done - bar.n)

        asked, rows = comparison.compare(store, asked, progress=progress)
        result = judge(rows, store, asked)
        rows, result = lowcomm.with_strategies(store, asked, rows, result)
    if args.json:
        print(dump_json({"verdict": result, "rows": rows, "refused": refused, "headroom": comparison.headroom(rows)}))
        return 0
    c = request.cluster
    say(f"{len(rows)} configurations on {c.nodes} nodes ({rows[0]['workers']} workers), {c.topology}, "
        f"{format_bandwidth(c.bandwidth_bps)}, {format_seconds(c.latency_s)} one-way latency, fidelity {c.fidelity}"
        f"{sites_text(c)}{'' if args.parallel == 'ddp' else ', --parallel ' + args.parallel}; "
        f"device {asked.source.device.name}: compute from {asked.source.compute}", " " * 2)
    say(f"workload: {projection.workload_text(rows[0])}", " " * 2)
    say(f"kernel costs: {KERNEL_BAND_NOTE}", " " * 2)
    sharded = args.parallel != "ddp"
    print_table(rows, result, args.wide, memory=sharded or args.model is not None)
    if sharded:
        print_sharded(rows, refused)
    return 0


def print_sharded(rows: list[dict[str, Any]], refused: list[dict[str, Any]]) -> None:
    """What compression can touch and the configurations the ``--parallel`` refuses (one line each)."""
    touch = comparison.headroom(rows)
    if touch:
        say(f"headroom: {touch}", " " * 2)
    for r in refused:
        say(f"refused: {r['label']}: {r['refused']}", " " * 2)
