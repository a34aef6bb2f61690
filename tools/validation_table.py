"""Print the validation rows of emulations as the Markdown table and goal summary of BENCHMARKS.md.

Usage: python tools/validation_table.py STORE EMULATION_ID [EMULATION_ID ...]

One line per cell (workers, bandwidth, compressor, density) with the measured iteration time
and, per fidelity and calibration, the projected time's error; the network share is each
projection's transfer time ÷ its iteration time. The summary applies the goals of the
network-heavy validation: on the cells whose uncalibrated analytic projection has a network
share ≥ 30 % (one set for every variant), the worst and the median |error| per fidelity,
uncalibrated and calibrated.
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
from collections import defaultdict

HEAVY = 0.30


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code."""
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    con = sqlite3.connect(f"file:{argv[0]}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    ids = [int(a) for a in argv[1:]]
    rows = con.execute(
        f"SELECT * FROM validation WHERE emulation_id IN ({','.join('?' * len(ids))}) "
        "ORDER BY workers, bandwidth_bps, compressor, density", ids).fetchall()
    cells: dict[tuple, dict] = defaultdict(dict)
    for r in rows:
        key = (r["workers"], r["bandwidth_bps"], r["compressor"], r["density"] or 0.0, r["emulation_id"])
        cells[key][(r["fidelity"], r["calibrated"])] = r
    variants = [("analytic", 0), ("analytic", 1), ("des", 0), ("des", 1)]
    print("| workers | bandwidth | compressor | density | measured | network share (uncal. / cal.) | "
          "analytic uncal. | analytic cal. | des uncal. | des cal. |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for (p, bw, name, density, _), by in sorted(cells.items()):
        first = next(iter(by.values()))
        share = " / ".join(f"{by[('analytic', c)]['network_share']:.0%}" if ("analytic", c) in by else "–" for c in (0, 1))
        errors = [f"{by[v]['error_pct']:+.1f} %" if v in by else "–" for v in variants]
        shown = f"{density:g}" if density else "–"
        print(f"| {p} | {bw / 1e6:g} Mbit/s | {name} | {shown} | {first['measured_s'] * 1e3:.0f} ms | {share} | "
              + " | ".join(errors) + " |")
    print()
    heavy_cells = {key for key, by in cells.items()
                   if ("analytic", 0) in by and by[("analytic", 0)]["network_share"] >= HEAVY}
    print(f"Network-heavy cells (share >= {HEAVY:.0%} in the uncalibrated analytic projection): "
          f"{len(heavy_cells)} of {len(cells)}.")
    for variant in variants:
        chosen = [abs(by[variant]["error_pct"]) for by in cells.values() if variant in by]
        heavy = [abs(by[variant]["error_pct"]) for key, by in cells.items() if variant in by and key in heavy_cells]
        if not chosen:
            continue
        line = (f"- {variant[0]}, {'calibrated' if variant[1] else 'uncalibrated'}: all {len(chosen)} cells median "
                f"|error| {statistics.median(chosen):.1f} %, worst {max(chosen):.1f} %")
        if heavy:
            line += f"; network-heavy cells median {statistics.median(heavy):.1f} %, worst {max(heavy):.1f} %"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
