"""One module per ``sidco`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse

from results.store import DEFAULT_PATH


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """Add the ``--store`` option every command that reads or writes results shares."""
    parser.add_argument("--store", default=str(DEFAULT_PATH),
                        help="results store, SQLite file (default: %(default)s)")
