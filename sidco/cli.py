"""The ``sidco`` command line.

Each subcommand lives in its own module under :mod:`sidco.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
Bad input anywhere (``ValueError``, ``OSError``) ends in a one-line error and
exit code 2; set ``SIDCO_DEBUG=1`` to see the traceback instead. SIGTERM unwinds the
command (its ``finally`` blocks clean up) and ends in one line and exit code 143.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from typing import NoReturn

from sidco import __version__
from sidco.commands import COMMANDS


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``sidco CMD: error: …``) and exit code 2,
    and which never accepts abbreviated options (``allow_abbrev=False``); subcommand parsers
    are of the same class."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        text = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def build_parser(command: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """Return the top-level parser. Every subcommand is registered by its module, unless
    ``lazy``: then only ``command``'s module is imported and the others are listed by their
    summary alone (what ``sidco --help`` needs; their modules, and torch, stay unloaded)."""
    parser = OneLineParser(
        prog="sidco",
        description=(
            "Gradient-compression testbed built around SIDCo: capture gradient traces, "
            "replay them through real compressors, project iteration time on clusters "
            "you don't have, check projections on emulated links, explore in a dashboard."
        ),
    )
    parser.add_argument("--version", action="version", version=f"sidco {__version__}")
    # every subcommand's parser refuses abbreviated options (--device is never taken as --device-flops)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, summary in COMMANDS.items():
        if lazy and name != command:
            sub.add_parser(name, help=summary)
            continue
        module_name = f"sidco.commands.{name.replace('-', '_')}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(sub)
    return parser


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives, so ``finally`` blocks clean up."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"received signal {signum}")


def _catch_sigterm() -> object | None:
    """Turn SIGTERM into :class:`Terminated` (main thread only); return the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _is_termination(exc: BaseException) -> bool:
    """SIGTERM as raised by this module or by an active emulated network."""
    network = sys.modules.get("emulation.network")
    return isinstance(exc, Terminated) or (network is not None and isinstance(exc, network.Terminated))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sidco`` console script; returns the exit code."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words[0] if words else None, lazy=True)
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    previous = _catch_sigterm()
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
    except BaseException as exc:
        if not _is_termination(exc):
            raise
        print(f"sidco {args.command}: terminated by SIGTERM; what was running was stopped and cleaned up",
              file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
