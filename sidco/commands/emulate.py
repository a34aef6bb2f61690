"""``sidco emulate``: real gloo runs on shaped links — collectives, or DDP training vs projection."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from tqdm import tqdm

from emulation.alphabeta import OPS
from emulation.collectives import measure_collectives
from emulation.network import require_emulation
from simulator.units import format_bandwidth, format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_list
from sidco.store import DEFAULT_PATH, Store


def _positive_int_list(text: str, what: str, minimum: int) -> list[int]:
    def parse(item: str) -> int:
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"invalid {what} {item!r}: give whole numbers, e.g. 2,4") from None
        if value < minimum:
            raise ValueError(f"invalid {what} {value}: must be >= {minimum}")
        return value

    return parse_list(text, parse)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``emulate`` subcommand."""
    parser = subparsers.add_parser(
        "emulate",
        help="real torch.distributed runs in network namespaces with shaped links",
        description=(
            "Run real gloo worker processes, one per network namespace, joined by a bridge, with "
            "every worker's uplink and downlink shaped (tc tbf) to --bandwidth. Needs root and "
            "iproute2 ('ip', 'tc'); --no-shaping runs the same on loopback. "
            "'sidco emulate collective' times all-reduce/all-gather (input for 'sidco calibrate'); "
            "'sidco emulate [train]' trains a built-in workload under DistributedDataParallel with each "
            "compressor's comm hook, and compares the measured iteration time with the simulator's "
            "projection of the same scenario. Every (workers, bandwidth) combination is run."
        ),
    )
    parser.add_argument("mode", nargs="?", choices=("train", "collective"), default="train",
                        help="what to run (default: train)")
    parser.add_argument("--workers", default="2", help="worker counts, comma-separated (e.g. 2,4)")
    parser.add_argument("--bandwidth", default="100Mbit",
                        help="per-worker link rates, comma-separated, with units (e.g. 50Mbit,1Gbit; bits/s)")
    parser.add_argument("--no-shaping", action="store_true",
                        help="run on loopback without namespaces or shaping (no root needed)")
    parser.add_argument("--store", default=str(DEFAULT_PATH), help="results store (SQLite file)")
    parser.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    collective = parser.add_argument_group("collective mode")
    collective.add_argument("--op", default="allreduce,allgather", help="collectives: allreduce, allgather")
    collective.add_argument("--bytes", default="64KB,1MB,16MB",
                            help="message sizes with units (bytes; all-gather: gathered output size)")
    collective.add_argument("--repeats", type=int, default=3, help="timed repeats per size (median reported)")
    train = parser.add_argument_group("train mode")
    train.add_argument("--workload", default="resnet20", help="built-in workload (traces.workloads)")
    train.add_argument("--compressors", default="none,topk,dgc,sidco-e", help="compressors, comma-separated")
    train.add_argument("--density", type=float, default=0.01, help="target density (fraction of elements sent)")
    train.add_argument("--iterations", type=int, default=30, help="timed iterations per compressor (after warm-up)")
    train.add_argument("--warmup", type=int, default=5, help="warm-up iterations excluded from the median")
    train.add_argument("--batch-size", type=int, default=16, help="samples per worker per iteration")
    train.add_argument("--calibration", default="latest",
                       help="calibration for the second projection: 'latest', a calibrations id, or 'none'")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen mode."""
    workers = _positive_int_list(args.workers, "worker count", 2)
    bandwidths: list[float | None] = [None] if args.no_shaping else parse_list(args.bandwidth, parse_bandwidth)
    if not args.no_shaping:
        require_emulation()
    if args.mode == "collective":
        return _run_collective(args, workers, bandwidths)
    from sidco.commands.emulate_train import run_train

    return run_train(args, workers, bandwidths)


def _run_collective(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    ops = parse_list(args.op, str)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}: choose from {', '.join(OPS)}")
    sizes = parse_list(args.bytes, parse_bytes)
    if args.repeats < 1:
        raise ValueError(f"invalid --repeats {args.repeats}: must be >= 1")
    config = {"ops": ops, "bytes": sizes, "workers": workers, "bandwidths_bps": bandwidths,
              "repeats": args.repeats, "shaping": not args.no_shaping}
    results: list[dict[str, Any]] = []
    with Store(args.store) as store:
        with store.transaction() as cur:
            cur.execute(
                "INSERT INTO emulations(created, kind, config_json, cores, status) VALUES(?, 'collective', ?, ?, 'running')",
                (time.time(), json.dumps(config, sort_keys=True), os.cpu_count() or 1),
            )
            emulation_id = int(cur.lastrowid)
        status = "failed"
        try:
            combos = [(p, b) for p in workers for b in bandwidths]
            for p, bandwidth in tqdm(combos, desc="collectives", unit="network", file=sys.stderr):
                rows = measure_collectives(p, bandwidth, ops, sizes, repeats=args.repeats)
                store.insert_many(
                    "collective_measurements",
                    [{"emulation_id": emulation_id, "op": r["op"], "workers": r["workers"], "nbytes": r["nbytes"],
                      "bandwidth_bps": r["bandwidth_bps"] or 0.0, "seconds": r["seconds"]} for r in rows],
                )
                results += rows
            status = "done"
        finally:
            store.set_status("emulations", emulation_id, status)
    if args.json:
        print(json.dumps({"emulation_id": emulation_id, "cores": os.cpu_count(), "measurements": results}))
    else:
        print(f"emulation {emulation_id} ({os.cpu_count()} cores):")
        print(f"{'op':<10} {'workers':>7} {'bandwidth':>14} {'size':>10} {'time':>10} {'algbw':>14}")
        for r in results:
            bw = format_bandwidth(r["bandwidth_bps"]) if r["bandwidth_bps"] else "loopback"
            algbw = format_bandwidth(r["nbytes"] * 8 / r["seconds"])
            print(f"{r['op']:<10} {r['workers']:>7} {bw:>14} {format_bytes(r['nbytes']):>10} "
                  f"{format_seconds(r['seconds']):>10} {algbw:>14}")
    return 0
