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
from simulator.units import format_bandwidth, format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_duration, parse_list
from sidco.commands import add_store_argument
from results.store import Store


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


EPILOG = """\
validation grid (where the network is the question):
  A cell is one (workers, bandwidth, compressor, density). It tests the network model only
  when the projected network share of its iteration is large (>= 30 %): slow links, large
  messages, more workers. The grid of BENCHMARKS.md (resnet20, batch 8 per worker):
    sidco emulate --workers 2 --bandwidth 10Mbit,20Mbit,50Mbit \\
        --compressors none,topk,sidco-e,fp16,powersgd --density 0.1 $OPTS
    sidco emulate --workers 4 --bandwidth 20Mbit \\
        --compressors none,topk,sidco-e,fp16,powersgd --density 0.1,0.05 $OPTS
    sidco emulate --workers 8 --bandwidth 20Mbit --compressors none,topk --density 0.1 $OPTS
  with OPTS='--batch-size 8 --iterations 6 --warmup 2 --fidelity analytic,des'. Sparse
  messages at 5-10 % of resnet20's 272,474 gradients are 109-218 kB per rank; dense ones
  1.09 MB (fp16: half). 8 workers is the most tried on 2 cores. Calibrate first:
  'sidco emulate collective --workers 2,4,8 --bandwidth 10Mbit,20Mbit,50Mbit,100Mbit',
  then 'sidco calibrate' (per-operation fits; --check ID compares with held-out runs).

shaping:
  tc tbf on every worker's uplink and downlink, burst of two full frames (3,028 bytes) at
  every rate: a message of m bytes is shaped to within 3,028/m (4.6 % at 64 KiB); queue of
  at least 2 MiB, so TCP loses nothing to the shaper.

fields of every train-mode row (stored in the validation table):
  measured_s     median iteration time of the real run (s; per rank, averaged over ranks)
  projected_s    the simulator's iteration time for the same cell (s)
  error_pct      (projected_s - measured_s) / measured_s x 100 (%)
  network_share  projected transfer time, exposed and hidden behind backward, / projected
                 iteration time (0..1; printed in %)
  fidelity       analytic (closed-form collectives) or des (SimPy, link-level messages)
  calibrated     1 when the projection applied the calibration (per-operation alpha and
                 efficiency), 0 when it used the nominal link rate and no latency
"""


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
            "projection of the same scenario. Every (workers, bandwidth, density) combination is run."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    train.add_argument("--density", default="0.01",
                       help="target densities, comma-separated (fraction of elements sent); compressors that ignore it "
                            "(none, fp16, bf16, powersgd) run once per network")
    train.add_argument("--iterations", type=int, default=30, help="timed iterations per compressor (after warm-up)")
    train.add_argument("--warmup", type=int, default=5, help="warm-up iterations excluded from the median")
    train.add_argument("--batch-size", type=int, default=16, help="samples per worker per iteration")
    train.add_argument("--calibration", default="latest",
                       help="calibration for the second projection: 'latest', a calibrations id, or 'none'")
    train.add_argument("--fidelity", default="analytic,des",
                       help="simulator fidelities that project every cell, comma-separated: analytic "
                            "(closed-form collectives), des (SimPy compute streams, link-level messages); "
                            "one row per fidelity")
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
    config = {"ops": ops, "bytes": sizes, "workers": workers, "bandwidths_bps": bandwidths,
              "repeats": args.repeats, "shaping": not args.no_shaping, "compute_load_s": load_s}
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
                rows = measure_collectives(p, bandwidth, ops, sizes, repeats=args.repeats, compute_load_s=load_s)
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
            algbw = f"{r['nbytes'] * 8 / r['seconds'] / 1e6:.1f} Mbit/s"
            print(f"{r['op']:<10} {r['workers']:>7} {bw:>14} {format_bytes(r['nbytes']):>10} "
                  f"{format_seconds(r['seconds']):>10} {algbw:>14}")
    return 0


def _calibration(store: Store, choice: str) -> tuple[int | None, Any]:
    """Resolve --calibration to ``(id, simulator.Calibration)`` or ``(None, None)``."""
    import simulator

    if choice == "none":
        return None, None
    if choice == "latest":
        calibration = simulator.Calibration.latest(store.path)
    else:
        try:
            wanted = int(choice)
        except ValueError:
            raise ValueError(f"invalid --calibration {choice!r}: give 'latest', 'none' or a calibration id") from None
        calibration = simulator.Calibration.load(store.path, wanted)
    if calibration is None:
        return None, None
    return calibration.calibration_id, calibration


