"""``sidco replay``: run a trace through compressors and store one row per compressor call."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
from tqdm import tqdm

import traces
import traces.replay as trace_replay
from compressors.identity import device_identity
from sidco.commands import add_store_argument
from results.store import Store
from simulator.units import parse_density, parse_list

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
        help="replay a gradient trace through compressors and store per-call quality and overhead",
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
        "--compressors", default=DEFAULT_COMPRESSORS, help=f"comma-separated compressor names (default {DEFAULT_COMPRESSORS})"
    )
    parser.add_argument(
        "--densities", default=DEFAULT_DENSITIES, help=f"comma-separated target densities in (0, 1] (default {DEFAULT_DENSITIES})"
    )
    parser.add_argument("--device", default="cpu", help="torch device for the compressors: cpu, cuda (default cpu)")
    parser.add_argument(
        "--rank", type=int, default=None,
        help="PowerSGD's rank r (columns of P and Q per layer; default 1); layer shapes come from the trace",
    )
    parser.add_argument(
        "--error-feedback", type=_on_off, default=True, metavar="on|off", help="carry the residual across iterations (default on)"
    )
    parser.add_argument(
        "--bucket-mb",
        type=float,
        help="compress DDP-like buckets of this many MB (10^6 bytes of fp32 gradient, reverse layer order); "
        "default: the whole model as one vector",
    )
    parser.add_argument(
        "--threads", type=int, help="torch intra-op CPU threads (default: torch's choice; 1 is steadier on a busy machine)"
    )
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print {replay_id, summary, rows} as JSON on stdout")
    parser.set_defaults(func=run)


def _done(store: Store, replay_id: int, error_feedback: bool, expected: int) -> set[tuple[str, float]]:
    rows = store.query(
        "SELECT compressor, density, COUNT(*) AS n FROM replay_rows WHERE replay_id=? AND error_feedback=? "
        "GROUP BY compressor, density",
        (replay_id, int(error_feedback)),
    )
    return {(r["compressor"], float(r["density"])) for r in rows if r["n"] == expected}


def _write_combination(store: Store, replay_id: int, rows: list[dict[str, Any]]) -> None:
    """Write one combination's rows in one transaction, replacing any partial leftovers."""
    first = rows[0]
    columns = ["replay_id", *trace_replay.COLUMNS]
    sql = f"INSERT INTO replay_rows ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    with store.transaction() as cur:
        cur.execute(
            "DELETE FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?",
            (replay_id, first["compressor"], first["density"], first["error_feedback"]),
        )
        cur.executemany(sql, [(replay_id, *(row[c] for c in trace_replay.COLUMNS)) for row in rows])


def summarize(store: Store, replay_id: int, names: list[str], densities: list[float], error_feedback: bool) -> list[dict[str, Any]]:
    """Per (compressor, density) means over the stored rows: units in the key names."""
    summary = []
    for name in names:
        for density in densities:
            row = store.query(
                "SELECT COUNT(*) AS calls, SUM(numel) AS elements, AVG(achieved_density) AS achieved_density, "
                "AVG(achieved_over_target) AS achieved_over_target, MIN(achieved_over_target) AS min_over_target, "
                "MAX(achieved_over_target) AS max_over_target, AVG(stages) AS mean_stages, "
                "AVG(compress_s) AS compress_s, AVG(decompress_s) AS decompress_s, SUM(compress_s) AS total_compress_s, "
                "AVG(wire_bytes) AS wire_bytes, AVG(numel) AS numel, AVG(rel_error) AS rel_error, "
                "GROUP_CONCAT(DISTINCT backend) AS backend "
                "FROM replay_rows WHERE replay_id=? AND compressor=? AND density=? AND error_feedback=?",
                (replay_id, name, density, int(error_feedback)),
            )[0]
            if not row["calls"]:
                continue
            item = {"compressor": name, "density": density, **{k: row[k] for k in row.keys()}}
            item["wire_over_dense"] = row["wire_bytes"] / (4 * row["numel"])
            item["throughput_gb_per_s"] = 4 * row["elements"] / row["total_compress_s"] / 1e9 if row["total_compress_s"] else None
            summary.append(item)
    return summary


