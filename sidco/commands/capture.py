"""``sidco capture``: train a built-in workload and record a gradient trace."""

from __future__ import annotations

import argparse
import sys

import torch
from tqdm import tqdm

from pipeline import capture
from results.store import Store
from sidco.commands import COMMANDS, add_run_on_argument, add_store_argument, dump_json
from pipeline.capture import check_data, check_request as check_capture_request
from pipeline.catalog import workload_names


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``capture`` subcommand."""
    parser = subparsers.add_parser(
        "capture",
        help=COMMANDS["capture"],
        description=(
            "Train a built-in workload (no download) for --iterations steps; each of --workers "
            "workers computes its gradient on its own data shard, the averaged gradient updates "
            "the model. Every --every-th iteration each worker's flattened gradient (float32) and "
            "the timings (forward, backward per layer, optimizer step; seconds) are written to the "
            "trace directory --out (format: traces/FORMAT.md), which is then registered in the "
            "results store."
        ),
    )
    parser.add_argument("--workload", required=True, choices=workload_names(), help="model and data to train")
    parser.add_argument("--workers", type=int, default=4, help="simulated data-parallel workers (default 4)")
    parser.add_argument("--iterations", type=int, default=200, help="training steps to run (default 200)")
    parser.add_argument("--every", type=int, default=10, help="record every N-th step: N, 2N, ... (default 10)")
    parser.add_argument("--out", required=True,
                        help="trace directory to create (a UTF-8 path in a writable folder; checked before training)")
    add_run_on_argument(parser, "training")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data (default 0)")
    parser.add_argument("--width", type=float, help="width multiplier of the model (default: the workload's CPU default)")
    parser.add_argument("--batch-size", type=int, help="samples per worker per step (default: the workload's)")
    parser.add_argument("--lr", type=float, help="SGD learning rate (default: the workload's)")
    parser.add_argument(
        "--threads", type=int, help="torch intra-op CPU threads (default: torch's choice; 1 is steadier on a busy machine)"
    )
    parser.add_argument("--data", metavar="synthetic|pydoc|PATH",
                        help="what to train on: synthetic, pydoc (text: the CPython documentation), a CIFAR-10 "
                             "python directory for resnet20/vgg16, a UTF-8 text file for lstm/transformer "
                             "(default: synthetic for images, pydoc for text; docs/usage.md)")
    parser.add_argument("--force", action="store_true", help="replace an existing trace at --out")
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the trace summary as JSON on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Capture the trace, register it, print a summary."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"invalid --threads {args.threads}: must be >= 1")
        torch.set_num_threads(args.threads)
    check_capture_request(
        args.workload, workers=args.workers, iterations=args.iterations, every=args.every, device=args.run_on,
        width=args.width, batch_size=args.batch_size, lr=args.lr, out=args.out, overwrite=args.force,
    )
    check_data(args.workload, args.data, args.seed)
    store = Store(args.store)  # a bad store fails here, before any training
    bar = tqdm(total=args.iterations, desc=f"capture {args.workload}", unit="it", file=sys.stderr, disable=None)

    def progress(iteration: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    try:
        with store:
            trace_id, trace = capture.run(
                store, args.workload, args.out, workers=args.workers, iterations=args.iterations, every=args.every,
                device=args.run_on, seed=args.seed, width=args.width, batch_size=args.batch_size, lr=args.lr,
                overwrite=args.force, progress=progress, data=args.data,
            )
    finally:
        bar.close()
    timings = trace.timings
    summary = {
        "trace_id": trace_id,
        "path": str(trace.path.resolve()),
        "workload": args.workload,
        "workers": trace.workers,
        "recorded_iterations": len(trace.iterations),
        "numel": trace.numel,
        "gradient_bytes": 4 * trace.numel,
        "forward_s": timings["forward_s"],
        "backward_s": timings["backward_total_s"],
        "optimizer_s": timings["optimizer_s"],
        "batch_size": timings["batch_size"],
        "loss_first": trace.manifest["loss"]["first"],
        "loss_last": trace.manifest["loss"]["last"],
    }
    if args.json:
        print(dump_json(summary))
    else:
        print(
            f"trace {trace_id}: {summary['path']}\n"
            f"  {trace.workers} workers x {len(trace.iterations)} recorded iterations, "
            f"{trace.numel:,} elements ({4 * trace.numel / 1e6:.2f} MB fp32) per gradient\n"
            f"  per worker step: forward {timings['forward_s'] * 1e3:.2f} ms, backward "
            f"{timings['backward_total_s'] * 1e3:.2f} ms, optimizer {timings['optimizer_s'] * 1e3:.2f} ms "
            f"(batch {timings['batch_size']} samples, {timings['device']})\n"
            f"  loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}"
        )
    return 0