def _validation_rows(
    emulation_id: int, workload: str, density: float, workers: int, bandwidth: float | None,
    measured: list[dict[str, Any]], calibration: tuple[int | None, Any], fidelities: list[str],
) -> list[dict[str, Any]]:
    """Project every measured run from its own trace with every fidelity, uncalibrated and
    (if any) calibrated."""
    from emulation.projection import network_share, project

    if bandwidth is None:
        return []
    variants = [(0, None)] + ([(1, calibration[1])] if calibration[1] is not None else [])
    keep = ("iteration_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "comm_s", "idle_s", "jitter")
    rows = []
    for fidelity in fidelities:
        for calibrated, constants in variants:
            for m in measured:
                name = m["compressor"]
                p = project(m["trace"], workers, bandwidth, [name], density, calibration=constants,
                            fidelity=fidelity, rank_passes=m.get("compute_passes"))[name]
                rows.append({
                    "emulation_id": emulation_id, "workload": workload, "compressor": name,
                    "density": density if _uses_density(name) else None, "workers": workers,
                    "bandwidth_bps": bandwidth, "measured_s": m["measured_s"], "projected_s": p["iteration_s"],
                    "error_pct": (p["iteration_s"] - m["measured_s"]) / m["measured_s"] * 100.0,
                    "calibrated": calibrated, "fidelity": fidelity, "network_share": network_share(p),
                    "detail_json": json.dumps({
                        "cores": os.cpu_count(), "trace": m["trace"],
                        "calibration_id": calibration[0] if calibrated else None,
                        "measured": m, "projected": {k: p.get(k) for k in keep},
                    }, sort_keys=True),
                })
    return rows


def _uses_density(name: str) -> bool:
    """Whether compressor ``name`` sends a share of the gradient that ``--density`` sets (the
    sparse ones); ``none``, the 16-bit casts and PowerSGD ignore it."""
    import compressors

    return name != "none" and compressors.message_kind(name) == "sparse"


def _densities(text: str) -> list[float]:
    def parse(item: str) -> float:
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"invalid density {item!r}: give fractions, e.g. 0.05,0.1") from None
        if not 0 < value <= 1:
            raise ValueError(f"density must be in (0, 1], got {value:g}")
        return value

    return parse_list(text, parse)


def _fidelities(text: str) -> list[str]:
    import simulator

    chosen = parse_list(text, str)
    unknown = [f for f in chosen if f not in simulator.FIDELITIES]
    if unknown or not chosen:
        raise ValueError(f"invalid --fidelity {text!r}: choose from {', '.join(simulator.FIDELITIES)}")
    return list(dict.fromkeys(chosen))


