"""``sidco profile``: measure a device's compression costs (and this host's numbers), or a model's
training step (``--model``), or check the cost model against every measured profile."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tqdm import tqdm

from pipeline import profile as device_profiles
from pipeline.catalog import DEFAULT_PRECISION, PRECISIONS, compressor_names, model_names
from pipeline.request import check_compressors
from results.store import Store
from sidco.commands import COMMANDS, add_run_on_argument, add_store_argument, dump_json
from units import format_seconds, parse_density, parse_list

DEFAULT_SIZES = {"cpu": "2^16..2^24", "cuda": "2^16..2^26"}


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated element counts (``65536``, ``2^20``) or ranges ``2^A..2^B``
    (every other power of two: 2^A, 2^(A+2), …, up to 2^B)."""
    sizes: list[int] = []
    for item in parse_list(text, str):
        span = re.fullmatch(r"2\^(\d+)\.\.2\^(\d+)", item)
        power = re.fullmatch(r"2\^(\d+)", item)
        if span:
            low, high = int(span[1]), int(span[2])
            if low > high or high > 34:
                raise ValueError(f"invalid size range {item!r}: give 2^A..2^B with A <= B <= 34")
            sizes += [1 << e for e in range(low, high + 1, 2)]
        elif power:
            sizes.append(1 << int(power[1]))
        elif item.isdigit() and int(item) >= 1:
            sizes.append(int(item))
        else:
            raise ValueError(f"invalid size {item!r}: give elements, 2^N or 2^A..2^B")
    return sorted(set(sizes))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``profile`` subcommand."""
    parser = subparsers.add_parser(
        "profile",
        help=COMMANDS["profile"],
        description=(
            "Measure every compressor at each density and size on --run-on (cpu or cuda) at steady state: "
            "each with the memory training gives it (error feedback; none for none, fp16, bf16), a rotation of "
            "seeded gradient-like vectors and output buffers (enough to fill twice the CPU's cache), "
            "--warmup untimed calls, then --repeats device-synchronised "
            "calls; rows keep the fastest, the median and the slowest (seconds). On cpu each size runs in a "
            "fresh process. "
            "On cpu the threads are pinned (--threads) and this host's numbers for the cost model (bandwidth, "
            "launch and sync latency, top-k/sort/gather rates) are measured first and kept for --run-on cpu. "
            "The profile goes into the results store (device_profiles) and, with --out, into a JSON file that "
            "--profile of simulate and sweep reads. --check measures nothing: it prints the cost model's error "
            "against every measured profile (shipped, stored, and --profile files) and against every row of the "
            "published GPU timings shipped in profiles/published-<gpu>.json (median and worst error per GPU). "
            "--model NAME|FILE measures no compressor: it builds that decoder-only transformer from its config in "
            "torch (random weights, synthetic tokens), times its training step (forward, backward, AdamW) at "
            "--batch-size, --tokens and --precision, and stores its throughput (samples/s, tokens/s); --out writes "
            "the step profile that --step-profile of simulate, compare, sweep and tta reads for compute."
        ),
        allow_abbrev=False,
    )
    add_run_on_argument(parser, "the measured compressors")
    parser.add_argument("--sizes", default=None,
                        help="elements per call: 65536,2^20 or 2^A..2^B for every other power of two "
                             f"(default {DEFAULT_SIZES['cpu']} on cpu, {DEFAULT_SIZES['cuda']} on cuda)")
    parser.add_argument("--compressors", default="all", help="comma-separated compressor names, or all (default)")
    parser.add_argument("--densities", default="0.01,0.001", help="comma-separated densities (default 0.01,0.001)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before timing (default 5)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per row (default 7)")
    parser.add_argument("--sessions", type=int, default=1,
                        help="measure every size this many times, one after the other, and keep per row the "
                             "session with the median compress time (default 1; the shipped CPU profile uses 3: "
                             "on a shared VM two sessions differ by a median 15 %% per row)")
    parser.add_argument("--threads", type=int, default=1,
                        help="cpu: torch/native threads, pinned to the first CPUs (default 1)")
    parser.add_argument("--out", metavar="FILE", help="also write the profile as JSON (the --profile format)")
    parser.add_argument("--check", action="store_true",
                        help="measure nothing; print the cost model's error against every measured profile")
    parser.add_argument("--profile", metavar="FILE", action="append", default=[],
                        help="--check: also check this profile file (repeatable)")
    model = parser.add_argument_group("a model's training step (--model)")
    model.add_argument("--model", metavar="NAME|FILE",
                       help="time this model's training step instead of compressors: a shipped model ("
                            + ", ".join(model_names()) + ") or the path of a Hugging Face config.json")
    model.add_argument("--batch-size", default=None,
                       help="--model: sequences per GPU per optimizer step (required; project with the same "
                            "--batch-size)")
    model.add_argument("--tokens", default=None,
                       help="--model: tokens per sequence (default 4096, at most the model's "
                            "max_position_embeddings)")
    model.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                       help="--model: fp32, tf32 (TF32 matmuls on a GPU; fp32 on a CPU) or amp (default: bf16 "
                            "autocast, fp16 on a GPU without bf16), AdamW on fp32 weights")
    model.add_argument("--parallel", default="ddp",
                       help="--model: the data parallelism whose share of one GPU is timed: ddp (default, the "
                            "whole model; its rate anchors compute under every --parallel of simulate and compare; "
                            "a sharded step is not measured yet)")
    model.add_argument("--layers", default=None,
                       help="--model: time this many layers (and the model without layers) and scale the layers' "
                            "time to the full depth (default: the whole model when it fits in memory, else the "
                            "most layers that fit)")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    add_store_argument(parser)
    parser.set_defaults(func=run)


def _names(text: str) -> list[str]:
    names = compressor_names() if text.strip() == "all" else parse_list(text, str)
    check_compressors(names)
    return names


def _measure(args: argparse.Namespace) -> int:
    kind = "cuda" if args.run_on.startswith("cuda") else "cpu"
    sizes = parse_sizes(args.sizes or DEFAULT_SIZES[kind])
    names = _names(args.compressors)
    densities = parse_list(args.densities, parse_density)
    total = args.sessions * len(sizes) * (sum(n == "none" for n in names)
                                          + len(densities) * sum(n != "none" for n in names))
    with Store(args.store) as store, tqdm(total=total, desc="profile", unit="row", file=sys.stderr,
                                          disable=None) as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        done = device_profiles.measure(store, args.run_on, sizes, names, densities, warmup=args.warmup,
                                       repeats=args.repeats, sessions=args.sessions, threads=args.threads,
                                       out=args.out, progress=progress,
                                       note=lambda text: print(text, file=sys.stderr))
    profile = done.profile
    if args.json:
        print(dump_json({"profile_id": done.profile_id, "device": profile.device, "source": profile.source,
                          "rows": list(profile.rows), "out": args.out}))
        return 0
    print(f"device profile #{done.profile_id} of {profile.device}: {profile.source}")
    print(f"{'compressor':<10} {'density':>8} {'elements':>10} {'compress min/med/max ms':>26} {'decompress ms':>14}")
    for r in profile.rows:
        spread = f"{r['compress_min_s'] * 1e3:.3f}/{r['compress_s'] * 1e3:.3f}/{r['compress_max_s'] * 1e3:.3f}"
        print(f"{r['compressor']:<10} {r['density']:>8g} {r['numel']:>10} {spread:>26} {r['decompress_s'] * 1e3:>14.3f}")
    print(f"stored in {args.store}" + (f"; written to {args.out}" if args.out else ""))
    return 0


def _check(args: argparse.Namespace) -> int:
    with Store(args.store) as store:
        report = device_profiles.check(store, args.profile)
    if args.json:
        print(dump_json(report))
        return 0
    if not report:
        print("no measured profiles: run sidco profile --run-on cpu (or cuda) first")
    goal = device_profiles.GOAL
    for item in report:
        print(f"{item['profile']}: {item['device']}" + (f" — skipped ({item['skipped']})" if "skipped" in item else ""))
        if "skipped" in item:
            continue
        print(f"  {'published' if item['kernels'] and not item['rows'] else 'measured'}: {item['source']}\n"
              f"  against:  {item['model']}")
        if item["rows"]:
            print(f"  {'compressor':<10} {'density':>8} {'elements':>10} {'measured ms':>12} {'model ms':>10} "
                  f"{'error':>8} {'decomp. error':>13}")
        for r in item["rows"]:
            print(f"  {r['compressor']:<10} {r['density']:>8g} {r['numel']:>10} {r['compress_s'] * 1e3:>12.3f} "
                  f"{r['model_compress_s'] * 1e3:>10.3f} {r['compress_error']:>+8.0%} {r['decompress_error']:>+13.0%}")
        if item["kernels"]:
            _print_kernels(item["kernels"], item["kernel_summary"])
        for name, worst in sorted(item["worst"].items()):
            flag = "ok" if worst["compress"] <= goal and worst["decompress"] <= goal else f"over {goal:.0%}"
            print(f"  worst at >= 2^20 elements: {name:<10} compress {worst['compress']:.0%}, "
                  f"decompress {worst['decompress']:.0%} ({flag})")
    print("kernel bands by kind (published GPU timings, each priced without its own harness's fit; "
          "docs/compression-costs.md):")
    for band in device_profiles.kernel_bands():
        count = len(band["harnesses"])
        rests = f"{band['rows']} rows, {count} harness{'es' if count != 1 else ''}" if band["rows"] else "no row: stated"
        print(f"  kind {band['kind']:<15} x{band['low']:.2f}-{band['high']:.2f} ({rests})")
    return 0


def _print_kernels(rows: list[dict], summary: dict) -> None:
    """The model against a profile's published kernel rows, one line each, then the goals."""
    print(f"  {'kernel':<7} {'elements':>11} {'bytes':>5} {'launches':>8} {'syncs':>5} {'published ms':>12} "
          f"{'model ms':>10} {'error':>7}")
    for r in rows:
        print(f"  {r['kernel']:<7} {r['numel']:>11} {r['element_bytes']:>5g} {r['launches']:>8} {r['syncs']:>5} "
              f"{r['seconds'] * 1e3:>12.4f} {r['model_s'] * 1e3:>10.4f} {r['error']:>+7.1%}")
    verdict = "ok" if summary["ok"] else (f"goal missed: median within {device_profiles.GOAL:.0%}, "
                                          f"every row within {device_profiles.KERNEL_FACTOR:g}x")
    print(f"  published kernel rows: {summary['rows']}, median |error| {summary['median']:.1%}, worst "
          f"{summary['worst']:.1%} (factor {summary['worst_factor']:.2f}) ({verdict})")


