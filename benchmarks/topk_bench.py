"""Which exact Top-k is fastest on this device: ``python -m benchmarks.topk_bench``.

Times, side by side on one seeded gradient-like vector (min of ``--repeats``, ms): the one-pass
floor ``torch.sum``; ``torch.topk`` over ``|g|``; ``torch.kthvalue`` over ``|g|`` (the k-th
largest value, then the selection of everything above it: it needs the value first, so at least
that); and :func:`compressors.numerics.selection.exact_topk` (sampled threshold guess, the fused
above-threshold selection, ``torch.topk`` among the candidates). All three give the same k
magnitudes; the table says how many of the exact Top-k's magnitudes differ from ``torch.topk``'s
(0: exact).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from measuring.samples import gradient_like
from machine import device_identity
from compressors.numerics.selection import Workspace, exact_topk
from units import parse_density


def _best_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def run(sizes: Sequence[int], densities: Sequence[float], device: str = "cpu", repeats: int = 5) -> list[dict[str, Any]]:
    """One row per (size, density): ``floor_ms``, ``torch_topk_ms``, ``kthvalue_ms``, ``exact_topk_ms``
    (min of ``repeats``), ``backend`` of the exact Top-k and ``mismatches`` (0 = same magnitudes)."""
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    rows = []
    for size in sizes:
        g = gradient_like(size, device=dev)
        for density in densities:
            k = max(1, round(density * size))
            workspace = Workspace()
            found = exact_topk(g, k, workspace)
            reference = torch.topk(g.abs(), k).values
            mismatches = int((torch.sort(found.magnitudes, descending=True).values != reference).sum())
            rows.append({
                "size": size, "density": density, "device": device_identity(dev),
                "threads": torch.get_num_threads(), "repeats": repeats,
                "floor_ms": _best_ms(lambda: torch.sum(g), repeats, sync),
                "torch_topk_ms": _best_ms(lambda: torch.topk(g.abs(), k, sorted=False), repeats, sync),
                "kthvalue_ms": _best_ms(lambda: torch.kthvalue(g.abs().cpu(), size - k + 1), repeats, sync),
                "exact_topk_ms": _best_ms(lambda: exact_topk(g, k, workspace), repeats, sync),
                "backend": found.backend, "mismatches": mismatches,
            })
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table (or ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.topk_bench", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--sizes", default="1048576,26214400", help="comma-separated vector lengths (elements)")
    parser.add_argument("--densities", default="0.01,0.001", help="comma-separated densities in (0, 1]")
    parser.add_argument("--run-on", default="cpu", help="torch device to run on (default cpu)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per method; the minimum is reported")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        densities = [parse_density(d) for d in args.densities.split(",")]
        if min(sizes) < 1 or args.repeats < 1:
            raise ValueError("sizes >= 1, repeats >= 1")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        rows = run(sizes, densities, args.run_on, args.repeats)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{rows[0]['device']}, {rows[0]['threads']} threads, min of {args.repeats} (ms)")
    print(f"{'size':>10} {'density':>8} {'sum':>8} {'torch.topk':>11} {'kthvalue':>9} {'exact_topk':>11} "
          f"{'backend':>8} {'mismatches':>10}")
    for r in rows:
        print(f"{r['size']:>10} {r['density']:>8g} {r['floor_ms']:>8.2f} {r['torch_topk_ms']:>11.2f} "
              f"{r['kthvalue_ms']:>9.2f} {r['exact_topk_ms']:>11.2f} {r['backend']:>8} {r['mismatches']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
