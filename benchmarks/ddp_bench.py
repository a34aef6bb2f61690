"""Side-by-side measurement of the DDP hook: real gloo ranks on this machine, one run.

``python -m benchmarks.ddp_bench --workers 2 --numel 4000000 --steps 12 --density 0.01``
spawns ``--workers`` processes (gloo on loopback), trains the same synthetic MLP with
each compressor's hook in turn, and prints, per compressor, the median step time, the
median per-step sum of the hook's per-bucket ``comm_s`` and ``compress_s``, the bytes
each rank sent per step, and the step time relative to ``none`` measured in the same run.
PyTorch's own hooks (fp16, bf16, PowerSGD) compress inside their communication: their
compress column reads "in comm". Every compressor trains with one DDP bucket.
Loopback is far faster than a real network, so this measures the hook's own overhead,
not the speed-up on a slow link (that is what ``simulator`` and ``emulation`` are for).
"""

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import compressors
import compressors.ddp
from processes import ranks

WIDTH_IN = 256
"""Input features of the synthetic model."""


def build_model(numel: int) -> torch.nn.Module:
    """An MLP with about ``numel`` parameters (elements): 256 -> h -> h -> 1, h chosen to fit."""
    hidden = max(8, int((-(WIDTH_IN + 3) + ((WIDTH_IN + 3) ** 2 + 4 * numel) ** 0.5) / 2))
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH_IN, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )


def _measure(name: str, density: float, steps: int, numel: int, rank: int) -> dict:
    module = build_model(numel)
    # one bucket after DDP's first-iteration rebuild, for every compressor alike: PyTorch's PowerSGD
    # hook runs on gloo only with one bucket
    one_bucket_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 2**20 + 1
    model = DistributedDataParallel(module, bucket_cap_mb=one_bucket_mb)
    state, hook = compressors.ddp.comm_hook(name, density)
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, WIDTH_IN, generator=gen), torch.randn(32, 1, generator=gen)
    step_s = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step_s.append(time.perf_counter() - start)
    warm = steps // 3
    per_step: dict[int, dict[str, float]] = {}
    for entry in state.log:
        if entry["iteration"] >= warm:
            acc = per_step.setdefault(entry["iteration"], {"comm_s": 0.0, "compress_s": 0.0, "bytes": 0})
            acc["comm_s"] += entry["comm_s"]
            acc["compress_s"] += entry["compress_s"]
            acc["bytes"] += entry["bytes_sent"]
    return {
        "compressor": name,
        "density": density,
        "numel": sum(p.numel() for p in model.parameters()),
        "step_s": statistics.median(step_s[warm:]),
        "hook_comm_s": statistics.median(v["comm_s"] for v in per_step.values()),
        "hook_compress_s": statistics.median(v["compress_s"] for v in per_step.values()),
        "bytes_sent_per_step": int(statistics.median(v["bytes"] for v in per_step.values())),
    }


def _worker(rank: int, world: int, rdv: str, out: str, names: list[str], density: float, steps: int, numel: int) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        rows = [_measure(name, density, steps, numel, rank) for name in names]
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        gc.collect()  # free the DDP reducers now: destroyed at interpreter exit they abort the process
        dist.destroy_process_group()


def run(names: list[str], density: float, workers: int, steps: int, numel: int) -> list[dict]:
    """Measure every compressor in ``names`` in one spawned group of ``workers`` gloo ranks.

    Returns one dict per compressor (rank 0's view): ``step_s``, ``hook_comm_s`` and
    ``hook_compress_s`` (seconds, medians over the steps after the first third),
    ``bytes_sent_per_step`` (bytes), ``numel`` (parameters) and ``step_over_none``
    (the step time relative to ``none`` in the same run, when ``none`` is among ``names``).
    """
    for name in names:
        compressors.create(name, density=density)
    if workers < 2 or steps < 3 or numel < 1000:
        raise ValueError("need --workers >= 2, --steps >= 3 and --numel >= 1000")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rows.json")
        ranks.spawn(_worker, (workers, str(Path(tmp, "rdv")), str(out), names, density, steps, numel), workers)
        rows = json.loads(out.read_text())
    base = {row["compressor"]: row["step_s"] for row in rows}.get("none")
    for row in rows:
        row["workers"] = workers
        row["step_over_none"] = row["step_s"] / base if base else None
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table (or JSON with ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ddp_bench", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--compressors", default="none,fp16,powersgd,topk,dgc,sidco-e", help="comma-separated names (default: %(default)s)")
    parser.add_argument("--density", type=float, default=0.01, help="target density per bucket, in (0, 1] (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="gloo ranks on this machine (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per compressor; the first third is warm-up (default: %(default)s)")
    parser.add_argument("--numel", type=int, default=4_000_000, help="approximate model size in parameters (elements) (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args(argv)
    try:
        rows = run(args.compressors.split(","), args.density, args.workers, args.steps, args.numel)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{rows[0]['numel']} parameters, {args.workers} gloo ranks on loopback, density {args.density}")
    print(f"{'compressor':<12}{'step ms':>10}{'hook comm ms':>14}{'compress ms':>13}{'bytes/step':>12}{'vs none':>9}")
    for row in rows:
        ratio = f"{row['step_over_none']:.2f}x" if row["step_over_none"] else "-"
        inside = row["compressor"] != "none" and row["hook_compress_s"] == 0
        compress = "in comm" if inside else f"{row['hook_compress_s'] * 1e3:.1f}"
        print(f"{row['compressor']:<12}{row['step_s'] * 1e3:>10.1f}{row['hook_comm_s'] * 1e3:>14.1f}"
              f"{compress:>13}{row['bytes_sent_per_step']:>12}{ratio:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
