"""Modelled cost of the fused paths against the eager ones and Top-k on the modelled GPUs:
``python -m benchmarks.fused_table``.

For each GPU of :data:`costs.devices.GPUS`, size and compressor: the declared work of one
compress call with error feedback (:func:`compressors.work.work`: launches, syncs, bytes read and
written by streaming kernels, bytes read on the host) and its modelled time
(:func:`costs.costmodel.seconds`) at δ = 0.001: SIDCo-E, DGC, Gaussian-k and RedSync fused
(``backend="fused"``: SIDCo's Triton path, the others' selection on the shared compaction kernel)
and eager (``"cuda"``, the torch path on a GPU), Top-k (``"cuda"``). Model only: no kernel runs.
Prints a Markdown table of modelled ms, one row per compressor and backend (``--json``: every
figure, host MB too).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from compressors import work as declared
from costs import costmodel, devices
from units import parse_density

ROWS = (("sidco-e", "fused"), ("sidco-e", "cuda"), ("topk", "cuda"), ("dgc", "fused"), ("dgc", "cuda"),
        ("gaussiank", "fused"), ("gaussiank", "cuda"), ("redsync", "fused"), ("redsync", "cuda"))
"""(compressor, declared backend) of each row."""

SIZES = (1 << 20, 1 << 24)
"""Gradient sizes (elements)."""


def rows(density: float = 0.001) -> list[dict]:
    """One row per GPU, size and (compressor, backend): launches, syncs, MB moved, ms modelled."""
    out = []
    for gpu in devices.GPUS:
        device = devices.get(gpu)
        for n in SIZES:
            for name, backend in ROWS:
                w = declared.work(name, n, density, backend=backend, error_feedback=True).compress
                out.append({"gpu": gpu, "numel": n, "compressor": name, "backend": backend,
                            "launches": w.launches, "syncs": w.syncs,
                            "device_MB": (w.bytes_read + w.bytes_written) / 1e6, "host_MB": w.host_bytes / 1e6,
                            "ms": costmodel.seconds(w, device) * 1e3})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table (or ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fused_table", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--density", default="0.001", help="target density, a fraction in (0, 1] (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--compressors", default=",".join(dict.fromkeys(name for name, _ in ROWS)),
                        help="comma-separated compressors whose rows to print (default: %(default)s)")
    args = parser.parse_args(argv)
    chosen = args.compressors.split(",")
    unknown = sorted(set(chosen) - {name for name, _ in ROWS})
    if unknown:
        parser.error(f"no rows for {', '.join(unknown)}; choose from {', '.join(dict.fromkeys(n for n, _ in ROWS))}")
    try:
        args.density = parse_density(args.density)
    except ValueError as exc:
        parser.error(str(exc))
    table = rows(args.density)
    if args.json:
        json.dump(table, sys.stdout, indent=1)
        return 0
    columns = [(gpu, n) for n in SIZES for gpu in devices.GPUS]
    print("| δ = %g | launches, MB 2²⁰ / 2²⁴ | " % args.density
          + " | ".join(f"{gpu} 2^{n.bit_length() - 1}" for gpu, n in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, backend in (row for row in ROWS if row[0] in chosen):
        mine = {(r["gpu"], r["numel"]): r for r in table if (r["compressor"], r["backend"]) == (name, backend)}
        small, large = mine[columns[0]], mine[columns[-1]]
        print(f"| {name} {backend} | {large['launches']}, {small['device_MB']:.0f} / {large['device_MB']:.0f} | "
              + " | ".join(f"{mine[c]['ms']:.3f}" for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
