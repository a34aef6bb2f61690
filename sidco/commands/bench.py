"""``sidco bench``: steady-state compress/decompress times of every compressor vs a one-pass floor."""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from pipeline import bench as benchmark
from pipeline.catalog import compressor_names
from sidco.commands import COMMANDS, add_run_on_argument
from units import parse_density, parse_list


def _densities(text: str) -> list[float]:
    try:
        return parse_list(text, parse_density)
    except ValueError as exc:
        raise ValueError(f"--densities: {exc}") from None


def _names(text: str) -> list[str]:
    if text.strip() == "all":
        return compressor_names()
    return parse_list(text, str)


def _stages(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"--stages must be comma-separated integers >= 1, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--stages must be comma-separated integers >= 1, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help=COMMANDS["bench"],
        description=(
            "Compress one seeded gradient-like vector (Laplace/Student-t mix) with every compressor "
            "at each density, in one process, at steady state: buffers reused, --warmup calls first, "
            "then the median of --repeats timed calls. The floor is the median time of torch.sum "
            "over the same vector, timed interleaved with each compressor. Times in milliseconds; "
            "'x floor' = compress_ms / floor_ms; 'vs topk' = topk's 'x floor' / this row's 'x floor' "
            "(speed-up over Top-k, each normalised by its own interleaved floor); the '(min)' columns "
            "use the fastest repeat of each instead of the median; 'backend' = what ran the calls "
            "(native = the fused C kernels, torch, cuda). The machine (CPU model and SIMD flags, or GPU) "
            "is printed above the table."
        ),
    )
    parser.add_argument("--size", type=int, default=26_214_400,
                        help="vector length in elements (default 26214400 = 100 MB of fp32)")
    parser.add_argument("--densities", default="0.1,0.01,0.001",
                        help="comma-separated target densities in (0, 1] (default 0.1,0.01,0.001)")
    add_run_on_argument(parser, "the compressors")
    parser.add_argument("--dtype", default="fp32", choices=sorted(benchmark.DTYPES), help="element type (default fp32)")
    parser.add_argument("--compressors", default=None,
                        help=f"'all' or a comma-separated subset of: {','.join(compressor_names())} (default all); "
                             "none, fp16, bf16 and powersgd run once at density 1")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per row; the median is reported (default 10)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per row before timing (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradient-like vector (default 0)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch and the native kernels (default: torch's default)")
    parser.add_argument("--clock", default="wall", choices=sorted(benchmark.CLOCKS),
                        help="wall: elapsed time (default); cpu: CPU time of this process, which leaves out "
                             "time other processes hold the cores on a shared machine (use with --threads 1)")
    parser.add_argument("--stages", default=None,
                        help="comma-separated fixed SIDCo stage counts, e.g. 1,2,3: each SIDCo variant runs once "
                             "per count, rows side by side; at most ⌈log₂(1/δ)⌉ stages at density δ (default: once, adaptive)")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list on stdout")
    parser.set_defaults(func=run)


def format_table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table (times in ms)."""
    header = ("compressor", "density", "compress ms", "decompress ms", "floor ms", "x floor", "vs topk",
              "x floor (min)", "vs topk (min)", "achieved/target", "stages", "backend")
    lines = [header]
    for r in rows:
        lines.append((
            r["compressor"], f"{r['density']:g}", f"{r['compress_ms']:.2f}", f"{r['decompress_ms']:.2f}",
            f"{r['floor_ms']:.2f}", f"{r['over_floor']:.2f}",
            "-" if r["speedup_vs_topk"] is None else f"{r['speedup_vs_topk']:.1f}",
            f"{r['over_floor_min']:.2f}",
            "-" if r["speedup_vs_topk_min"] is None else f"{r['speedup_vs_topk_min']:.1f}",
            f"{r['achieved_over_target']:.3f}", "-" if r["stages"] is None else str(r["stages"]),
            r["backend"] + (" (fell back to exact top-k)" if r.get("fallback") else ""),
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print the table (or JSON)."""
    names = _names(args.compressors) if args.compressors is not None else compressor_names()
    densities = _densities(args.densities)
    stages = _stages(args.stages)
    bound = [n for n in names if n in compressor_names() and benchmark.density_bound(n)]
    runs = sum(len(stages) if stages and n.startswith("sidco") else 1 for n in bound)
    total = len(names) - len(bound) + len(densities) * runs
    with tqdm(total=total, desc="bench", unit="row", file=sys.stderr, disable=None) as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        rows = benchmark.run(args.size, densities, device=args.run_on, names=names, repeats=args.repeats,
                             warmup=args.warmup, dtype=args.dtype, seed=args.seed, threads=args.threads,
                             progress=progress, clock=args.clock, stages=stages)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"{args.size:,} {args.dtype} elements on {rows[0]['device_identity']} ({rows[0]['threads']} CPU threads); "
              f"median of {args.repeats} after {args.warmup} warm-up calls; {args.clock} clock; "
              "floor = torch.sum over the same vector")
        print(format_table(rows))
    return 0
