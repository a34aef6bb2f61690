"""``sidco converge``: train with compressed gradients and record loss and held-out accuracy."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from tqdm import tqdm

from pipeline import converge
from pipeline.capture import check_data
from pipeline.catalog import workload_names
from pipeline.converge import OPTIMIZERS, OUTER_LR, OUTER_MOMENTUM, RunConfig, curves_document
from pipeline.request import check_compressors, paired_rows, takes_density
from results.store import Store
from sidco.commands import COMMANDS, add_run_on_argument, add_store_argument, dump_json
from units import parse_density, parse_list


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``converge`` subcommand."""
    parser = subparsers.add_parser(
        "converge",
        help=COMMANDS["converge"],
        description=(
            "Real training of a built-in workload with --workers data-parallel workers simulated in one "
            "process: each worker computes its gradient on its own data shard and compresses it with its own "
            "error feedback, per DDP bucket; the update is the mean of the decompressed messages (what "
            "compressors.ddp.comm_hook computes under DistributedDataParallel). For each compressor and "
            "density: the training loss every iteration, the held-out loss and accuracy (fraction correct) "
            "every --eval-every iterations and at the last, on samples no worker trains on. Results go to the "
            "convergences / convergence_rows tables; a rerun of the same configuration trains only the "
            "(compressor, density) pairs not stored yet. The first pair trained records a gradient trace of "
            "the run (registered in the store) and the trace is replayed through the compressors, so "
            "'sidco tta' projects compute and compression costs from this same run. With --sync-every H > 1 "
            "the workers are DiLoCo sites instead (arXiv 2311.08105): each trains alone with the inner "
            "optimizer (AdamW by default) for H steps, then the pseudo-gradients (parameters at the last sync "
            "minus the site's) go through --outer-compressor with error feedback, and their mean takes an "
            "outer SGD step with Nesterov momentum; such a run stores its outer compressor's curve, records no "
            "trace, and 'sidco tta' reports its held-out loss penalty against the synchronous run of the same "
            "configuration (--sync-every 1, same --optimizer, compressor none) at equal tokens."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--workload", default="resnet20", choices=workload_names(),
                        help="model and data to train (default resnet20)")
    parser.add_argument("--workers", type=int, default=4, help="simulated data-parallel workers (default 4)")
    parser.add_argument("--iterations", type=int, default=300, help="training steps per compressor (default 300)")
    parser.add_argument("--eval-every", type=int, default=50,
                        help="evaluate the held-out loss and accuracy every N steps (default 50)")
    parser.add_argument("--compressors",
                        help="comma-separated compressor names; none trains once (default none,topk,sidco-e,dgc; "
                             "per-step exchange only: with --sync-every H > 1 use --outer-compressor)")
    parser.add_argument("--densities", help="comma-separated target densities in (0, 1] (default 0.01)")
    parser.add_argument("--width", type=float, help="width multiplier of the model (default: the workload's)")
    parser.add_argument("--batch-size", type=int, help="samples per worker per step (default: the workload's)")
    parser.add_argument("--lr", type=float,
                        help="(inner) learning rate (default: the workload's for sgd, DiLoCo's 4e-4 for adamw)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS,
                        help="(inner) optimizer: sgd (momentum 0.9) or adamw (DiLoCo's: weight decay 0.1, betas "
                             "0.9, 0.999). Default sgd with --sync-every 1, adamw above; train the synchronous "
                             "baseline of a DiLoCo run with --optimizer adamw --compressors none")
    parser.add_argument("--weight-decay", type=float, help="AdamW's weight decay (default 0.1, DiLoCo's)")
    diloco = parser.add_argument_group("DiLoCo (low-communication training across sites)")
    diloco.add_argument("--sync-every", type=int, default=1, metavar="H",
                        help="inner steps between outer steps; 1 (default) exchanges gradients every step as "
                             "before, above 1 trains DiLoCo (--iterations and --eval-every multiples of H)")
    diloco.add_argument("--outer-compressor", metavar="NAME",
                        help="compressor of the outer exchange of the pseudo-gradients, with error feedback for "
                             "those that train with one (every one but none, fp16, bf16; default none)")
    diloco.add_argument("--outer-density", type=parse_density, metavar="D",
                        help="density the outer compressor sends, in (0, 1] (default 0.01 for one that takes a "
                             "density)")
    diloco.add_argument("--outer-lr", type=float, help=f"outer SGD learning rate (default {OUTER_LR}, DiLoCo's)")
    diloco.add_argument("--outer-momentum", type=float,
                        help=f"outer Nesterov momentum in [0, 1), 0 for plain SGD (default {OUTER_MOMENTUM}, DiLoCo's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data (default 0)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="train every pair N times, with seeds --seed, --seed+1, ... (one stored run per seed; "
                             "sidco tta reports the mean and spread over them; default 1)")
    parser.add_argument("--data", metavar="synthetic|pydoc|PATH",
                        help="what to train on: synthetic (seeded class templates for images, a Markov chain for "
                             "text), pydoc (text: the CPython documentation shipped with Python, split by topic), a "
                             "CIFAR-10 python directory (data_batch_1..5, test_batch) for resnet20/vgg16, or a UTF-8 "
                             "text file for lstm/transformer (last 10%% of lines held out). Default: synthetic for "
                             "images, pydoc for text")
    parser.add_argument("--rank", type=int, default=1, help="PowerSGD's rank r (columns of P and Q; default 1)")
    parser.add_argument("--start-iter", type=int, default=2,
                        help="PowerSGD: steps of plain all-reduce before it compresses (>= 2; default 2)")
    parser.add_argument("--eval-samples", type=int, default=512, help="held-out samples per evaluation (default 512)")
    parser.add_argument("--trace-every", type=int,
                        help="record every N-th step of the first pair trained into the run's trace "
                             "(default: iterations // 5)")
    parser.add_argument("--no-replay", action="store_true",
                        help="do not replay the run's trace through the compressors (then run sidco replay on it "
                             "before sidco tta)")
    add_run_on_argument(parser, "training")
    parser.add_argument("--threads", type=int,
                        help="torch intra-op CPU threads (default: torch's choice; 1 is steadier on a busy machine)")
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true",
                        help='print the curves on stdout, the format sidco tta --curves reads: {"source", '
                             '"convergence_id", "convergence_ids" (one per seed), "trace_id", "replay_id", "rows": '
                             '[{compressor, density, iteration, loss, accuracy, eval_loss, seed}], "optimizer", "lr", '
                             '"diloco": {sync_every, outer_compressor, outer_density, outer_lr, outer_momentum} or '
                             "null} (losses in nats, accuracy a fraction, null where not evaluated; a DiLoCo run's "
                             "rows are its outer compressor's)")
    parser.set_defaults(func=run)


def _outer_args(args: argparse.Namespace) -> dict[str, Any]:
    """The DiLoCo fields of the command line; ``ValueError`` for outer settings without H > 1 or
    per-step compressors with it."""
    outer = {"outer_compressor": args.outer_compressor, "outer_density": args.outer_density,
             "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum}
    if args.sync_every is None or isinstance(args.sync_every, bool) or args.sync_every < 1:
        raise ValueError(f"invalid --sync-every {args.sync_every}: an integer >= 1")
    if args.sync_every == 1:
        given = [f"--{k.replace('_', '-')}" for k, v in outer.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set DiLoCo's outer step: add --sync-every H with H > 1")
        return {}
    if args.compressors is not None or args.densities is not None:
        raise ValueError("--compressors/--densities choose the per-step exchange; with --sync-every above 1 "
                         "choose the outer exchange with --outer-compressor and --outer-density")
    name = outer["outer_compressor"] or "none"
    check_compressors([name])
    density = outer["outer_density"]
    if density is None and takes_density(name):
        density = 0.01
    return {"sync_every": args.sync_every, "outer_compressor": name, "outer_density": density,
            "outer_lr": OUTER_LR if args.outer_lr is None else args.outer_lr,
            "outer_momentum": OUTER_MOMENTUM if args.outer_momentum is None else args.outer_momentum}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration of the command line (checked)."""
    outer = _outer_args(args)
    optimizer = args.optimizer or ("adamw" if outer else "sgd")
    config = RunConfig(workload=args.workload, workers=args.workers, iterations=args.iterations,
                       eval_every=args.eval_every, width=args.width, batch_size=args.batch_size, lr=args.lr,
                       seed=args.seed, eval_samples=args.eval_samples, device=args.run_on, data=args.data,
                       powersgd_rank=args.rank, powersgd_start_iter=args.start_iter, optimizer=optimizer,
                       weight_decay=args.weight_decay, **outer)
    config.check()
    if args.seeds < 1:
        raise ValueError(f"invalid --seeds {args.seeds}: must be >= 1")
    check_data(config.workload, config.data, config.seed)
    if args.width is not None and not args.width > 0:
        raise ValueError(f"invalid --width {args.width}: must be > 0")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"invalid --batch-size {args.batch_size}: must be >= 1")
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"invalid --lr {args.lr}: must be > 0")
    return config


def run(args: argparse.Namespace) -> int:
    """Train the missing pairs, store them, print the table (JSON with --json)."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"invalid --threads {args.threads}: must be >= 1")
        torch.set_num_threads(args.threads)
    config = config_from_args(args)
    if config.diloco:
        combinations = [converge.outer_pair(config)]
    else:
        combinations = converge.pairs(parse_list(args.compressors or "none,topk,sidco-e,dgc", str),
                                      parse_list(args.densities or "0.01", parse_density))
    bar = tqdm(total=len(combinations) * config.iterations * args.seeds, desc="converge", unit="it", file=sys.stderr,
               disable=None)

    def progress(label: str, done: int, total: int) -> None:
        if label == "replay":
            bar.set_description(f"replay {done}/{total} calls")
            return
        bar.update(1)
        bar.set_description(f"converge {label}")

    with Store(args.store) as store:
        try:
            results = converge.run_seeds(store, config, combinations, args.seeds, trace_every=args.trace_every,
                                         replay=not args.no_replay, progress=progress)
        finally:
            bar.close()
        result = results[0]
        skipped = sum(len(r.skipped) for r in results)
        if skipped:
            print(f"sidco converge: {skipped} (pair, seed) run(s) already stored in convergence "
                  f"{', '.join(str(r.convergence_id) for r in results)}, skipped", file=sys.stderr)
        wanted = set(combinations)
        rows, all_rows = [], []
        for offset, item in enumerate(results):
            for r in paired_rows(store.convergence_rows(item.convergence_id)):
                if (r["compressor"], r["density"]) in wanted:
                    row = {**r, "seed": config.seed + offset}
                    row.pop("convergence_id", None)
                    all_rows.append(row)
                    if offset == 0:
                        rows.append(row)
    if args.json:
        source = (f"sidco converge {config.workload} on {config.data_name()}, {config.workers} workers, convergence "
                  + ",".join(str(r.convergence_id) for r in results))
        fields = config.as_dict()
        outer = {key: fields[key] for key in ("sync_every", "outer_compressor", "outer_density", "outer_lr",
                                              "outer_momentum") if key in fields}
        print(dump_json({**curves_document(source, all_rows), "convergence_id": result.convergence_id,
                          "convergence_ids": [r.convergence_id for r in results], "trace_id": result.trace_id,
                          "replay_id": result.replay_id, "optimizer": fields["optimizer"], "lr": fields["lr"],
                          "diloco": outer or None}))
        return 0
    print(f"convergence {result.convergence_id}: {config.workload} on {config.data_name()}, {config.workers} workers, "
          f"{config.iterations} iterations, held-out evaluation every {config.eval_every}; store {args.store}")
    fields = config.as_dict()
    print(f"  inner optimizer {fields['optimizer']} at learning rate {fields['lr']:g}"
          + (f"; DiLoCo: {config.workers} sites, outer step every {config.sync_every} steps, outer "
             f"{converge.outer_pair(config).label} (memory: {fields['memory']}), outer SGD learning rate "
             f"{config.outer_lr:g}, Nesterov momentum {config.outer_momentum:g}" if config.diloco else ""))
    if len(results) > 1:
        print(f"  seeds {config.seed}..{config.seed + len(results) - 1}: convergence "
              f"{', '.join(str(r.convergence_id) for r in results)} (the table shows seed {config.seed})")
    if result.trace_id is not None:
        print(f"  trace #{result.trace_id} (gradients of this run)"
              + (f", replay #{result.replay_id}" if result.replay_id is not None else
                 " - not replayed: run 'sidco replay' on it before 'sidco tta'"))
    header = f"{'compressor':<10} {'density':>8} {'loss first':>10} {'loss last':>9} {'eval loss':>9} {'accuracy':>8}"
    print(header)
    print("-" * len(header))
    for compressor, density in combinations:
        items = [r for r in rows if (r["compressor"], r["density"]) == (compressor, density)]
        evaluated = [r for r in items if r["accuracy"] is not None]
        if not items:
            continue
        last = evaluated[-1] if evaluated else None
        shown = "-" if density is None else f"{density:g}"
        print(f"{compressor:<10} {shown:>8} {items[0]['loss']:>10.4f} {items[-1]['loss']:>9.4f} "
              f"{last['eval_loss'] if last else float('nan'):>9.4f} {last['accuracy'] if last else float('nan'):>8.4f}")
    print("loss = mean training loss of the workers (cross-entropy, nats); eval loss and accuracy (fraction "
          "correct) on held-out samples at the last iteration. Next: sidco tta --convergence "
          f"{result.convergence_id} --nodes 8 --bandwidth 1Gbit --target-accuracy A"
          + (" (reports the DiLoCo run's loss penalty against its synchronous run)" if config.diloco else ""))
    return 0
