"""``sidco replay``: run a trace through compressors and store one row per compressor call
(parses the arguments, calls :func:`pipeline.replay.run`, prints the summary)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tqdm import tqdm

from pipeline.catalog import compressor_names
from pipeline import replay
from pipeline.replay import FIRST_CALLS, device_identity
from pipeline.request import takes_density
from results.store import Store
from sidco.commands import COMMANDS, add_renamed_argument, add_run_on_argument, add_store_argument, dump_json
from units import parse_bytes, parse_density, parse_list

DEFAULT_COMPRESSORS = "sidco-e,sidco-p,sidco-gp,topk,dgc"
DEFAULT_DENSITIES = "0.1,0.01,0.001"


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError("expected on or off")
    return text == "on"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``replay`` subcommand."""
    parser = subparsers.add_parser(
        "replay",
        help=COMMANDS["replay"],
        description=(
            "Run each compressor at each target density over every recorded (iteration, worker) "
            "of TRACE, in order, carrying error feedback across iterations per (worker, bucket). "
            "Per call it records achieved density and achieved/target, the threshold, SIDCo "
            "stages, compress and decompress time (seconds, device-synchronised), bytes on the "
            "wire (values + int32 indices) and the relative error ||g - g_hat|| / ||g||. Each "
            "(compressor, density) combination is written to the results store in one "
            "transaction; a rerun of the same replay skips the combinations already stored. "
            "fp16/bf16 send the dense gradient cast to 16 bits (density ignored); powersgd sends "
            "rank-r factors per layer of each bucket (--rank; density ignored). The backend "
            "column says what ran the calls (native C kernels, torch or cuda)."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="trace directory (see traces/FORMAT.md)")
    parser.add_argument(
        "--compressors", default=DEFAULT_COMPRESSORS,
        help=f"comma-separated compressor names, or all (every compressor but none; default {DEFAULT_COMPRESSORS})"
    )
    parser.add_argument(
        "--densities", default=DEFAULT_DENSITIES, help=f"comma-separated target densities in (0, 1] (default {DEFAULT_DENSITIES})"
    )
    add_run_on_argument(parser, "the compressors")
    parser.add_argument(
        "--rank", type=int, default=None,
        help="PowerSGD's rank r (columns of P and Q per layer; default 1); layer shapes come from the trace",
    )
    parser.add_argument(
        "--error-feedback", type=_on_off, default=True, metavar="on|off", help="carry the residual across iterations (default on)"
    )
    parser.add_argument(
        "--bucket-cap", metavar="SIZE",
        help="compress DDP buckets of this size (e.g. 25MiB of gradient, reverse layer order), as "
        "DistributedDataParallel(bucket_cap_mb=...); default: the whole model as one vector",
    )
    parser.add_argument(
        "--first-bucket", metavar="SIZE",
        help="cap of the first bucket, a size (default: --bucket-cap, as DDP with an explicit cap; "
        "DDP's own default is 1MiB first, 25MiB after)",
    )
    add_renamed_argument(parser, "--bucket-mb", "--bucket-cap SIZE (e.g. 25MiB)")
    add_renamed_argument(parser, "--first-bucket-mb", "--first-bucket SIZE (e.g. 1MiB)")
    parser.add_argument(
        "--threads", type=int, help="torch intra-op CPU threads (default: torch's choice; 1 is steadier on a busy machine)"
    )
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print {replay_id, summary, rows} as JSON on stdout")
    parser.set_defaults(func=run)


def parse_compressors(text: str) -> list[str]:
    """``--compressors``: comma-separated names, or ``all`` (every compressor but ``none``)."""
    if text.strip() == "all":
        return [n for n in compressor_names() if n != "none"]
    return parse_list(text, str)


def _print_table(summary: list[dict[str, Any]]) -> None:
    header = (
        f"{'compressor':<10} {'density':>8} {'calls':>6} {'achieved':>9} {'ach/tgt':>8} {'range':>13} "
        f"{'stages':>6} {'comp ms':>8} {'decomp ms':>9} {'GB/s':>7} {'wire kB':>9} {'wire/dense':>10} {'rel err':>8} "
        f"{'backend':<8} {'first':>6} {'steady':>6} {'steady range':>12}"
    )
    print(header)
    print("-" * len(header))
    shown: set[str] = set()
    for s in summary:
        if not takes_density(s["compressor"]):  # one row: its message ignores the density
            if s["compressor"] in shown:
                continue
            shown.add(s["compressor"])
            s = {**s, "density": None, "achieved_over_target": None, "min_over_target": None,
                 "first_mean_over_target": None, "steady_mean_over_target": None, "steady_low_over_target": None}
        stages = "-" if s["mean_stages"] is None else f"{s['mean_stages']:.2f}"
        gbps = "-" if s["throughput_gb_per_s"] is None else f"{s['throughput_gb_per_s']:.3f}"
        print(
            f"{s['compressor']:<10} {_density(s['density']):>8} {s['calls']:>6} {s['achieved_density']:>9.5f} "
            f"{_ratio(s['achieved_over_target']):>8} {_range(s['min_over_target'], s['max_over_target']):>13} {stages:>6} "
            f"{s['compress_s'] * 1e3:>8.3f} {s['decompress_s'] * 1e3:>9.3f} {gbps:>7} "
            f"{s['wire_bytes'] / 1e3:>9.1f} {s['wire_over_dense']:>10.4f} {s['rel_error']:>8.4f} "
            f"{s['backend'] or '-':<8} {_ratio(s['first_mean_over_target']):>6} {_ratio(s['steady_mean_over_target']):>6} "
            f"{_range(s['steady_low_over_target'], s['steady_high_over_target']):>12}"
        )
    print(
        "achieved = selected/numel; ach/tgt = achieved/target (range over calls); comp/decomp ms = mean "
        "milliseconds per call; GB/s = fp32 gradient GB compressed per second; wire kB = mean bytes "
        "on the wire per call / 1000; rel err = mean ||g - g_hat|| / ||g||; backend = what ran the calls "
        "(native = fused C kernels, torch, cuda); first = mean ach/tgt of each compressor instance's first "
        f"{FIRST_CALLS} calls, steady = mean (range) of its later calls; compressors whose message ignores "
        "the density (none, fp16, bf16, powersgd) get one row, density -"
    )


def _density(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _range(low: float | None, high: float | None) -> str:
    return "-" if low is None else f"{low:.2f}-{high:.2f}"


def run(args: argparse.Namespace) -> int:
    """Replay, storing each combination in one transaction; print the summary."""
    names = parse_compressors(args.compressors)
    densities = parse_list(args.densities, parse_density)
    bucket_bytes = first_bucket_bytes = None
    if args.first_bucket is not None and args.bucket_cap is None:
        raise ValueError("--first-bucket needs --bucket-cap")
    for flag, value in (("--bucket-cap", args.bucket_cap), ("--first-bucket", args.first_bucket)):
        if value is not None and not parse_bytes(value) > 0:
            raise ValueError(f"invalid {flag} {value}: must be > 0 bytes")
    if args.bucket_cap is not None:
        bucket_bytes = parse_bytes(args.bucket_cap)
        first_bucket_bytes = parse_bytes(args.first_bucket or args.bucket_cap)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"invalid --threads {args.threads}: must be >= 1")
    if args.rank is not None and args.rank < 1:
        raise ValueError(f"invalid --rank {args.rank}: must be >= 1")
    options = {"powersgd": {"rank": args.rank}} if args.rank is not None else {}
    trace = replay.check(args.trace, names, densities, device=args.run_on, bucket_bytes=bucket_bytes,
                          first_bucket_bytes=first_bucket_bytes, options=options)
    with Store(args.store) as store, tqdm(desc="replay", unit="call", file=sys.stderr, disable=None) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        done = replay.run(store, trace, names, densities, device=args.run_on, error_feedback=args.error_feedback,
                          bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                          options=options, threads=args.threads, progress=progress)
        rows = replay.stored_rows(store, done.replay_id, args.error_feedback, names, densities) if args.json else []
    if done.skipped:
        print(f"sidco replay: {done.skipped} combination(s) already stored in replay {done.replay_id}, skipped",
              file=sys.stderr)
    if args.json:
        print(dump_json({"replay_id": done.replay_id, "summary": done.summary, "rows": rows}))
    else:
        print(
            f"replay {done.replay_id} of {trace.path} ({trace.workers} workers x {len(trace.iterations)} iterations, "
            f"{done.calls // (trace.workers * len(trace.iterations))} bucket(s), error feedback "
            f"{'on' if args.error_feedback else 'off'}, {device_identity(args.run_on)}); store {args.store}"
        )
        _print_table(done.summary)
    return 0
