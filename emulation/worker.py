"""Worker process of an emulated training run: one rank of DistributedDataParallel on gloo.

Run by :func:`emulation.training.run_compressors`. Trains a built-in workload
(:mod:`traces.workloads`) with the compressor's DDP comm hook
(:func:`compressors.ddp.comm_hook`) and writes, as JSON: per-iteration wall times
(seconds; forward, backward incl. communication, optimizer step), and the hook's
per-bucket log (communication seconds, bytes) of the timed iterations.
With ``--record-dir`` every timed iteration is followed by a compute-only one (forward and
backward under ``DistributedDataParallel.no_sync``, no optimizer step) on every rank, which
rank 0 records (per-layer timings and gradients, :class:`traces.Recorder`; the optimizer time
is that of the timed iterations). Interleaving puts the trace's compute samples right beside
the measured iterations, under the same CPU contention and background load. Every rank also
times its own compute-only passes (``compute_passes``: forward and backward seconds), from
which the projection takes the median compute over all ranks and separates per-worker compute
variation from variation common to all ranks (:func:`emulation.projection.compute_model`). Each compute-only iteration ends
with a barrier, so that every timed iteration starts with the ranks aligned, as they are
after a synchronised step: rank 0's recording (copying the gradients, writing the file)
must not reach the other ranks' timed iteration as a wait in their first collective. It
also starts with one: a collective does not end on every rank at once (gloo's two-rank
all-gather finishes up to ~40 % of its transfer later on one rank), and the compute-only
forward's buffer broadcast would otherwise time the early rank's wait for the late one as
compute (at 10 Mbit/s it doubled the projected forward). Timed and compute-only forwards alike
begin with that broadcast, which each reports as ``broadcast_s`` (the forward's part before the
wrapped module's own forward): across a WAN it waits a round trip, and the compute-only passes
carry it into the compute model as the timed forwards have it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import compressors.ddp
import traces
import traces.workloads
from emulation.process_group import base_parser, finish, init_gloo


def _parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--compressor", required=True)
    parser.add_argument("--density", type=float, required=True)
    parser.add_argument("--iterations", type=int, required=True, help="timed iterations")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    parser.add_argument("--batch-size", type=int, required=True, help="samples per worker per step")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket cap in MiB (every bucket, the first included)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record-dir", type=Path, help="interleave compute-only iterations; rank 0 records them here")
    return parser


def _forward_backward(model: DistributedDataParallel, workload: Any, batches: Any,
                      module_start: list[float]) -> tuple[float, float, float, float]:
    """Run forward (with DDP's buffer broadcast, as in training) and backward on the next batch;
    returns the ``time.perf_counter`` readings (s) at the start, when the wrapped module's own
    forward began (``module_start``, set by :func:`_mark_module_start`: DDP's pre-forward, its
    buffer broadcast, lies before it), after forward and after backward."""
    inputs, targets = next(batches)
    # DDP broadcasts rank 0's buffers at the start of a forward when the previous forward was
    # synchronised, as every forward of real training is; the interleaved no_sync passes would
    # otherwise move that broadcast out of the timed forwards and into the compute-only ones.
    model.require_forward_param_sync = True
    start = time.perf_counter()
    loss = workload.loss(model(inputs), targets)
    forward_end = time.perf_counter()
    loss.backward()
    return start, module_start[0], forward_end, time.perf_counter()


def _mark_module_start(model: DistributedDataParallel) -> list[float]:
    """A one-element list that a forward pre-hook on ``model``'s wrapped module sets to
    ``time.perf_counter()`` (s) whenever its forward begins, after DDP's pre-forward."""
    mark = [0.0]

    def hook(module: Any, args: Any) -> None:
        mark[0] = time.perf_counter()

    model.module.register_forward_pre_hook(hook)
    return mark


def _compute_only(model: DistributedDataParallel, workload: Any, batches: Any, recorder: Any,
                  module_start: list[float]) -> dict[str, float]:
    """One forward/backward without gradient synchronisation; rank 0 records it. Starts and ends
    with a barrier (see the module docstring). Returns this rank's ``forward_s`` and ``backward_s``
    (s), and ``broadcast_s``: the part of ``forward_s`` before the wrapped module's forward (DDP's
    buffer broadcast, s)."""
    dist.barrier()
    with model.no_sync():
        start, compute_start, forward_end, backward_end = _forward_backward(model, workload, batches, module_start)
    if recorder is not None:
        recorder.capture()
        recorder.step()
    model.zero_grad(set_to_none=False)
    dist.barrier()
    return {"forward_s": forward_end - start, "backward_s": backward_end - forward_end,
            "broadcast_s": compute_start - start}


def _train(
    args: argparse.Namespace, model: DistributedDataParallel, workload: Any, batches: Any, recorder: Any
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Run the warm-up and timed iterations; returns the timed steps' phases (s; ``broadcast_s``:
    the part of ``forward_s`` before the wrapped module's forward, DDP's buffer broadcast) and, with
    ``--record-dir``, this rank's compute-only passes (s)."""
    optimizer = workload.optimizer(model)
    module_start = _mark_module_start(model)
    steps = []
    passes = []
    for index in range(args.warmup + args.iterations):
        start, compute_start, forward_end, backward_end = _forward_backward(model, workload, batches, module_start)
        if recorder is not None:
            with recorder.optimizer():
                optimizer.step()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        end = time.perf_counter()
        steps.append({
            "iteration_s": end - start,
            "forward_s": forward_end - start,
            "backward_s": backward_end - forward_end,
            "optimizer_s": end - backward_end,
            "broadcast_s": compute_start - start,
        })
        if args.record_dir is not None and index >= args.warmup:
            passes.append(_compute_only(model, workload, batches, recorder, module_start))
    return steps[args.warmup:], passes


def main() -> None:
    """Entry point: ``python -m emulation.worker ... --workload resnet20 --compressor topk``."""
    args = _parser().parse_args()
    init_gloo(args)
    torch.manual_seed(args.seed)
    workload = traces.workloads.build(args.workload, batch_size=args.batch_size, seed=args.seed)
    model = DistributedDataParallel(workload.model, bucket_cap_mb=args.bucket_cap_mb)
    state, hook = compressors.ddp.comm_hook(args.compressor, args.density)
    model.register_comm_hook(state, hook)
    batches = workload.batches(args.rank, args.world_size)
    recorder = None
    if args.record_dir is not None and args.rank == 0:
        recorder = traces.Recorder(
            model.module, args.record_dir, every=1, workers=1, batch_size=args.batch_size,
            workload=args.workload, extra={"source": "emulation", "world_size": args.world_size},
        )
    steps, passes = _train(args, model, workload, batches, recorder)
    if recorder is not None:
        recorder.close()
    buckets = [dict(entry) for entry in state.log if entry["iteration"] >= args.warmup]
    finish(args, {
        "rank": args.rank, "steps": steps, "buckets": buckets, "compute_passes": passes,
        "threads": torch.get_num_threads(),
    })


if __name__ == "__main__":
    main()
