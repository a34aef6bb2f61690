"""``sidco calibrate``: fit α, β and efficiency to measured collectives and store them."""

from __future__ import annotations

import argparse
import json

from emulation.calibration import CalibrationFit, fit, fit_per_op
from sidco.commands import add_store_argument
from results.store import Store


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
        rows = [dict(r) for r in store.query(sql, params)]
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
    if args.json:
        print(json.dumps({"calibration_id": calibration_id, "emulation_ids": emulations, **pooled.as_dict(),
                          "ops": {op: f.as_dict() for op, f in per_op.items()}}, sort_keys=True))
        return 0
    print(f"calibration {calibration_id} (collective measurements of emulations {', '.join(map(str, emulations))}):")
    print(f"{'op':<10} {'alpha':>10} {'efficiency':>10} {'points':>6} {'fit error median':>17} {'max':>8}")
    for op, result in [("all ops", pooled), *per_op.items()]:
        print(f"{op:<10} {result.alpha_s * 1e6:>7.1f} us {result.efficiency:>10.3f} {result.points:>6} "
              f"{result.median_abs_error_pct:>15.1f} % {result.max_abs_error_pct:>6.1f} %")
    print(f"beta (all ops) = {pooled.beta_s_per_byte * 1e9:.2f} ns/byte at {pooled.reference_bandwidth_bps / 1e6:g} Mbit/s")
    return 0
