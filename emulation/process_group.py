"""Shared start-up of an emulation worker process: arguments, gloo process group, output."""

from __future__ import annotations

import argparse
import gc
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def base_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the arguments every worker gets from :func:`emulation.launch.run_workers`."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="where to write this rank's JSON result")
    parser.add_argument("--pg-timeout", type=float, default=120.0, help="process-group timeout (seconds)")
    return parser


def init_gloo(args: argparse.Namespace) -> None:
    """Join the gloo process group described by ``args``; one compute thread per process."""
    torch.set_num_threads(1)
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=args.pg_timeout),
    )


def finish(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Write ``result`` as this rank's JSON output, wait for every rank, leave the process group."""
    args.out.write_text(json.dumps(result))
    gc.collect()  # free the DDP reducers now: destroyed at interpreter exit they abort the process
    dist.barrier()
    dist.destroy_process_group()
