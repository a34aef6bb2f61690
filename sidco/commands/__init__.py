"""One module per ``sidco`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse

from results.store import DEFAULT_PATH

COMMANDS: dict[str, str] = {
    "bench": "time each compressor's compress/decompress against a one-pass floor (torch.sum)",
    "profile": "measure compress/decompress times on a device (a device profile), or check the cost model",
    "capture": "train a built-in workload with simulated data parallelism and record a gradient trace",
    "replay": "replay a gradient trace through compressors and store per-call quality and overhead",
    "simulate": "project one training iteration on a simulated cluster",
    "compare": "rank every compressor x density on one cluster, with a verdict",
    "sweep": "simulate a grid of scenarios into the results store (resumable, local or Dask)",
    "converge": "train a built-in workload with compressed gradients; loss and held-out accuracy per iteration",
    "tta": "time to accuracy: which compressor reaches the target first on a cluster",
    "emulate": "real torch.distributed runs in network namespaces with shaped links",
    "calibrate": "fit α (s), β (s/byte) and link efficiency to measured collectives",
    "dashboard": "serve the what-if dashboard (Dash) over the results store",
    "paper": "the SIDCo paper's setting, projected with PyTorch 1.3's kernel costs and with today's",
}
"""Every subcommand and its one-line summary (``sidco --help`` lists these without importing
the command modules, so it never loads torch; each module's parser takes its ``help`` from here)."""


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """Add the ``--store`` option every command that reads or writes results shares."""
    parser.add_argument("--store", default=str(DEFAULT_PATH),
                        help="results store, SQLite file (default: %(default)s)")
