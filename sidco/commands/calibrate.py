"""``sidco calibrate``: fit α, β and efficiency to measured collectives and store them."""

from __future__ import annotations

import argparse
import json

from pipeline import calibrate
from results.store import Store
from sidco.commands import add_store_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="fit α (s), β (s/byte) and link efficiency to measured collectives",
        description=(
            "Least-squares fit of the ring α–β forms (cost-model.md) to the collective times stored "
            "by 'sidco emulate collective': alpha_s is the per-message latency in seconds, "
            "beta_s_per_byte the seconds per byte at the slowest measured link, efficiency the "
            "fraction of the nominal link rate (bits/s) the collectives achieve. The result is "
            "stored in the calibrations table; the simulator uses it with --calibration."
        ),
    )
    add_store_argument(parser)
    parser.add_argument(
        "--emulation",
        type=int,
        action="append",
        help="use only the collective measurements of this emulation id (repeatable; default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print the fit as JSON on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Fit and store a calibration; print it."""
    with Store(args.store) as store:
        calibration_id, source, result = calibrate.run(store, args.emulation)
    if args.json:
        print(json.dumps({"calibration_id": calibration_id, **source}, sort_keys=True))
    else:
        print(
            f"calibration {calibration_id}: alpha = {result.alpha_s * 1e6:.1f} us, "
            f"beta = {result.beta_s_per_byte * 1e9:.2f} ns/byte at {result.reference_bandwidth_bps / 1e6:g} Mbit/s, "
            f"efficiency = {result.efficiency:.3f} ({result.points} points; fit error median "
            f"{result.median_abs_error_pct:.1f} %, max {result.max_abs_error_pct:.1f} %)"
        )
    return 0
