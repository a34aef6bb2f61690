"""How fast the command line answers: start-up, one layout projection, a full comparison, a 70B model projected.

Each command runs in a fresh ``sidco`` process (what a user types), ``--repeats`` times,
interleaved with ``python -c "import torch"`` as the yardstick measured in the same run; the
table gives the median wall time (s) and its ratio to the torch import. The modules each
command imports (and whether torch is among them) are counted in a separate child with
``sys.modules``: that count does not depend on the machine's load.

    python -m benchmarks.front_doors [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from machine import host_identity

SCENARIO = ["--layout", "bert-base", "--device", "a100", "--nodes", "16", "--bandwidth", "25Gbit"]
COMMANDS: dict[str, list[str]] = {
    "sidco --help": ["--help"],
    "sidco simulate (bert-base layout, sidco-e@0.01, des)": [
        "simulate", *SCENARIO, "--compressor", "sidco-e", "--density", "0.01"],
    "sidco compare (7 compressors x 3 densities + none/fp16/powersgd)": [
        "compare", *SCENARIO, "--compressors", "topk,randomk,dgc,gaussiank,redsync,sidco-e,sidco-p",
        "--densities", "0.1,0.01,0.001"],
    "sidco simulate (llama-3.1-70b model, 128 nodes x 8 h100, analytic)": [
        "simulate", "--model", "llama-3.1-70b", "--device", "h100", "--nodes", "128", "--gpus-per-node", "8",
        "--bandwidth", "400Gbit", "--batch-size", "1", "--fidelity", "analytic", "--compressor", "none"],
}
TORCH = "python -c 'import torch' (yardstick)"


def _wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _modules(args: list[str]) -> tuple[int, bool]:
    code = ("import sys, io, contextlib\nfrom sidco.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
            "print(len(sys.modules), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True).stdout
    count, torch = out.split()
    return int(count), torch == "True"


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (default 5)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = ["--store", os.path.join(tmp, "r.sqlite")]
        runs = {name: [sys.executable, "-m", "sidco", *cmd, *(store if cmd != ["--help"] else [])]
                for name, cmd in COMMANDS.items()}
        runs[TORCH] = [sys.executable, "-c", "import torch"]
        for argv_ in runs.values():  # warm the page cache and create the store once
            _wall(argv_)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, argv_ in runs.items():
                times[name].append(_wall(argv_))
        counts = {name: _modules(cmd + (store if cmd != ["--help"] else [])) for name, cmd in COMMANDS.items()}
    torch_s = statistics.median(times[TORCH])
    print(f"# {host_identity()['cpu']}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}, python {platform.python_version()}, {args.repeats} runs each")
    print("| command | median wall (s) | min (s) | / import torch | modules imported | torch imported |")
    print("|---|---:|---:|---:|---:|---|")
    for name in runs:
        median = statistics.median(times[name])
        count, torch = counts.get(name, ("", True))
        print(f"| {name} | {median:.2f} | {min(times[name]):.2f} | {median / torch_s:.2f} | {count} | "
              f"{'yes' if torch else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
