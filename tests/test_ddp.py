"""The DDP communication hook in real training: 2 and 4 gloo processes, a small regression
problem, several compressors with error feedback. Replicas must stay bit-identical, the loss
must fall, residuals must survive DDP's bucket rebuild, and the per-bucket log must add up."""

from __future__ import annotations

import datetime
import gc
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import compressors.ddp
from processes import ranks

STEPS = 40
DENSITY = 0.05
CASES: dict[str, tuple[str, dict]] = {
    "none": ("none", {}),
    "topk": ("topk", {}),
    "sidco-e": ("sidco-e", {}),
    "dgc": ("dgc", {}),
    "dgc-momentum": ("dgc", {"memory": "dgc-momentum", "momentum": 0.5}),
    "randomk-shared": ("randomk", {"seed": 3}),
}
"""Label -> (compressor, comm_hook keywords); every case runs with a memory (error feedback
unless stated) so that aggressive sparsification still trains."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data: a fixed teacher, different inputs per rank."""
    teacher = torch.randn(16, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(64, 16, generator=gen)
    return x, (x @ teacher).unsqueeze(1) / 4


def _train(case: str, rank: int, world: int, device: str) -> dict:
    name, kwargs = CASES[case]
    model = DistributedDataParallel(_model().to(device), bucket_cap_mb=0.002)  # ~500 floats: several buckets after the rebuild
    state, hook = compressors.ddp.comm_hook(name, DENSITY, **kwargs)
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = (t.to(device) for t in _shard(rank))
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    log = list(state.log)
    return {
        "losses": losses,
        "identical": all(torch.equal(gathered[0], g) for g in gathered[1:]),
        "numel": flat.numel(),
        "iteration": state.iteration,
        "migrations": state.buckets.migrations,
        "buckets_first": sorted(e["bucket"] for e in log if e["iteration"] == 0),
        "buckets_last": sorted(e["bucket"] for e in log if e["iteration"] == STEPS - 1),
        "numel_last": sum(e["numel"] for e in log if e["iteration"] == STEPS - 1),
        "selected": sum(e["selected"] for e in log),
        "paths": sorted({e["path"] for e in log}),
        "bytes_sent": state.bytes_sent,
        "logged_bytes": sum(e["bytes_sent"] for e in log),
        "payload_bytes": state.payload_bytes,
        "comm_s_positive": all(e["comm_s"] > 0 for e in log),
        "compress_within_comm": all(e["compress_s"] <= e["comm_s"] for e in log),
        "memory_norm": sum(float(t.norm()) for s in state.buckets.slots.values() for t in s.tensors().values()),
    }


def _nan_on_one_rank(rank: int, world: int, device: str) -> str:
    """Train one step where only the last rank's gradient holds NaN; return what this rank raised."""
    model = DistributedDataParallel(_model().to(device))
    model.register_comm_hook(*compressors.ddp.comm_hook("sidco-e", DENSITY))
    x, y = (t.to(device) for t in _shard(rank))
    if rank == world - 1:
        x[0, 0] = float("nan")
    try:
        torch.nn.functional.mse_loss(model(x), y).backward()
    except Exception as exc:  # DDP re-raises the hook's ValueError wrapped in a RuntimeError
        return str(exc)
    return "nothing raised"


def _train_worker(rank: int, world: int, rdv: str, out_dir: str, names: list[str], backend: str) -> None:
    torch.set_num_threads(1)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        results = {case: _train(case, rank, world, device) for case in names}
        results["nan"] = _nan_on_one_rank(rank, world, device)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        gc.collect()  # free the DDP reducers now: destroyed at interpreter exit they abort the process
        dist.destroy_process_group()


def _run(tmp_path: Path, world: int, names: list[str], backend: str = "gloo") -> list[dict]:
    ranks.spawn(_train_worker, (world, str(tmp_path / "rdv"), str(tmp_path), names, backend), world)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _check(results: list[dict], names: list[str], world: int) -> None:
    for rank in range(world):
        assert "could not select" in results[rank]["nan"], results[rank]["nan"]
    assert "NaN" in results[-1]["nan"]
    for name in names:
        first = results[0][name]
        assert first["identical"], f"{name}: replicas diverged"
        start, end = sum(first["losses"][:3]) / 3, sum(first["losses"][-3:]) / 3
        assert end < 0.3 * start, f"{name}: loss {start:.4f} -> {end:.4f} did not fall"
        assert first["iteration"] == STEPS
        assert first["numel_last"] == first["numel"], f"{name}: the last step's buckets do not cover the model"
        for rank in range(world):
            mine = results[rank][name]
            assert mine["bytes_sent"] == mine["logged_bytes"]
            assert mine["comm_s_positive"] and mine["compress_within_comm"]
        dense_bytes = first["numel"] * 4 * STEPS
        if name == "none":
            assert first["paths"] == ["allreduce"]
            assert first["bytes_sent"] == dense_bytes
        else:
            assert first["paths"] == ["allreduce-values" if name == "randomk-shared" else "allgather"]
            assert first["migrations"] >= 1, f"{name}: the bucket rebuild was not seen"
            assert len(first["buckets_last"]) > len(first["buckets_first"]), f"{name}: DDP did not rebuild into more buckets"
            assert first["memory_norm"] > 0, f"{name}: no memory state kept"
            assert first["payload_bytes"] < 0.25 * dense_bytes, f"{name}: sent {first['payload_bytes']} of {dense_bytes} dense bytes"
            assert first["selected"] >= STEPS * len(first["buckets_last"]), f"{name}: some bucket sent nothing"


@pytest.mark.timeout(240)
def test_hook_trains_two_gloo_ranks(tmp_path):
    names = list(CASES)
    _check(_run(tmp_path, 2, names), names, 2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hook_trains_four_gloo_ranks(tmp_path):
    """Four ranks: the dense all-reduce and the sparse all-gather of uneven selections (Top-k and
    DGC run the same all-gather at two ranks above)."""
    names = ["none", "sidco-e"]
    _check(_run(tmp_path, 4, names), names, 4)


@pytest.mark.gpu
@pytest.mark.timeout(240)
def test_hook_trains_on_nccl(tmp_path):
    """The same training on NCCL with CUDA tensors, one rank per visible GPU (at most 4)."""
    world = min(4, torch.cuda.device_count())
    names = ["none", "topk", "sidco-e"]
    _check(_run(tmp_path, world, names, "nccl"), names, world)


def test_comm_hook_rejects_bad_input_before_training():
    with pytest.raises(ValueError, match="gather method 'ring' is not one of"):
        compressors.ddp.comm_hook("topk", 0.01, gather="ring")
    with pytest.raises(ValueError, match="log_size"):
        compressors.ddp.comm_hook("topk", 0.01, log_size=0)
    with pytest.raises(ValueError):
        compressors.ddp.comm_hook("no-such-compressor", 0.01)
    with pytest.raises(ValueError):
        compressors.ddp.comm_hook("topk", 1.5)
