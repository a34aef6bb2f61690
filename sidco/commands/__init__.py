"""One module per ``sidco`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from results.store import DEFAULT_PATH

COMMANDS: dict[str, str] = {
    "bench": "time each compressor's compress/decompress against a one-pass floor (torch.sum)",
    "profile": "measure compress/decompress times on a device (a device profile), or check the cost model",
    "capture": "train a built-in workload with simulated data parallelism and record a gradient trace",
    "replay": "replay a gradient trace through compressors and store per-call quality and overhead",
    "simulate": "project one training iteration on a simulated cluster",
    "compare": "rank every compressor x density on one cluster, with a verdict that weighs what each sends",
    "quality-table": "build the shipped quality table (profiles/quality.json) from real training of the built-in workloads",
    "sweep": "simulate a grid of scenarios into the results store (resumable, local or Dask)",
    "converge": "train a built-in workload with compressed gradients; loss and held-out accuracy per iteration",
    "tta": "time to accuracy: which compressor reaches the target first on a cluster",
    "emulate": "real torch.distributed runs in network namespaces with shaped links",
    "calibrate": "fit α (s), β (s/byte) and link efficiency to measured collectives",
    "dashboard": "serve the what-if dashboard (Dash) over the results store",
    "paper": "the SIDCo paper's setting, projected with PyTorch 1.3's kernel costs and with today's",
}
"""Every subcommand and its one-line summary (``sidco --help`` lists these without importing
the command modules, so it never loads torch; each module's parser takes its ``help`` from here)."""


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """Add the ``--store`` option every command that reads or writes results shares."""
    parser.add_argument("--store", default=str(DEFAULT_PATH),
                        help="results store, SQLite file (default: %(default)s)")


def add_run_on_argument(parser: argparse.ArgumentParser, what: str = "the code") -> None:
    """Add ``--run-on cpu|cuda[:N]``: the torch device ``what`` runs on (default cpu). ``--device``
    names the modelled device of a projection only, so here it is refused, naming ``--run-on``."""
    parser.add_argument("--run-on", default="cpu", metavar="cpu|cuda",
                        help=f"torch device {what} runs on: cpu, cuda or cuda:N (default cpu)")
    add_renamed_argument(parser, "--device", "--run-on")


class _Renamed(argparse.Action):
    """An old spelling: using it is a one-line error naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is now {self.new}")


def add_renamed_argument(parser: argparse._ActionsContainer, old: str, new: str) -> None:
    """Refuse the old option spelling ``old`` with a one-line error naming ``new`` (exit 2)."""
    parser.add_argument(old, action=_Renamed, new=new, dest="renamed_" + old.lstrip("-").replace("-", "_"))


def add_calibration_argument(parser: argparse.ArgumentParser, default: str = "none",
                             group: argparse._ActionsContainer | None = None) -> None:
    """Add ``--calibration [latest|ID|none]`` (bare: ``latest``), the fitted α, β and efficiency
    (``sidco calibrate``) applied to the projection; checked by
    :func:`pipeline.request.parse_calibration`."""
    (group or parser).add_argument(
        "--calibration", nargs="?", const="latest", default=default, metavar="latest|ID|none",
        help=f"apply a calibration of the results store (α, efficiency per collective): latest, its id, or none "
             f"(bare --calibration: latest; default {default})")


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (inf, nan) replaced by ``None`` (JSON ``null``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dump_json(value: Any) -> str:
    """The ``--json`` output of a command: valid JSON always (non-finite numbers are ``null``,
    never ``Infinity``/``NaN``), keys sorted."""
    return json.dumps(finite(value), sort_keys=True, allow_nan=False)
