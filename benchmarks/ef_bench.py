"""Compress with error feedback, as training and ``sidco profile`` run it:
``python -m benchmarks.ef_bench [--size N]``.

Every listed compressor wrapped in :class:`compressors.ErrorFeedback`, on three seeded
gradient-like vectors in rotation (the residual moves as between iterations), one torch thread,
process CPU time (other work on the machine does not inflate it), median of ``--repeats`` calls
after ``--warmup`` calls, each call followed by a decompress into a kept buffer. Prints one JSON
object ``{"<compressor>@<density>": milliseconds}``: run it from two checkouts in alternation to
compare them side by side (BENCHMARKS.md, "With error feedback, before and after").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import compressors
from measuring.samples import gradient_like
from units import Pair

CASES = (("topk", 0.01), ("dgc", 0.01), ("sidco-e", 0.01), ("sidco-p", 0.01), ("sidco-gp", 0.01),
         ("sidco-e", 0.001), ("fp16", 1.0), ("powersgd", 1.0), ("none", 1.0))


def median_ms(name: str, density: float, grads: list[torch.Tensor], warmup: int, repeats: int) -> float:
    """Median CPU time (ms) of one error-feedback compress of ``name`` at ``density``."""
    comp = compressors.create(name, density=density)
    ef = compressors.ErrorFeedback(comp)
    out = torch.empty_like(grads[0])
    times = []
    for call in range(warmup + repeats):
        start = time.process_time()
        message = ef.compress(grads[call % len(grads)])
        times.append(time.process_time() - start)
        comp.decompress(message, out=out)
    return statistics.median(times[warmup:]) * 1e3


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the JSON object."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ef_bench", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--size", type=int, default=1 << 24, help="elements per gradient (default 2^24)")
    parser.add_argument("--warmup", type=int, default=6, help="untimed calls per compressor (default 6)")
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per compressor (default 9)")
    args = parser.parse_args(argv)
    if args.size < 1 or args.repeats < 1 or args.warmup < 0:
        print(f"error: need --size >= 1, --repeats >= 1 and --warmup >= 0, got {args.size}, {args.repeats}, "
              f"{args.warmup}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    grads = [gradient_like(args.size, seed) for seed in range(3)]
    print(json.dumps({Pair(name, density).label: median_ms(name, density, grads, args.warmup, args.repeats)
                      for name, density in CASES}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
