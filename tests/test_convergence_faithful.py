"""The simulated workers of ``sidco converge`` compute what real DDP with ``compressors.ddp.comm_hook``
computes: same seeds, same shards, 2 gloo ranks against 2 simulated workers, parameters and
BatchNorm buffers compared after every step to float tolerance (rtol 1e-5, atol 1e-6). The
hook's own compressors and fp16/bf16 (PyTorch's hooks) run with several DDP buckets after the
rebuild; PowerSGD (PyTorch's hook, defaults: rank 1, plain all-reduce for 2 steps, error feedback,
warm start) with one bucket, since PyTorch's PowerSGD hook hangs on gloo with more, and enough
steps that it compresses in 4 of them."""

from __future__ import annotations

import datetime
import gc
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel

import compressors.ddp
from convergence import RunConfig, train
from processes import ranks

DENSITY = 0.05
BUCKET_CAP_MB = 0.02
"""DDP's MB is 2**20 bytes: ~21 kB buckets, so the 70 kB model spans several after the rebuild."""
ONE_BUCKET_MB = 1.0
"""Above the model's size: DDP puts every parameter in one bucket."""
CASES = {"none": (BUCKET_CAP_MB, 4), "topk": (BUCKET_CAP_MB, 4), "sidco-e": (BUCKET_CAP_MB, 4),
         "fp16": (BUCKET_CAP_MB, 4), "bf16": (BUCKET_CAP_MB, 3), "powersgd": (ONE_BUCKET_MB, 6)}
"""compressor -> (DDP ``bucket_cap_mb``, training steps)."""


def _config(case: str) -> RunConfig:
    cap_mb, steps = CASES[case]
    cap = int(cap_mb * 1024 * 1024)
    return RunConfig("resnet20", workers=2, iterations=steps, eval_every=steps, width=0.25, batch_size=8, seed=5,
                     eval_samples=8, bucket_cap_bytes=cap, first_bucket_bytes=cap)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone().float() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def _ddp_rank(rank: int, world: int, rdv: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for case in CASES:
            cap_mb, steps = CASES[case]
            work = _config(case).build()
            model = DistributedDataParallel(work.build_model(), bucket_cap_mb=cap_mb)
            state, hook = compressors.ddp.comm_hook(case, 1.0 if case == "none" else DENSITY)
            model.register_comm_hook(state, hook)
            optimizer = work.optimizer(model.module)
            batches = work.batches(rank, world)
            for step in range(1, steps + 1):
                inputs, targets = next(batches)
                optimizer.zero_grad(set_to_none=True)
                work.loss(model(inputs), targets).backward()
                optimizer.step()
                if rank == 0:
                    save_file(_state(model.module), str(Path(out_dir) / f"{case}-{step}.safetensors"))
            if rank == 0:
                buckets = max(sum(1 for e in state.log if e["iteration"] == i) for i in range(steps))
                paths = sorted({e["path"] for e in state.log})
                Path(out_dir, f"{case}-paths").write_text(",".join(paths))
                Path(out_dir, f"{case}-buckets").write_text(str(buckets))
            del model, state, hook
            gc.collect()
    finally:
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_simulated_workers_match_two_gloo_ddp_ranks(tmp_path):
    torch.set_num_threads(1)
    ranks.spawn(_ddp_rank, (2, str(tmp_path / "rdv"), str(tmp_path)), 2)
    for case in CASES:
        buckets = int((tmp_path / f"{case}-buckets").read_text())
        if case == "powersgd":
            assert buckets == 1, f"powersgd: DDP used {buckets} buckets"
            assert (tmp_path / "powersgd-paths").read_text() == "allreduce,powersgd", "PowerSGD never compressed"
        else:
            assert buckets >= 3, f"{case}: DDP did not use several buckets"
        seen = []

        def compare(step: int, model: torch.nn.Module, case: str = case) -> None:
            expected = load_file(str(tmp_path / f"{case}-{step}.safetensors"))
            mine = _state(model)
            assert mine.keys() == expected.keys()
            for name, value in expected.items():
                torch.testing.assert_close(mine[name], value, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, n=name: f"{case} step {step} {n}: {m}")
            seen.append(step)

        list(train(_config(case), case, DENSITY, observe=compare))
        assert seen == list(range(1, CASES[case][1] + 1))
