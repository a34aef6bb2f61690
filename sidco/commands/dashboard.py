"""``sidco dashboard``: serve the what-if dashboard over a results store."""

from __future__ import annotations

import argparse
import sys

from sidco.commands import COMMANDS, add_store_argument, dump_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``dashboard`` subcommand."""
    parser = subparsers.add_parser(
        "dashboard",
        help=COMMANDS["dashboard"],
        description=(
            "Serve the dashboard's six pages: What-if (projected iteration time in ms, speed-up ×, the "
            "verdict of sidco compare), Sweeps, Compressor quality, Timeline (one iteration), Time to "
            "accuracy and Validation (projections against emulated runs). "
            "Binds to 127.0.0.1 unless --host says otherwise and prints its address. Traces are "
            "chosen among those registered in the store. Ctrl-C or SIGTERM stops it (exit code 0)."
        ),
    )
    add_store_argument(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: %(default)s, this machine only)")
    parser.add_argument("--port", type=int, default=8050, help="TCP port, 1-65535 (default: %(default)s)")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, error overlay)")
    parser.add_argument("--json", action="store_true",
                        help="print {\"url\", \"store\"} as JSON on stdout before serving")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the app, print its address, serve until Ctrl-C or SIGTERM (a clean stop: exit code 0)."""
    if not 1 <= args.port <= 65535:
        raise ValueError(f"invalid port {args.port}: must be 1-65535")
    from dashboard import create_app

    app = create_app(args.store)
    url = f"http://{args.host}:{args.port}/"
    if args.json:
        print(dump_json({"url": url, "store": args.store}), flush=True)
    else:
        print(f"SIDCo dashboard at {url} (store: {args.store}); Ctrl-C stops it", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: reachable from other machines", file=sys.stderr)
    from sidco.cli import Terminated

    try:
        app.run(host=args.host, port=args.port, debug=args.debug)
    except (KeyboardInterrupt, Terminated):
        pass  # Ctrl-C or SIGTERM is how a dashboard is meant to stop
    print("SIDCo dashboard stopped", file=sys.stderr, flush=True)
    return 0
