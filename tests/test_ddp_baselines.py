"""The DDP hooks checked for WHAT they compute, on 2 gloo ranks:

- every compressor: one step on fixed data gives exactly the mean over ranks of what the
  compressor itself makes of each rank's gradient (a hook returning the sum fails the check); the
  quantizers also on an odd bucket shorter than one block;
- fp16, bf16, powersgd: ``compressors.ddp.comm_hook`` trains bit for bit like PyTorch's own hook
  registered directly, with identical replicas.

No ``from __future__ import annotations`` here: ``register_comm_hook`` checks the wrong hook's
annotations as real objects.
"""

import datetime
import gc
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel

import compressors
import compressors.ddp
from processes import ranks

WORLD = 2
DENSITY = 0.05
SHAPE = (50, 64)
ODD_SHAPE = (7, 9)
"""A bucket of 63 elements: odd (int4's last byte half empty) and shorter than one block."""
OPTIONS = {"dgc": {"seed": 0}, "randomk": {"seed": 3}, "powersgd": {"rank": 2}}
"""Seeded where a compressor draws at random, so each rank can recompute every rank's message."""
HOOK_OPTIONS = {"powersgd": {"rank": 2, "start_iter": 0, "warm_start": False}}
"""PowerSGD from the first step (no warm start, no error feedback: PyTorch then allows step 0)."""


def _data(rank: int, shape: tuple[int, int] = SHAPE) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(32, shape[1], generator=gen)
    return x, torch.randn(32, shape[0], generator=gen)


def _linear(shape: tuple[int, int] = SHAPE) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Linear(shape[1], shape[0], bias=False)


def _local_gradient(rank: int, shape: tuple[int, int] = SHAPE) -> torch.Tensor:
    """The gradient rank ``rank`` computes before any communication (its DDP bucket)."""
    model = _linear(shape)
    x, y = _data(rank, shape)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return model.weight.grad.reshape(-1).clone()


def expected_mean(name: str, shape: tuple[int, int] = SHAPE) -> torch.Tensor:
    """What one step must produce, from the compressor itself on each rank's gradient."""
    grads = [_local_gradient(r, shape) for r in range(WORLD)]
    if name in ("fp16", "bf16"):
        # PyTorch's hook: cast, divide by the world size, all-reduce (sum) in 16 bits, cast back
        c = compressors.create(name)
        total = sum(c.compress(g).values.div(WORLD) for g in grads)
        return c.decompress(compressors.Dense(total, torch.float32))
    if name == "powersgd":
        # P and Q are all-reduced: PowerSGD of the mean gradient (up to summation order)
        c = compressors.create("powersgd", rank=2, shapes=[SHAPE], warm_start=False)
        return c.decompress(c.compress(sum(grads) / WORLD))
    decoded = []
    for g in grads:
        c = compressors.create(name, density=DENSITY, **OPTIONS.get(name, {}))
        decoded.append(c.decompress(c.compress(g)))
    return sum(decoded) / WORLD


def matches(name: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Exact for every compressor but PowerSGD (whose all-reduced P is orthogonalised: float
    rounding of the sum order only)."""
    if name == "powersgd":
        return bool(torch.allclose(got, want, rtol=1e-4, atol=1e-7))
    return torch.equal(got, want)


def _summing(hook):
    """A wrong hook: the right one, times the world size (the sum instead of the mean)."""
    def wrong(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return hook(state, bucket).then(lambda fut: fut.value().mul_(WORLD))
    return wrong


def _one_step(name: str, rank: int, wrong: bool = False, shape: tuple[int, int] = SHAPE) -> torch.Tensor:
    model = DistributedDataParallel(_linear(shape))
    kwargs = HOOK_OPTIONS.get(name, OPTIONS.get(name, {}))
    memory = {"memory": "none"} if name == "powersgd" else {}
    state, hook = compressors.ddp.comm_hook(name, DENSITY, **memory, **kwargs)
    model.register_comm_hook(state, _summing(hook) if wrong else hook)
    x, y = _data(rank, shape)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return model.module.weight.grad.reshape(-1).clone()


def _bf16_direct(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's bf16 hook called directly: DDP refuses to register ``bf16_compress_hook`` itself on
    a non-NCCL backend (it checks the function's name), although gloo all-reduces bf16."""
    return default_hooks.bf16_compress_hook(state, bucket)


def _torch_reference(name: str) -> tuple[object, object]:
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name == "bf16":
        return None, _bf16_direct
    state = torch_powersgd.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                         min_compression_rate=2, use_error_feedback=True, warm_start=True,
                                         orthogonalization_epsilon=0, random_seed=0)
    return state, torch_powersgd.powerSGD_hook


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 1))


