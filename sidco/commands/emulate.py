"""``sidco emulate``: real gloo runs on shaped links — collectives, or DDP training vs projection
(parses the arguments, calls :mod:`pipeline.emulate`, prints the results)."""

from __future__ import annotations

import argparse
import os
import sys

from tqdm import tqdm

from pipeline import emulate
from pipeline.catalog import COLLECTIVES, FIDELITIES, JOB_BYTES
from pipeline.emulate import check_shaping, check_training_request, max_jobs
from results.store import Store
from sidco.commands import COMMANDS, add_calibration_argument, add_renamed_argument, add_store_argument, dump_json
from units import check_count, format_bandwidth, format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_density, parse_duration, parse_list


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
        --compressors none,topk,sidco-e,fp16,powersgd --densities 0.1 $OPTS
    sidco emulate --workers 4 --bandwidth 20Mbit \\
        --compressors none,topk,sidco-e,fp16,powersgd --densities 0.1,0.05 $OPTS
    sidco emulate --workers 8 --bandwidth 20Mbit --compressors none,topk --densities 0.1 $OPTS
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
  measured_s     mean iteration time of the real run (s; per rank, averaged over ranks)
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
        help=COMMANDS["emulate"],
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
    parser.add_argument("--cleanup", action="store_true",
                        help="only remove namespaces left by killed runs (sidco-<pid>-… whose process is gone) "
                             "and exit; every emulation also does this when it starts")
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    collective = parser.add_argument_group("collective mode")
    collective.add_argument("--op", default="allreduce,allgather", help="collectives: allreduce, allgather")
    collective.add_argument("--bytes", default="64KB,1MB,16MB",
                            help="message sizes with units (bytes; all-gather: gathered output size)")
    collective.add_argument("--repeats", type=int, default=3, help="timed repeats per size (their mean reported)")
    collective.add_argument("--compute-load", default="0s",
                            help="compute each rank does before every timed collective, as a duration "
                                 "(e.g. 50ms): times collectives under the CPU contention of training")
    train = parser.add_argument_group("train mode")
    train.add_argument("--workload", default="resnet20", help="built-in workload (traces.workloads)")
    train.add_argument("--compressors", default="none,topk,dgc,sidco-e", help="compressors, comma-separated")
    train.add_argument("--densities", default="0.01",
                       help="target densities, comma-separated (fraction of elements sent); compressors that ignore it "
                            "(none, fp16, bf16, powersgd) run once per network")
    train.add_argument("--iterations", type=int, default=30, help="timed iterations per compressor (after warm-up)")
    train.add_argument("--warmup", type=int, default=5, help="warm-up iterations excluded from the mean")
    train.add_argument("--batch-size", type=int, default=16, help="samples per worker per iteration")
    add_calibration_argument(parser, default="latest", group=train)
    add_renamed_argument(train, "--density", "--densities (a comma-separated list, as in every other command)")
    train.add_argument("--fidelity", default="analytic,des",
                       help="simulator fidelities that project every cell, comma-separated: analytic "
                            "(closed-form collectives), des (SimPy compute streams, link-level messages); "
                            "one row per fidelity")
    train.add_argument("--trace-dir", default=None,
                       help="where the traces recorded by rank 0 go (default: emulation-traces/ beside the store)")
    sharded = parser.add_argument_group(
        "train mode, sharded (--parallel fsdp|hsdp)",
        "Real FSDP2 (torch.distributed.fsdp.fully_shard) on gloo for --model scaled down (random weights, "
        "synthetic tokens): every transformer block one FSDP unit, the root another. Reports the measured "
        "iteration time and every collective of a step as torch's flight recorder logged it, beside the "
        "closed form from the model's tensors, and the sharded simulator's projection of the same run "
        "(per --fidelity, uncalibrated and with --calibration; gloo's reduce-scatter is priced as the "
        "all-reduce gloo runs for it). --batch-size is sequences per worker, --iterations and --warmup "
        "steps; --compressors and --densities do not apply.")
    sharded.add_argument("--parallel", choices=("ddp", "fsdp", "hsdp"), default="ddp",
                         help="ddp: DistributedDataParallel on --workload (default); fsdp: one shard group of all "
                              "workers; hsdp: a replicate x shard mesh")
    sharded.add_argument("--model", default=None, help="shipped model name or config.json path (fsdp, hsdp)")
    sharded.add_argument("--shard-size", type=int, default=None,
                         help="workers per shard group under hsdp (default: half of them)")
    sharded.add_argument("--layers", type=int, default=2, help="transformer blocks of the scaled-down model")
    sharded.add_argument("--hidden", type=int, default=64, help="model width of the scaled-down model (elements, "
                                                                "a multiple of 16)")
    sharded.add_argument("--vocab", type=int, default=512, help="vocabulary of the scaled-down model (tokens)")
    sharded.add_argument("--tokens", type=int, default=32, help="tokens per sequence")
    across = parser.add_argument_group("across sites (train mode)")
    across.add_argument("--sites", type=int, default=1,
                        help="split --workers over this many sites joined by one WAN link (default 1: no WAN; "
                             "the emulation joins 2); runs DiLoCo and every --compressors per step across them")
    across.add_argument("--wan-bandwidth", default="100Mbit", help="WAN rate between the sites, with units (bits/s)")
    across.add_argument("--wan-rtt", default="20ms",
                        help="WAN round trip, with units (half each way: tc netem, or the userspace delay line "
                             "where the kernel has no netem; 0s: a tbf alone)")
    across.add_argument("--sync-every", type=int, default=10, metavar="H",
                        help="DiLoCo inner steps between outer all-reduces of the pseudo-gradient (default 10)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen mode."""
    if args.cleanup:
        removed = emulate.cleanup()
        print(f"removed {len(removed)} stale namespace(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    workers = _positive_int_list(args.workers, "worker count", 2)
    most = max_jobs()
    if max(workers) > most:
        raise ValueError(f"--workers {max(workers)}: at most {most} emulated workers fit on this machine "
                         f"(one process each, 4 per core, ~{JOB_BYTES // 2**20} MiB each)")
    bandwidths: list[float | None] = [None] if args.no_shaping else parse_list(args.bandwidth, parse_bandwidth)
    for bandwidth in bandwidths:
        if bandwidth is not None:
            check_shaping(bandwidth)
    if args.sites < 1:
        raise ValueError(f"invalid --sites {args.sites}: must be >= 1")
    if args.sites > 1:
        if args.parallel != "ddp":
            raise ValueError(f"--sites {args.sites} runs DDP ranks: --parallel {args.parallel} across sites is not emulated")
        return _run_sites(args, workers, bandwidths)
    if args.mode == "train" and args.parallel != "ddp":
        _check_sharded(args, workers)
    if not args.no_shaping:
        emulate.require_shaping()
    if args.mode == "collective":
        return _run_collective(args, workers, bandwidths)
    if args.parallel != "ddp":
        return _run_sharded(args, workers, bandwidths)
    if args.model is not None:
        raise ValueError("--model trains under --parallel fsdp or hsdp; --parallel ddp trains --workload")
    return _run_train(args, workers, bandwidths)


def _run_sites(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    if args.mode != "train" or args.no_shaping or len(workers) != 1 or len(bandwidths) != 1:
        raise ValueError("--sites takes train mode, one --workers count and one --bandwidth (the sites' own links), "
                         "with shaping")
    wan_bps = parse_bandwidth(args.wan_bandwidth)
    wan_rtt = parse_duration(args.wan_rtt)
    emulate.check_sites(args.sites, workers[0], wan_bps, wan_rtt, args.sync_every)
    names = parse_list(args.compressors, str)
    density = _densities(args.densities)[0]
    check_training_request(args.workload, names, density, args.iterations, args.warmup, args.batch_size)
    emulate.require_shaping()
    calibration = emulate.parse_calibration(args.calibration)
    with Store(args.store) as store:
        resolved = emulate.resolve_calibration(store, calibration)
        rows = emulate.sites(store, workers[0], bandwidths[0], wan_bps, wan_rtt, args.workload, names, density,
                             sync_every=args.sync_every, iterations=args.iterations, warmup=args.warmup,
                             batch_size=args.batch_size, calibration=resolved, trace_root=args.trace_dir)
    if args.json:
        print(dump_json({"cores": os.cpu_count(), "results": rows}))
        return 0
    print(f"{args.workload} on {workers[0]} ranks in {args.sites} sites, WAN {format_bandwidth(wan_bps)} and "
          f"{format_seconds(wan_rtt)} round trip (delay: {rows[0]['wan_delay']}), {os.cpu_count()} cores, "
          "1 thread per worker")
    print(f"calibration: {resolved[0] if resolved[0] is not None else 'none'}")
    print(f"{'strategy':<9} {'compressor':<10} {'density':>7} {'H':>4} {'measured':>10} {'projected':>10} "
          f"{'error':>8} {'calib.':>10} {'error':>8} {'WAN':>6}")

    def seconds(value: float | None) -> str:
        return "-" if value is None else format_seconds(value)

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1f}%"

    for r in rows:
        density_text = "-" if r["density"] is None else f"{r['density']:g}"
        share = "-" if r["wan_share"] is None else f"{r['wan_share'] * 100:.0f}%"
        print(f"{r['strategy']:<9} {r['compressor']:<10} {density_text:>7} {r['sync_every']:>4} "
              f"{format_seconds(r['measured_s']):>10} {seconds(r['projected_s']):>10} {pct(r['error_pct']):>8} "
              f"{seconds(r['calibrated_s']):>10} {pct(r['calibrated_error_pct']):>8} {share:>6}")
    print("measured / projected: wall time per inner step (DiLoCo: a round of H inner steps and its outer step / H; "
          "per-step: the mean iteration, projected as DDP on the two ranks with the WAN their only link, a round "
          "trip per dependent step); calib.: projected with the calibration's fits on the WAN; "
          "WAN: the projected WAN transfers' share of the inner step")
    return 0


def _run_collective(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    ops = parse_list(args.op, str)
    for op in ops:
        if op not in COLLECTIVES:
            raise ValueError(f"unknown collective {op!r}: choose from {', '.join(COLLECTIVES)}")
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
        print(dump_json({"emulation_id": emulation_id, "cores": os.cpu_count(), "measurements": results}))
    else:
        print(f"emulation {emulation_id} ({os.cpu_count()} cores):")
        print(f"{'op':<10} {'workers':>7} {'bandwidth':>14} {'size':>10} {'time':>10} {'algbw':>14}")
        for r in results:
            bw = format_bandwidth(r["bandwidth_bps"]) if r["bandwidth_bps"] else "loopback"
            algbw = f"{r['nbytes'] * 8 / r['seconds'] / 1e6:.1f} Mbit/s"
            print(f"{r['op']:<10} {r['workers']:>7} {bw:>14} {format_bytes(r['nbytes']):>10} "
                  f"{format_seconds(r['seconds']):>10} {algbw:>14}")
    return 0


def _densities(text: str) -> list[float]:
    return parse_list(text, parse_density)


def _fidelities(text: str) -> list[str]:
    chosen = parse_list(text, str)
    unknown = [f for f in chosen if f not in FIDELITIES]
    if unknown or not chosen:
        raise ValueError(f"invalid --fidelity {text!r}: choose from {', '.join(FIDELITIES)}")
    return list(dict.fromkeys(chosen))


def _run_train(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    names = parse_list(args.compressors, str)
    densities = _densities(args.densities)
    fidelities = _fidelities(args.fidelity)
    for density in densities:
        check_training_request(args.workload, names, density, args.iterations, args.warmup, args.batch_size)
    calibration = emulate.parse_calibration(args.calibration)
    with Store(args.store) as store:
        resolved = emulate.resolve_calibration(store, calibration)
        calibration_id = resolved[0]
        cells = emulate.cells(workers, bandwidths, names, densities)
        with tqdm(total=len(cells), desc="emulations", unit="network", file=sys.stderr) as bar:
            emulation_id, out = emulate.train(
                store, workers, bandwidths, args.workload, names, densities, iterations=args.iterations,
                warmup=args.warmup, batch_size=args.batch_size, shaping=not args.no_shaping, calibration=resolved,
                fidelities=fidelities, trace_root=args.trace_dir, step=lambda: bar.update(1),
            )
    summary = emulate.summarize(out)
    if args.json:
        print(dump_json({"emulation_id": emulation_id, "cores": os.cpu_count(), "calibration_id": calibration_id,
                          "summary": summary, "results": out}))
        return 0
    print(f"emulation {emulation_id}: {args.workload}, {os.cpu_count()} cores, 1 thread per worker; "
          f"calibration: {calibration_id if calibration_id is not None else 'none'}")
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


def _check_sharded(args: argparse.Namespace, workers: list[int]) -> None:
    """Refuse a sharded request in one line before any namespace is built."""
    if args.model is None:
        raise ValueError(f"--parallel {args.parallel} needs --model (one of {', '.join(emulate.model_names())}, "
                         "or a config.json path)")
    emulate.check_model(args.model)
    for p in workers:
        emulate.check_fsdp_mesh(args.parallel, p, args.shard_size)
    emulate.scaled_model(args.model, args.layers, args.hidden, args.vocab, args.tokens)
    check_count(args.iterations, "--iterations")
    check_count(args.batch_size, "--batch-size")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")


def _run_sharded(args: argparse.Namespace, workers: list[int], bandwidths: list[float | None]) -> int:
    fidelities = _fidelities(args.fidelity)
    calibration = emulate.parse_calibration(args.calibration)
    with Store(args.store) as store, tqdm(total=len(workers) * len(bandwidths), desc="emulations", unit="network",
                                          file=sys.stderr) as bar:
        resolved = emulate.resolve_calibration(store, calibration)
        emulation_id, rows = emulate.fsdp(
            store, workers, bandwidths, args.model, args.parallel, shard_size=args.shard_size, layers=args.layers,
            hidden=args.hidden, vocab=args.vocab, tokens=args.tokens, batch_size=args.batch_size,
            iterations=args.iterations, warmup=args.warmup, calibration=resolved, fidelities=fidelities,
            step=lambda: bar.update(1))
    if args.json:
        print(dump_json({"emulation_id": emulation_id, "cores": os.cpu_count(), "calibration_id": resolved[0],
                         "results": rows}))
        return 0
    first = rows[0]
    print(f"emulation {emulation_id}: {args.model} scaled to {args.layers} layers x {args.hidden} wide "
          f"({first['parameters']:,} parameters, fp32) under {args.parallel}, {os.cpu_count()} cores, "
          "1 thread per worker")
    print(f"{'workers':>7} {'mesh':>6} {'bandwidth':>14} {'measured':>10} {'collective':<40} {'count':>5} "
          f"{'buffers':>10} {'ring sent':>10} {'closed form':>11}")
    for r in rows:
        bw = format_bandwidth(r["bandwidth_bps"]) if r["bandwidth_bps"] else "loopback"
        mesh = "x".join(str(n) for n in r["mesh"])
        for index, (label, t) in enumerate(r["totals"].items()):
            lead = (f"{r['workers']:>7} {mesh:>6} {bw:>14} {format_seconds(r['measured_s']):>10}" if index == 0
                    else " " * 41)
            print(f"{lead} {label:<40} {t['count']:>5} {format_bytes(t['buffer_bytes']):>10} "
                  f"{format_bytes(t['sent_bytes']):>10} {'equal' if r['match'] else 'DIFFERS':>11}")
        for q in r["projections"]:
            print(f"{'':>41} projected {format_seconds(q['projected_s'])} ({q['fidelity']}, "
                  f"{'calibrated' if q['calibrated'] else 'uncalibrated'}): error {q['error_pct']:+.1f} %; "
                  f"serial {format_seconds(q['serial_s'])} (host {format_seconds(q['host_s'])}): "
                  f"error {q['serial_error_pct']:+.1f} %, {q['serial_median_error_pct']:+.1f} % of the median step")
        if r["projections"]:
            print(f"{'':>41} the sharded model's collective buffers "
                  f"{'equal the measured ones' if r['model_buffers_match'] else 'DIFFER from the measured ones'}")
    return 0
