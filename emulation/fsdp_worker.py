"""Worker process of an emulated FSDP2 run: one rank of ``torch.distributed.fsdp.fully_shard`` on gloo.

Run by :func:`emulation.fsdp.run_fsdp`. Builds a scaled-down model from a shipped config
(:func:`emulation.fsdp_plan.scaled`, :mod:`emulation.llm_model`; random weights, the same on every
rank), shards every transformer block and then the root with ``fully_shard`` on a device mesh of
the gloo ranks (``fsdp``: one ``shard`` dimension; ``hsdp``: ``replicate`` × ``shard``), and trains
it with AdamW on synthetic tokens (each rank its own). It writes, as JSON, per timed step: the wall
times (seconds: forward, backward with its collectives, optimizer step), the collectives the step
issued as torch's flight recorder logged them (gloo's own record of every collective it ran:
operation, process group, input and output sizes and dtypes; ``TORCH_FR_BUFFER_SIZE`` is set before
the process group starts), each assigned to the forward or backward it was issued in by its creation
time, and the bytes this rank's network interface sent (``/sys/class/net/IF/statistics/tx_bytes``,
headers included). After each timed step every rank also times, each between barriers (all ranks
at once, as in the step, so the ranks start the next step aligned), the terms the projection takes
(:mod:`emulation.fsdp_projection`), sampled beside the measured steps:

- ``compute_passes``: a forward and backward of an unsharded copy of the model (no collectives);
- ``host_passes``: a forward and backward of another copy under ``fully_shard`` on a one-rank mesh
  (a gloo group of this rank alone): every FSDP2 hook, copy-in, copy-out, gradient copy-in and
  sharded-gradient view of the step, with no data to exchange;
- ``copy_passes``: :data:`COPY_REPEATS` copies (``Tensor.copy_``) of a flat fp32 buffer of the
  largest unit's parameters, the memory-copy bandwidth FSDP2's copies run at on this host.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from emulation import llm_model
from emulation.fsdp_plan import MODES, check_mesh, scaled, units
from emulation.process_group import base_parser, finish, init_gloo

FR_BUFFER_ENTRIES = 100_000
"""Flight-recorder entries kept (every collective of a short run fits)."""
COPY_REPEATS = 8
"""Copies of the largest unit's parameters timed per copy pass."""


def _parser():
    parser = base_parser(__doc__)
    parser.add_argument("--model", required=True, help="shipped model name or config.json path")
    parser.add_argument("--parallel", choices=MODES, required=True)
    parser.add_argument("--shard-size", type=int, default=None, help="ranks per shard group (hsdp)")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--tokens", type=int, required=True, help="tokens per sequence")
    parser.add_argument("--batch-size", type=int, required=True, help="sequences per rank per step")
    parser.add_argument("--iterations", type=int, required=True, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _tx_bytes() -> int | None:
    """Bytes this namespace's gloo interface has sent, or ``None`` when it cannot be read."""
    path = Path("/sys/class/net") / os.environ.get("GLOO_SOCKET_IFNAME", "lo") / "statistics" / "tx_bytes"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _itemsize(dtypes: list[str]) -> int:
    """Bytes per element of the flight recorder's dtype name (``Float``, ``BFloat16``, ...)."""
    return torch.empty(0, dtype=getattr(torch, dtypes[0].lower())).element_size() if dtypes else 0


def _numel(sizes: list[list[int]]) -> int:
    total = 0
    for shape in sizes:
        count = 1
        for dim in shape:
            count *= dim
        total += count
    return total


def recorded(groups: dict[str, str]) -> list[dict[str, Any]]:
    """Every collective in the flight recorder: ``op`` (gloo's name, e.g. ``all_gather``),
    ``group`` (``groups[name]`` of its process group's name, e.g. the mesh dimension ``shard``; the
    name itself when not there), ``input_bytes``, ``output_bytes`` (bytes) and ``created_ns`` (when
    it was issued, ``time.time_ns`` clock)."""
    dump = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, False))
    out = []
    for e in dump.get("entries", []):
        out.append({
            "op": e["profiling_name"].split(":", 1)[-1],
            "group": groups.get(e["process_group"][0], e["process_group"][0]),
            "input_bytes": _numel(e["input_sizes"]) * _itemsize(e["input_dtypes"]),
            "output_bytes": _numel(e["output_sizes"]) * _itemsize(e["output_dtypes"]),
            "created_ns": int(e["time_created_ns"]),
        })
    return out