def _run_train(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    from pathlib import Path

    from emulation.training import check_request, run_training

    names = parse_list(args.compressors, str)
    densities = _densities(args.density)
    fidelities = _fidelities(args.fidelity)
    for density in densities:
        check_request(args.workload, names, density, args.iterations, args.warmup, args.batch_size)
    config = {"workload": args.workload, "compressors": names, "densities": densities, "workers": workers,
              "bandwidths_bps": bandwidths, "iterations": args.iterations, "warmup": args.warmup,
              "batch_size": args.batch_size, "shaping": not args.no_shaping, "threads_per_worker": 1,
              "fidelities": fidelities}
    out: list[dict[str, Any]] = []
    with Store(args.store) as store:
        calibration = _calibration(store, args.calibration)
        with store.transaction() as cur:
            cur.execute(
                "INSERT INTO emulations(created, kind, config_json, cores, status) VALUES(?, 'train', ?, ?, 'running')",
                (time.time(), json.dumps(config, sort_keys=True), os.cpu_count() or 1),
            )
            emulation_id = int(cur.lastrowid)
        trace_root = Path(args.trace_dir) if args.trace_dir else Path(args.store).parent / "emulation-traces"
        status = "failed"
        try:
            # compressors that ignore the density run with the first one only
            combos = [(p, b, d, [n for n in names if _uses_density(n) or i == 0])
                      for p in workers for b in bandwidths for i, d in enumerate(densities)]
            combos = [c for c in combos if c[3]]
            for p, bandwidth, density, run_names in tqdm(combos, desc="emulations", unit="network", file=sys.stderr):
                label = f"{int(bandwidth / 1e6)}mbit" if bandwidth else "loopback"
                measured = run_training(
                    p, bandwidth, args.workload, run_names, density, iterations=args.iterations,
                    warmup=args.warmup, batch_size=args.batch_size,
                    trace_dir=trace_root / f"{emulation_id}-{args.workload}-w{p}-{label}-d{density:g}",
                )
                for m in measured:
                    store.register_trace(m["trace"], json.loads((Path(m["trace"]) / "manifest.json").read_text()))
                rows = _validation_rows(emulation_id, args.workload, density, p, bandwidth, measured, calibration,
                                        fidelities)
                store.insert_many("validation", rows)
                if rows:
                    out += [{**{k: v for k, v in r.items() if k != "detail_json"}, "detail": json.loads(r["detail_json"])}
                            for r in rows]
                else:
                    out += [{"workers": p, "bandwidth_bps": None, "compressor": m["compressor"],
                             "density": density if _uses_density(m["compressor"]) else None,
                             "measured_s": m["measured_s"], "detail": {"measured": m}} for m in measured]
            status = "done"
        finally:
            store.set_status("emulations", emulation_id, status)
    summary = summarize(out)
    if args.json:
        print(json.dumps({"emulation_id": emulation_id, "cores": os.cpu_count(), "calibration_id": calibration[0],
                          "summary": summary, "results": out}))
        return 0
    print(f"emulation {emulation_id}: {args.workload}, {os.cpu_count()} cores, 1 thread per worker; "
          f"calibration: {calibration[0] if calibration[0] is not None else 'none'}")
    print(f"{'workers':>7} {'bandwidth':>14} {'compressor':<10} {'density':>7} {'measured':>10} {'projected':>10} "
          f"{'error':>8} {'network':>8} {'fidelity':>8} {'calib.':>6}")
    for r in out:
        bw = format_bandwidth(r["bandwidth_bps"]) if r.get("bandwidth_bps") else "loopback"
        density = "-" if r.get("density") is None else f"{r['density']:g}"
        if "projected_s" in r:
            print(f"{r['workers']:>7} {bw:>14} {r['compressor']:<10} {density:>7} {format_seconds(r['measured_s']):>10} "
                  f"{format_seconds(r['projected_s']):>10} {r['error_pct']:>+7.1f}% {r['network_share'] * 100:>7.1f}% "
                  f"{r['fidelity']:>8} {'yes' if r['calibrated'] else 'no':>6}")
        else:
            print(f"{r['workers']:>7} {bw:>14} {r['compressor']:<10} {density:>7} {format_seconds(r['measured_s']):>10} "
                  f"{'-':>10} {'-':>8} {'-':>8} {'-':>8} {'-':>6}")
    for label, value in summary.items():
        print(f"{label}: {value:.1f} %")
    return 0


NETWORK_HEAVY = 0.30  # network share of the iteration above which a cell tests the network model


def summarize(results: list[dict[str, Any]]) -> dict[str, float]:
    """Median and worst |error| (%) of the projections per fidelity, uncalibrated and calibrated,
    over every cell and over the cells whose network share is at least :data:`NETWORK_HEAVY`."""
    import statistics

    summary = {}
    for fidelity in dict.fromkeys(r["fidelity"] for r in results if "fidelity" in r):
        for calibrated, label in ((0, "uncalibrated"), (1, "calibrated")):
            rows = [r for r in results if r.get("fidelity") == fidelity and r.get("calibrated") == calibrated]
            for scope, chosen in (("all cells", rows),
                                  (f"network share >= {NETWORK_HEAVY:.0%}", [r for r in rows if r["network_share"] >= NETWORK_HEAVY])):
                errors = [abs(r["error_pct"]) for r in chosen]
                if errors:
                    summary[f"{fidelity} {label}, {scope}: median |error|"] = statistics.median(errors)
                    summary[f"{fidelity} {label}, {scope}: worst |error|"] = max(errors)
    return summary
