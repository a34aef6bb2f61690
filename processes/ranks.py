"""Start gloo ranks on this machine as real processes, forked from a fork server that has torch
imported (the DDP benchmark and the DDP tests).

``torch.multiprocessing.spawn`` starts each rank as a fresh interpreter that imports torch
(about 2 s of CPU per rank on the 2-core test machine, most of a small DDP run). The
``forkserver`` start method forks each rank instead from one clean server process (started
once per test session, never running torch work itself) that imported torch up front: the
ranks are the same separate processes on the same gloo process groups, started without the
import. The server keeps the environment and working directory of the moment it started, and
exits with the process that started it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "compressors"]
"""Modules the fork server imports once, before it forks any rank."""


def spawn(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` processes and wait for all; raises if any fails
    (as :func:`torch.multiprocessing.spawn` does)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
