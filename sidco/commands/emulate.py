"""``sidco emulate``: real gloo runs on shaped links — collectives, or DDP training vs projection
(parses the arguments, calls :mod:`pipeline.emulate`, prints the results)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tqdm import tqdm

from emulation.alphabeta import OPS
from emulation.network import require_emulation
from pipeline import emulate
from results.store import Store
from sidco.commands import add_store_argument
from simulator.units import format_bandwidth, format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_duration, parse_list


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
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    collective = parser.add_argument_group("collective mode")
    collective.add_argument("--op", default="allreduce,allgather", help="collectives: allreduce, allgather")
    collective.add_argument("--bytes", default="64KB,1MB,16MB",
                            help="message sizes with units (bytes; all-gather: gathered output size)")
    collective.add_argument("--repeats", type=int, default=3, help="timed repeats per size (median reported)")
    collective.add_argument("--compute-load", default="0s",
                            help="compute each rank does before every timed collective, as a duration "
                                 "(e.g. 50ms): times collectives under the CPU contention of training")
    train = parser.add_argument_group("train mode")
    train.add_argument("--workload", default="resnet20", help="built-in workload (traces.workloads)")
    train.add_argument("--compressors", default="none,topk,dgc,sidco-e", help="compressors, comma-separated")
    train.add_argument("--density", type=float, default=0.01, help="target density (fraction of elements sent)")
    train.add_argument("--iterations", type=int, default=30, help="timed iterations per compressor (after warm-up)")
    train.add_argument("--warmup", type=int, default=5, help="warm-up iterations excluded from the median")
    train.add_argument("--batch-size", type=int, default=16, help="samples per worker per iteration")
    train.add_argument("--calibration", default="latest",
                       help="calibration for the second projection: 'latest', a calibrations id, or 'none'")
    train.add_argument("--trace-dir", default=None,
                       help="where the traces recorded by rank 0 go (default: emulation-traces/ beside the store)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen mode."""
    workers = _positive_int_list(args.workers, "worker count", 2)
    bandwidths: list[float | None] = [None] if args.no_shaping else parse_list(args.bandwidth, parse_bandwidth)
    if not args.no_shaping:
        require_emulation()
    if args.mode == "collective":
        return _run_collective(args, workers, bandwidths)
    return _run_train(args, workers, bandwidths)


def _run_collective(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    ops = parse_list(args.op, str)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}: choose from {', '.join(OPS)}")
    sizes = parse_list(args.bytes, parse_bytes)
    if args.repeats < 1:
        raise ValueError(f"invalid --repeats {args.repeats}: must be >= 1")
    load_s = parse_duration(args.compute_load)
    with Store(args.store) as store, tqdm(total=len(workers) * len(bandwidths), desc="collectives", unit="network",
                                          file=sys.stderr) as bar:
        emulation_id, results = emulate.collectives(store, workers, bandwidths, ops, sizes, repeats=args.repeats,
                                                    compute_load_s=load_s, shaping=not args.no_shaping,
                                                    step=lambda: bar.update(1))
    if args.json:
        print(json.dumps({"emulation_id": emulation_id, "cores": os.cpu_count(), "measurements": results}))
    else:
        print(f"emulation {emulation_id} ({os.cpu_count()} cores):")
        print(f"{'op':<10} {'workers':>7} {'bandwidth':>14} {'size':>10} {'time':>10} {'algbw':>14}")
        for r in results:
            bw = format_bandwidth(r["bandwidth_bps"]) if r["bandwidth_bps"] else "loopback"
            algbw = f"{r['nbytes'] * 8 / r['seconds'] / 1e6:.1f} Mbit/s"
            print(f"{r['op']:<10} {r['workers']:>7} {bw:>14} {format_bytes(r['nbytes']):>10} "
                  f"{format_seconds(r['seconds']):>10} {algbw:>14}")
    return 0


def _run_train(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    from emulation.training import check_request

    names = parse_list(args.compressors, str)
    check_request(args.workload, names, args.density, args.iterations, args.warmup, args.batch_size)
    calibration: str | int = args.calibration
    if calibration not in ("latest", "none"):
        try:
            calibration = int(calibration)
        except ValueError:
            raise ValueError(f"invalid --calibration {calibration!r}: give 'latest', 'none' or a calibration id") from None
    with Store(args.store) as store:
        resolved = emulate.resolve_calibration(store, calibration)
        calibration_id = resolved[0]
        with tqdm(total=len(workers) * len(bandwidths), desc="emulations", unit="network", file=sys.stderr) as bar:
            emulation_id, out = emulate.train(
                store, workers, bandwidths, args.workload, names, args.density, iterations=args.iterations,
                warmup=args.warmup, batch_size=args.batch_size, shaping=not args.no_shaping, calibration=resolved,
                trace_root=args.trace_dir, step=lambda: bar.update(1),
            )
    summary = _summary(out)
    if args.json:
        print(json.dumps({"emulation_id": emulation_id, "cores": os.cpu_count(), "calibration_id": calibration_id,
                          "summary": summary, "results": out}))
        return 0
    print(f"emulation {emulation_id}: {args.workload}, density {args.density:g}, {os.cpu_count()} cores, "
          f"1 thread per worker; calibration: {calibration_id if calibration_id is not None else 'none'}")
    print(f"{'workers':>7} {'bandwidth':>14} {'compressor':<10} {'measured':>10} {'projected':>10} {'error':>8} {'calib.':>6}")
    for r in out:
        bw = format_bandwidth(r["bandwidth_bps"]) if r.get("bandwidth_bps") else "loopback"
        if "projected_s" in r:
            print(f"{r['workers']:>7} {bw:>14} {r['compressor']:<10} {format_seconds(r['measured_s']):>10} "
                  f"{format_seconds(r['projected_s']):>10} {r['error_pct']:>+7.1f}% {'yes' if r['calibrated'] else 'no':>6}")
        else:
            print(f"{r['workers']:>7} {bw:>14} {r['compressor']:<10} {format_seconds(r['measured_s']):>10} "
                  f"{'-':>10} {'-':>8} {'-':>6}")
    for label, value in summary.items():
        print(f"{label}: {value:.1f} %")
    return 0


def _summary(results: list[dict[str, Any]]) -> dict[str, float]:
    """Median |error| (%) of the projections, uncalibrated and calibrated."""
    import statistics

    summary = {}
    for calibrated, label in ((0, "median |error| uncalibrated"), (1, "median |error| calibrated")):
        errors = [abs(r["error_pct"]) for r in results if r.get("calibrated") == calibrated and "error_pct" in r]
        if errors:
            summary[label] = statistics.median(errors)
    return summary
