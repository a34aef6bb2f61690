"""A tiny real family of convergence runs for the DiLoCo time-to-target tests: the synchronous run
of the built-in transformer (compressor ``none``, inner AdamW) and DiLoCo runs of the same base
configuration, each trained by ``sidco converge`` in a few seconds on one CPU thread."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence

from sidco.cli import main

COMMON = ("--workload", "transformer", "--width", "0.125", "--workers", "2", "--batch-size", "2", "--iterations", "8",
          "--eval-every", "2", "--eval-samples", "8", "--data", "synthetic", "--threads", "1", "--optimizer", "adamw",
          "--lr", "3e-3")
"""The base configuration: 2 workers (sites) × 2 sequences of 64 tokens, 8 steps, held-out loss
every 2 (a variant's later ``--eval-every`` overrides it: DiLoCo evaluates at multiples of H)."""


def train(store: str, variants: Sequence[Sequence[str]], seeds: int = 2) -> dict[str, list[int]]:
    """Train the synchronous run and one DiLoCo run per ``variants`` entry (its ``--sync-every``
    and outer flags), ``seeds`` seeds each, into ``store``, torch's thread count restored after;
    the convergence ids per run (``"sync"`` and each variant's flags joined by spaces), one per seed."""
    import torch

    threads = torch.get_num_threads()
    ids = {}
    try:
        for name, extra in (("sync", ["--compressors", "none"]), *((" ".join(v), list(v)) for v in variants)):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(["converge", *COMMON, "--seeds", str(seeds), "--store", store, "--json", *extra]) == 0
            ids[name] = json.loads(out.getvalue())["convergence_ids"]
    finally:
        torch.set_num_threads(threads)
    return ids