def _pass(model: torch.nn.Module, batch: torch.Tensor) -> dict[str, float]:
    """One forward and backward of ``model`` between barriers (s)."""
    dist.barrier()
    start = time.perf_counter()
    loss = model(batch)
    forward_end = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    model.zero_grad(set_to_none=True)
    dist.barrier()
    return {"forward_s": forward_end - start, "backward_s": end - forward_end}


def _copy_pass(source: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """:data:`COPY_REPEATS` copies of ``source`` into ``target`` between barriers: ``bytes``
    copied and ``seconds``."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(COPY_REPEATS):
        target.copy_(source)
    seconds = time.perf_counter() - start
    dist.barrier()
    return {"bytes": COPY_REPEATS * source.numel() * source.element_size(), "seconds": seconds}


def _sharded(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """``model`` with every transformer block and then the root under ``fully_shard`` on ``mesh``."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main() -> None:
    """Entry point: ``python -m emulation.fsdp_worker ... --model llama-3.2-1b --parallel hsdp``."""
    args = _parser().parse_args()
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(FR_BUFFER_ENTRIES)  # read when the process group starts
    init_gloo(args)
    replicas, shard = check_mesh(args.parallel, args.world_size, args.shard_size)
    config = scaled(args.model, args.layers, args.hidden, args.vocab, args.tokens)
    if args.parallel == "fsdp":
        mesh = init_device_mesh("cpu", (shard,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (replicas, shard), mesh_dim_names=("replicate", "shard"))
    alone = [dist.new_group([rank]) for rank in range(args.world_size)]  # every rank creates every group
    model = _sharded(llm_model.build(config, args.seed), mesh)
    local = llm_model.build(config, args.seed)
    solo = _sharded(llm_model.build(config, args.seed), DeviceMesh.from_group(alone[args.rank], "cpu"))
    largest = max(sum(math.prod(shape) for shape in shapes) for _, shapes in units(config))
    source, target = torch.randn(largest), torch.empty(largest)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps, passes, host, copies, windows = [], [], [], [], []
    for index in range(args.warmup + args.iterations):
        batch = llm_model.tokens(config, args.batch_size, args.tokens, args.seed * 7919 + index * 131 + args.rank)
        sent = _tx_bytes()
        marks = [time.time_ns()]
        start = time.perf_counter()
        loss = model(batch)
        forward_end = time.perf_counter()
        marks.append(time.time_ns())
        loss.backward()
        backward_end = time.perf_counter()
        marks.append(time.time_ns())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        marks.append(time.time_ns())
        after = _tx_bytes()
        sampled = _pass(local, batch), _pass(solo, batch), _copy_pass(source, target)  # warm-up steps warm them too
        if index < args.warmup:
            continue
        windows.append(marks)
        steps.append({"iteration_s": end - start, "forward_s": forward_end - start,
                      "backward_s": backward_end - forward_end, "optimizer_s": end - backward_end,
                      "tx_bytes": None if sent is None or after is None else after - sent})
        for kept, sample in zip((passes, host, copies), sampled):
            kept.append(sample)
    entries = recorded({mesh.get_group(dim).group_name: dim for dim in mesh.mesh_dim_names})
    for step, marks in zip(steps, windows):
        step["collectives"] = [
            {**{k: v for k, v in e.items() if k != "created_ns"},
             "phase": "forward" if e["created_ns"] < marks[1] else "backward" if e["created_ns"] < marks[2] else "optimizer"}
            for e in entries if marks[0] <= e["created_ns"] < marks[3]
        ]
    finish(args, {"rank": args.rank, "steps": steps, "compute_passes": passes, "host_passes": host,
                  "copy_passes": copies, "threads": torch.get_num_threads(),
                  "parameters": sum(p.numel() for p in local.parameters())})


if __name__ == "__main__":
    main()
