"""``sidco quality-table``: build the quality table shipped with the testbed (``profiles/quality.json``).

Calls :func:`pipeline.quality.build_table`: each built-in workload of
:data:`pipeline.quality.TABLE_WORKLOADS` captured by real training, replayed through every
compressor, summarised per (compressor, density); ``sidco compare --layout`` reads the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from pipeline import quality
from pipeline.project import check_output_path
from results.store import Store
from sidco.commands import COMMANDS
from units import parse_count


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``quality-table`` subcommand."""
    parser = subparsers.add_parser(
        "quality-table",
        help=COMMANDS["quality-table"],
        description=(
            f"Capture {', '.join(quality.TABLE_WORKLOADS)} by real training (simulated data parallelism; images: "
            "the built-in class-template images or --image-data, text: the CPython documentation), replay each "
            "trace through every compressor at densities "
            f"{', '.join(f'{d:g}' for d in quality.TABLE_DENSITIES)} (whole model, error feedback on, CPU; "
            f"PowerSGD rank {quality.TABLE_RANK}) and write per (workload, compressor, density) the mean achieved "
            "density, its ratio to the target, the energy sent and energy_vs_topk to OUT (default: the shipped "
            "profiles/quality.json). Traces and replays go to a temporary directory and store unless --work and "
            "--store are given. About 10 minutes on 2 CPU cores."
        ),
    )
    parser.add_argument("--out", default=str(quality.profiles.QUALITY), help="the table to write (default: %(default)s)")
    parser.add_argument("--work", metavar="DIR", help="where the traces go (default: a temporary directory, removed)")
    parser.add_argument("--store", metavar="FILE", help="results store for the replays (default: one in the work directory)")
    parser.add_argument("--workers", default="4", help="simulated data-parallel workers (default 4)")
    parser.add_argument("--iterations", default="100", help="training steps per workload (default 100)")
    parser.add_argument("--every", default="20", help="record every N-th step (default 20)")
    parser.add_argument("--image-data", metavar="DIR",
                        help="a CIFAR-10 python directory for the CNNs (default: the built-in class-template images)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the table and write it (one JSON file)."""
    workers, iterations, every = (parse_count(args.workers, "--workers"), parse_count(args.iterations, "--iterations"),
                                  parse_count(args.every, "--every"))
    out = Path(args.out)
    check_output_path(out)
    with tempfile.TemporaryDirectory(prefix="sidco-quality-") as scratch:
        work = Path(args.work or scratch)
        bar = tqdm(desc="quality table", unit="step", file=sys.stderr, disable=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.set_description(what, refresh=False)
            bar.total = total
            bar.update(done - bar.n)

        with Store(args.store or work / "quality.sqlite") as store:
            table = quality.build_table(store, work, workers=workers, iterations=iterations, every=every,
                                        image_data=args.image_data, progress=progress)
        bar.close()
    out.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    print(f"wrote {out}: {len(table['workloads'])} workloads x "
          f"{len(table['workloads'][0]['rows'])} (compressor, density) rows")
    return 0