def _whole(text: str | None, flag: str) -> int | None:
    """``text`` of ``flag`` as a whole number (``None`` when not given); ValueError otherwise."""
    if text is None:
        return None
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"invalid {flag} {text!r}: give a whole number") from None


def _measure_step(args: argparse.Namespace) -> int:
    batch = _whole(args.batch_size, "--batch-size")
    if batch is None:
        raise ValueError("--model needs --batch-size: the sequences per GPU per optimizer step you will project")
    with Store(args.store) as store, tqdm(desc="profile", unit="step", file=sys.stderr, disable=None) as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        done = device_profiles.measure_step(store, args.run_on, args.model, batch_size=batch,
                                            tokens=_whole(args.tokens, "--tokens"), precision=args.precision,
                                            parallel=args.parallel, warmup=args.warmup, repeats=args.repeats,
                                            threads=args.threads, layers=_whole(args.layers, "--layers"),
                                            out=args.out, progress=progress,
                                            note=lambda text: print(text, file=sys.stderr))
    p = done.profile
    if args.json:
        print(dump_json({"step_profile_id": done.profile_id, **json.loads(p.to_json()), "out": args.out}))
        return 0
    print(f"step profile #{done.profile_id}: {p.model} on {p.device}, {p.parallel}, batch {p.batch_size} x "
          f"{p.tokens} tokens, {p.precision}")
    timed = "the whole model" if p.scale == 1 else (f"layers 0-{p.layers_timed - 1} of {p.layers} and the model "
                                                    f"without layers; the layers' time scaled x{p.scale:.4g} to "
                                                    f"{p.layers}")
    print(f"  timed          {timed}")
    print(f"  step           {format_seconds(p.step_s)} median of {p.repeats} "
          f"(fastest {format_seconds(p.step_min_s)}, slowest {format_seconds(p.step_max_s)})")
    print(f"  throughput     {p.samples_per_s:.4g} samples/s, {p.tokens_per_s:.4g} tokens/s")
    print(f"  source         {p.source}")
    print(f"stored in {args.store}" + (f"; written to {args.out}: project with --step-profile {args.out}"
                                       if args.out else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    """Measure a profile or a model's step, or (--check) compare the cost model with the measured ones."""
    if args.model is not None:
        if args.check:
            raise ValueError("--check measures nothing: give --check or --model, not both")
        if args.out and Path(args.out).is_dir():
            raise ValueError(f"--out {args.out} is a folder: give a file name")
        return _measure_step(args)
    if args.check:
        return _check(args)
    if args.warmup < 0 or args.repeats < 1 or args.sessions < 1:
        raise ValueError(f"--warmup must be >= 0, --repeats and --sessions >= 1, got {args.warmup}, {args.repeats} "
                         f"and {args.sessions}")
    if args.out and Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a folder: give a file name")
    return _measure(args)
