"""Worker process of the collective micro-benchmark: times gloo all-reduce / all-gather.

Run by :func:`emulation.collectives.measure_collectives`; writes, per (op, nbytes), the
per-repeat start and end instants (``CLOCK_MONOTONIC`` seconds, shared by every process
on the machine, so the driver can take the collective's span from the last rank's start
to the last rank's end). For ``allgather`` ``nbytes`` is the size of the gathered output
(each rank contributes ``nbytes / world_size``), the convention of the α–β formula. The
all-gather goes through the same entry point as the compression hook's sparse exchange
(:func:`compressors.ddp.exchange.all_gather_flat`: one flat output buffer), so its fit
applies to the hook's all-gathers.

With ``--compute-load S`` every rank first computes for about ``S`` seconds (a fixed
amount of single-thread matrix work, sized at start-up) before each timed collective,
as a backward pass would, so collectives are timed under the CPU contention of training.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from compressors.ddp.exchange import all_gather_flat
from emulation.process_group import base_parser, finish, init_gloo

LOAD_SIZE = 128


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _matmuls_for(seconds: float) -> int:
    """How many LOAD_SIZE² matrix products take about ``seconds`` on this (busy) machine."""
    if seconds <= 0:
        return 0
    a = torch.rand(LOAD_SIZE, LOAD_SIZE)
    start, count = _now(), 0
    while _now() - start < 0.2:
        a @ a
        count += 1
    return max(1, round(count * seconds / (_now() - start)))


def _run_once(op: str, tensor: torch.Tensor, output: torch.Tensor, matmuls: int) -> tuple[float, float]:
    dist.barrier()
    a = torch.rand(LOAD_SIZE, LOAD_SIZE)
    for _ in range(matmuls):
        a @ a
    start = _now()
    if op == "allreduce":
        dist.all_reduce(tensor)
    else:
        all_gather_flat(output, tensor, None).wait()
    return start, _now()


def main() -> None:
    """Entry point: ``python -m emulation.collective_worker ... --ops allreduce --bytes 65536``."""
    parser = base_parser(__doc__)
    parser.add_argument("--ops", required=True, help="comma-separated: allreduce, allgather")
    parser.add_argument("--bytes", required=True, help="comma-separated sizes in bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--compute-load", type=float, default=0.0, help="seconds of compute before each op")
    args = parser.parse_args()
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - {"allreduce", "allgather"})
    if unknown:
        raise ValueError(f"unknown collective(s): {', '.join(unknown)}")
    sizes = [int(b) for b in args.bytes.split(",")]
    init_gloo(args)
    matmuls = _matmuls_for(args.compute_load)
    results = []
    for op in ops:
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            if op == "allgather":
                numel = max(1, numel // args.world_size)
            tensor = torch.ones(numel, dtype=torch.float32)
            output = torch.empty(numel * args.world_size, dtype=torch.float32)
            for _ in range(args.warmup):
                _run_once(op, tensor, output, matmuls)
            spans = [_run_once(op, tensor, output, matmuls) for _ in range(args.repeats)]
            results.append({"op": op, "nbytes": nbytes, "start": [s for s, _ in spans], "end": [e for _, e in spans]})
    finish(args, {"rank": args.rank, "matmuls": matmuls, "results": results})


if __name__ == "__main__":
    main()
