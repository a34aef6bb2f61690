"""Worker process of the collective micro-benchmark: times gloo all-reduce / all-gather.

Run by :func:`emulation.collectives.measure_collectives`; writes, per (op, nbytes), the
per-repeat wall times in seconds measured on this rank. For ``allgather`` ``nbytes`` is
the size of the gathered output (each rank contributes ``nbytes / world_size``), the
convention of the α–β all-gather formula.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from emulation.process_group import base_parser, finish, init_gloo


def _run_once(op: str, tensor: torch.Tensor, outputs: list[torch.Tensor]) -> float:
    dist.barrier()
    start = time.perf_counter()
    if op == "allreduce":
        dist.all_reduce(tensor)
    else:
        dist.all_gather(outputs, tensor)
    return time.perf_counter() - start


def main() -> None:
    """Entry point: ``python -m emulation.collective_worker ... --ops allreduce --bytes 65536``."""
    parser = base_parser(__doc__)
    parser.add_argument("--ops", required=True, help="comma-separated: allreduce, allgather")
    parser.add_argument("--bytes", required=True, help="comma-separated sizes in bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - {"allreduce", "allgather"})
    if unknown:
        raise ValueError(f"unknown collective(s): {', '.join(unknown)}")
    sizes = [int(b) for b in args.bytes.split(",")]
    init_gloo(args)
    results = []
    for op in ops:
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            if op == "allgather":
                numel = max(1, numel // args.world_size)
            tensor = torch.ones(numel, dtype=torch.float32)
            outputs = [torch.empty_like(tensor) for _ in range(args.world_size)]
            for _ in range(args.warmup):
                _run_once(op, tensor, outputs)
            times = [_run_once(op, tensor, outputs) for _ in range(args.repeats)]
            results.append({"op": op, "nbytes": nbytes, "seconds": times})
    finish(args, {"rank": args.rank, "results": results})


if __name__ == "__main__":
    main()
