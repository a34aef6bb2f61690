"""``sidco calibrate``: fit α, β and efficiency to measured collectives and store them."""

from __future__ import annotations

import argparse

from pipeline import calibrate
from results.store import Store
from sidco.commands import COMMANDS, add_store_argument, dump_json
from units import format_bandwidth, format_bytes, format_seconds


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help=COMMANDS["calibrate"],
        description=(
            "Least-squares fit of the ring α–β forms (docs/model.md) to the collective times stored "
            "by 'sidco emulate collective': alpha_s is the per-message latency in seconds, "
            "beta_s_per_byte the seconds per byte at the slowest measured link, efficiency the "
            "fraction of the nominal link rate (bits/s) the collectives achieve. One fit pools every "
            "operation and each operation measured at two or more sizes gets its own alpha and "
            "efficiency (the simulator applies all-reduce's to all-reduces, all-gather's to "
            "all-gathers); the fit error printed per operation is the median |relative residual| "
            "of the fit over its own measurements. Stored in the calibrations table (one row per "
            "operation, op NULL for the pooled fit); the simulator uses it with --calibration."
        ),
    )
    add_store_argument(parser)
    parser.add_argument(
        "--emulation",
        type=int,
        action="append",
        help="use only the collective measurements of this emulation id (repeatable; default: all)",
    )
    parser.add_argument(
        "--check",
        type=int,
        action="append",
        help="hold out this emulation's collective measurements (repeatable): they are not fitted, and "
             "each is printed beside the simulator's time for it without and with the new calibration",
    )
    parser.add_argument("--json", action="store_true", help="print the fit as JSON on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Fit and store a calibration (pooled and per operation); print it."""
    with Store(args.store) as store:
        result = calibrate.run(store, args.emulation, args.check or ())
    pooled, per_op, check = result.pooled, result.per_op, result.check
    if args.json:
        print(dump_json({"calibration_id": result.calibration_id, "emulation_ids": result.emulation_ids,
                          **pooled.as_dict(), "ops": {op: f.as_dict() for op, f in per_op.items()}, "check": check}))
        return 0
    print(f"calibration {result.calibration_id} (collective measurements of emulations "
          f"{', '.join(map(str, result.emulation_ids))}):")
    print(f"{'op':<12} {'alpha':>10} {'efficiency':>10} {'points':>6} {'fit error median':>17} {'max':>8}")
    for op, fitted in [("all ops", pooled), *per_op.items()]:
        print(f"{op:<12} {fitted.alpha_s * 1e6:>7.1f} us {fitted.efficiency:>10.3f} {fitted.points:>6} "
              f"{fitted.median_abs_error_pct:>15.1f} % {fitted.max_abs_error_pct:>6.1f} %")
    print(f"beta (all ops) = {pooled.beta_s_per_byte * 1e9:.2f} ns/byte at {pooled.reference_bandwidth_bps / 1e6:g} Mbit/s")
    if check:
        print(f"held-out measurements (emulations {', '.join(map(str, sorted(set(args.check))))}), analytic ring model:")
        print(f"{'op':<10} {'workers':>7} {'bandwidth':>14} {'size':>10} {'measured':>10} {'uncalib.':>10} {'error':>8} "
              f"{'calib.':>10} {'error':>8}")
        for c in check:
            print(f"{c['op']:<10} {c['workers']:>7} {format_bandwidth(c['bandwidth_bps']):>14} {format_bytes(c['nbytes']):>10} "
                  f"{format_seconds(c['seconds']):>10} {format_seconds(c['uncalibrated_s']):>10} "
                  f"{c['uncalibrated_error_pct']:>+7.1f}% {format_seconds(c['calibrated_s']):>10} {c['calibrated_error_pct']:>+7.1f}%")
    return 0
