"""The ``sidco`` command line.

Each subcommand lives in its own module under :mod:`sidco.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
Bad input anywhere (``ValueError``, ``OSError``) ends in a one-line error and
exit code 2; set ``SIDCO_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys

from sidco import __version__

COMMANDS = (
    "bench",
    "profile",
    "capture",
    "replay",
    "simulate",
    "sweep",
    "emulate",
    "calibrate",
    "dashboard",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="sidco",
        description=(
            "Gradient-compression testbed built around SIDCo: capture gradient traces, "
            "replay them through real compressors, project iteration time on clusters "
            "you don't have, check projections on emulated links, explore in a dashboard."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"sidco {__version__}")
    # every subcommand's parser refuses abbreviated options (--device is never taken as --device-flops)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=functools.partial(argparse.ArgumentParser, allow_abbrev=False))
    for name in COMMANDS:
        module_name = f"sidco.commands.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sidco`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("sidco: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:
        if os.environ.get("SIDCO_DEBUG"):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"sidco {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
