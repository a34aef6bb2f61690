"""``sidco calibrate``: fit α, β and efficiency to measured collectives and store them."""

from __future__ import annotations

import argparse
import json

from emulation.calibration import CalibrationFit, compare, fit, fit_per_op
from sidco.commands import add_store_argument
from results.store import Store
from simulator.calibration import Calibration
from simulator.units import format_bandwidth, format_bytes, format_seconds


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="fit α (s), β (s/byte) and link efficiency to measured collectives",
        description=(
            "Least-squares fit of the ring α–β forms (cost-model.md) to the collective times stored "
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
        sql = (
            "SELECT m.* FROM collective_measurements m JOIN emulations e ON e.id = m.emulation_id "
            "WHERE e.kind = 'collective' AND e.status = 'done'"
        )
        params: list[int] = []
        if args.emulation:
            sql += f" AND m.emulation_id IN ({', '.join('?' for _ in args.emulation)})"
            params = list(args.emulation)
        measured = [dict(r) for r in store.query(sql, params)]
        held_out = set(args.check or ())
        rows = [r for r in measured if r["emulation_id"] not in held_out]
        checks = [r for r in measured if r["emulation_id"] in held_out]
        if held_out and not checks:
            raise ValueError(f"--check: no collective measurements in emulation(s) {sorted(held_out)}")
        pooled = fit(rows)
        per_op = fit_per_op(rows)
        emulations = sorted({r["emulation_id"] for r in rows})

        def stored(result: CalibrationFit, model: str) -> dict:
            return {"alpha_s": result.alpha_s, "beta_s_per_byte": result.beta_s_per_byte,
                    "efficiency": result.efficiency, "fit_error_pct": result.median_abs_error_pct,
                    "source": {"emulation_ids": emulations, "model": model, **result.as_dict()}}

        calibration_id = store.insert_calibration(
            stored(pooled, "ring alpha-beta, all operations, weighted by 1/t"),
            {op: stored(f, f"ring alpha-beta, {op} only, weighted by 1/t") for op, f in per_op.items()},
        )
    check = compare(checks, Calibration.load(args.store, calibration_id)) if checks else []
    if args.json:
        print(json.dumps({"calibration_id": calibration_id, "emulation_ids": emulations, **pooled.as_dict(),
                          "ops": {op: f.as_dict() for op, f in per_op.items()}, "check": check}, sort_keys=True))
        return 0
    print(f"calibration {calibration_id} (collective measurements of emulations {', '.join(map(str, emulations))}):")
    print(f"{'op':<12} {'alpha':>10} {'efficiency':>10} {'points':>6} {'fit error median':>17} {'max':>8}")
    for op, result in [("all ops", pooled), *per_op.items()]:
        print(f"{op:<12} {result.alpha_s * 1e6:>7.1f} us {result.efficiency:>10.3f} {result.points:>6} "
              f"{result.median_abs_error_pct:>15.1f} % {result.max_abs_error_pct:>6.1f} %")
    print(f"beta (all ops) = {pooled.beta_s_per_byte * 1e9:.2f} ns/byte at {pooled.reference_bandwidth_bps / 1e6:g} Mbit/s")
    if check:
        print(f"held-out measurements (emulations {', '.join(map(str, sorted(held_out)))}), analytic ring model:")
        print(f"{'op':<10} {'workers':>7} {'bandwidth':>14} {'size':>10} {'measured':>10} {'uncalib.':>10} {'error':>8} "
              f"{'calib.':>10} {'error':>8}")
        for c in check:
            print(f"{c['op']:<10} {c['workers']:>7} {format_bandwidth(c['bandwidth_bps']):>14} {format_bytes(c['nbytes']):>10} "
                  f"{format_seconds(c['seconds']):>10} {format_seconds(c['uncalibrated_s']):>10} "
                  f"{c['uncalibrated_error_pct']:>+7.1f}% {format_seconds(c['calibrated_s']):>10} {c['calibrated_error_pct']:>+7.1f}%")
    return 0