def _train(name: str, rank: int, ours: bool, steps: int = 6) -> tuple[torch.Tensor, list]:
    # PyTorch's PowerSGD hook blocks inside future callbacks (nested waits); on gloo, with several
    # buckets the ranks then issue their collectives in different orders and hang (its own hook
    # registered directly does too), so PowerSGD trains with one bucket here.
    model = DistributedDataParallel(_net(), bucket_cap_mb=25 if name == "powersgd" else 0.002)
    if ours:
        state, hook = compressors.ddp.comm_hook(name, 1.0)
    else:
        state, hook = _torch_reference(name)
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(200 + rank)
    x = torch.randn(64, 16, generator=gen)
    y = x[:, :1] * 0.5
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    log = [dict(e) for e in state.log] if ours else []
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), log


def _powersgd_on_several_buckets(rank: int) -> str:
    """What PowerSGD with several buckets on gloo raises (PyTorch's hook would hang instead)."""
    model = DistributedDataParallel(_net(), bucket_cap_mb=0.002)
    model.register_comm_hook(*compressors.ddp.comm_hook("powersgd", 1.0, start_iter=2))
    x = torch.randn(8, 16)
    try:
        for _ in range(3):
            torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
    except Exception as exc:  # DDP re-raises the hook's ValueError wrapped in a RuntimeError
        return str(exc)
    return "nothing raised"


def _worker(rank: int, rdv: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        results: dict = {"mean": {}, "sum_rejected": {}, "bitwise": {}, "identical": {}, "paths": {}, "odd": {}}
        for name in compressors.names():
            want = expected_mean(name)
            results["mean"][name] = matches(name, _one_step(name, rank), want)
            results["sum_rejected"][name] = not matches(name, _one_step(name, rank, wrong=True), want)
        for name in compressors.names("quantized"):
            results["odd"][name] = matches(name, _one_step(name, rank, shape=ODD_SHAPE), expected_mean(name, ODD_SHAPE))
        for name in compressors.ddp.TORCH_HOOKS:
            ours, log = _train(name, rank, ours=True)
            theirs, _ = _train(name, rank, ours=False)
            results["bitwise"][name] = torch.equal(ours, theirs)
            gathered = [torch.empty_like(ours) for _ in range(WORLD)]
            dist.all_gather(gathered, ours)
            results["identical"][name] = torch.equal(gathered[0], gathered[1])
            results["paths"][name] = sorted({e["path"] for e in log})
            results.setdefault("bytes", {})[name] = sum(e["bytes_sent"] for e in log)
        results["multi_bucket_powersgd"] = _powersgd_on_several_buckets(rank)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        gc.collect()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("ddp-baselines")
    ranks.spawn(_worker, (str(tmp / "rdv"), str(tmp)), WORLD)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", compressors.names())
def test_one_step_is_the_mean_of_the_ranks_decompressed_messages(results, name):
    for rank in results:
        assert rank["mean"][name], f"{name}: hook result is not the mean of the ranks' messages"
        assert rank["sum_rejected"][name], f"{name}: the check cannot tell the sum from the mean"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", compressors.names("quantized"))
def test_a_quantizer_on_an_odd_bucket_shorter_than_a_block_is_the_mean_too(results, name):
    for rank in results:
        assert rank["odd"][name], f"{name}: hook result on {ODD_SHAPE} is not the mean of the ranks' messages"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", compressors.ddp.TORCH_HOOKS)
def test_delegating_hooks_match_pytorch_bit_for_bit(results, name):
    for rank in results:
        assert rank["bitwise"][name]
        assert rank["identical"][name]
        assert rank["bytes"][name] > 0
    expected = {"fp16": ["allreduce-fp16"], "bf16": ["allreduce-bf16"], "powersgd": ["allreduce", "powersgd"]}
    assert results[0]["paths"][name] == expected[name]


def test_delegating_hooks_reject_bad_options():
    with pytest.raises(ValueError, match="memory"):
        compressors.ddp.comm_hook("fp16", 1.0, memory="dgc-momentum")
    with pytest.raises(ValueError, match="bad options"):
        compressors.ddp.comm_hook("bf16", 1.0, seed=1)
    with pytest.raises(ValueError, match="bad options"):
        compressors.ddp.comm_hook("powersgd", 1.0, stages=2)
    with pytest.raises(ValueError, match="bad options"):
        compressors.ddp.comm_hook("powersgd", 1.0, start_iter=1)     # PyTorch needs >= 2 with error feedback
    with pytest.raises(ValueError, match="rank"):
        compressors.ddp.comm_hook("powersgd", 1.0, rank=0)


@pytest.mark.timeout(300)
def test_powersgd_on_several_gloo_buckets_fails_on_every_rank_instead_of_hanging(results):
    for rank in results:
        assert "more than one bucket" in rank["multi_bucket_powersgd"]