def _print_table(summary: list[dict[str, Any]]) -> None:
    header = (
        f"{'compressor':<10} {'density':>8} {'calls':>6} {'achieved':>9} {'ach/tgt':>8} {'range':>13} "
        f"{'stages':>6} {'comp ms':>8} {'decomp ms':>9} {'GB/s':>7} {'wire kB':>9} {'wire/dense':>10} {'rel err':>8} "
        f"{'backend':<8}"
    )
    print(header)
    print("-" * len(header))
    for s in summary:
        stages = "-" if s["mean_stages"] is None else f"{s['mean_stages']:.2f}"
        gbps = "-" if s["throughput_gb_per_s"] is None else f"{s['throughput_gb_per_s']:.3f}"
        print(
            f"{s['compressor']:<10} {s['density']:>8g} {s['calls']:>6} {s['achieved_density']:>9.5f} "
            f"{s['achieved_over_target']:>8.3f} {s['min_over_target']:>6.2f}-{s['max_over_target']:<6.2f} {stages:>6} "
            f"{s['compress_s'] * 1e3:>8.3f} {s['decompress_s'] * 1e3:>9.3f} {gbps:>7} "
            f"{s['wire_bytes'] / 1e3:>9.1f} {s['wire_over_dense']:>10.4f} {s['rel_error']:>8.4f} "
            f"{s['backend'] or '-':<8}"
        )
    print(
        "achieved = selected/numel; ach/tgt = achieved/target (range over calls); comp/decomp ms = mean "
        "milliseconds per call; GB/s = fp32 gradient GB compressed per second; wire kB = mean bytes "
        "on the wire per call / 1000; rel err = mean ||g - g_hat|| / ||g||; backend = what ran the calls "
        "(native = fused C kernels, torch, cuda)"
    )


def run(args: argparse.Namespace) -> int:
    """Replay, storing each combination in one transaction; print the summary."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"invalid --threads {args.threads}: must be >= 1")
        torch.set_num_threads(args.threads)
    names = parse_list(args.compressors, str)
    densities = parse_list(args.densities, parse_density)
    bucket_bytes = None
    if args.bucket_mb is not None:
        if not args.bucket_mb > 0:
            raise ValueError(f"invalid --bucket-mb {args.bucket_mb}: must be > 0")
        bucket_bytes = int(round(args.bucket_mb * 1e6))
    if args.rank is not None and args.rank < 1:
        raise ValueError(f"invalid --rank {args.rank}: must be >= 1")
    options = {"powersgd": {"rank": args.rank}} if args.rank is not None else {}
    trace = traces.open(args.trace)
    expected = trace_replay.calls_per_combination(trace, bucket_bytes)
    trace_replay.replay(trace, names, densities, device=args.device, bucket_bytes=bucket_bytes,
                        options=options)  # checks arguments
    config = {
        "trace_id": trace.manifest.get("trace_id"),
        "trace_path": str(trace.path.resolve()),
        "error_feedback": args.error_feedback,
        "bucket_bytes": bucket_bytes,
        "device": args.device,
        **({"rank": args.rank} if args.rank is not None else {}),
    }
    with Store(args.store) as store:
        trace_row = store.register_trace(trace.path, trace.manifest)
        replay_id, _ = store.get_or_create("replays", config, trace_id=trace_row, device=device_identity(args.device))
        done = _done(store, replay_id, args.error_feedback, expected)
        todo = [(n, d) for n in names for d in densities if (n, d) not in done]
        store.set_status("replays", replay_id, "running")
        rows_iter = trace_replay.replay(
            trace, names, densities, device=args.device, error_feedback=args.error_feedback,
            bucket_bytes=bucket_bytes, skip=frozenset(done), options=options,
        )
        skipped = len(names) * len(densities) - len(todo)
        if skipped:
            print(f"sidco replay: {skipped} combination(s) already stored in replay {replay_id}, skipped", file=sys.stderr)
        with tqdm(total=len(todo) * expected, desc="replay", unit="call", file=sys.stderr, disable=None) as bar:
            batch: list[dict[str, Any]] = []
            for row in rows_iter:
                batch.append(row)
                bar.update(1)
                if len(batch) == expected:
                    _write_combination(store, replay_id, batch)
                    batch = []
        store.set_status("replays", replay_id, "done")
        summary = summarize(store, replay_id, names, densities, args.error_feedback)
        if args.json:
            rows = [
                dict(r)
                for r in store.query(
                    "SELECT * FROM replay_rows WHERE replay_id=? AND error_feedback=? "
                    "ORDER BY compressor, density, iteration, worker, bucket",
                    (replay_id, int(args.error_feedback)),
                )
                if (r["compressor"], float(r["density"])) in {(n, d) for n in names for d in densities}
            ]
            print(json.dumps({"replay_id": replay_id, "summary": summary, "rows": rows}, sort_keys=True))
        else:
            print(
                f"replay {replay_id} of {trace.path} ({trace.workers} workers x {len(trace.iterations)} iterations, "
                f"{expected // (trace.workers * len(trace.iterations))} bucket(s), error feedback "
                f"{'on' if args.error_feedback else 'off'}, {device_identity(args.device)}); store {args.store}"
            )
            _print_table(summary)
    return 0
