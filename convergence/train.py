"""Train a built-in workload with W simulated data-parallel workers sending compressed gradients.

One (compressor, density) run: each worker computes its gradient on its own data shard
(:meth:`traces.workloads.Workload.batches`), :class:`convergence.workers.SimulatedWorkers`
averages the compressed messages as the DDP hook would, and one SGD step (momentum 0.9,
the workload's learning rate) updates the shared replica. BatchNorm running statistics
follow rank 0, as DDP's buffer broadcast makes them: only worker 0's forward pass updates
them. Every ``eval_every`` iterations (and at the last one) the model is evaluated on a
held-out set that no training shard contains (:meth:`Workload.heldout_batches`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import compressors

from convergence import optim
from convergence.workers import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES, SimulatedWorkers
from traces import workloads
from traces.recorder import Recorder
from units import check_count


@dataclass(frozen=True)
class RunConfig:
    """What a convergence run trains; compressor and density are chosen per call of :func:`train`.

    ``batch_size``: samples per worker per step; ``lr``: SGD learning rate (``None``: the
    workload's defaults); ``eval_samples``: held-out samples per evaluation;
    ``bucket_cap_bytes`` / ``first_bucket_bytes``: DDP's bucket caps (bytes); ``data``: what
    the workload trains on (:func:`traces.workloads.data_source`: ``None`` its default,
    ``synthetic``, ``pydoc`` or a path); ``powersgd_rank`` / ``powersgd_start_iter``: PowerSGD's
    rank and the steps of plain all-reduce before it compresses (``comm_hook``'s ``rank`` and
    ``start_iter``).

    ``optimizer``: the (inner) optimizer, ``sgd`` (momentum 0.9, the workload's learning rate) or
    ``adamw`` (:data:`convergence.optim.ADAMW`: DiLoCo's inner optimizer; ``lr`` defaults to its
    learning rate); ``weight_decay``: AdamW's (``None``: DiLoCo's). ``sync_every`` (H): 1 exchanges
    gradients every step (:func:`train`); above 1 each worker is a site training alone for H steps
    between outer steps (:func:`convergence.diloco.train_diloco`), whose pseudo-gradients go
    through ``outer_compressor`` at ``outer_density`` (with error feedback) into an outer SGD at
    ``outer_lr`` with Nesterov momentum ``outer_momentum`` (:mod:`convergence.optim`: the DiLoCo
    paper's defaults).
    """

    workload: str = "resnet20"
    workers: int = 4
    iterations: int = 300
    eval_every: int = 50
    width: float | None = None
    batch_size: int | None = None
    lr: float | None = None
    seed: int = 0
    eval_samples: int = 512
    device: str = "cpu"
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES
    data: str | None = None
    powersgd_rank: int = 1
    powersgd_start_iter: int = 2
    optimizer: str = "sgd"
    weight_decay: float | None = None
    sync_every: int = 1
    outer_compressor: str = "none"
    outer_density: float | None = None
    outer_lr: float = optim.OUTER_LR
    outer_momentum: float = optim.OUTER_MOMENTUM

    @property
    def diloco(self) -> bool:
        """Whether this run synchronises every H > 1 steps (DiLoCo) instead of every step."""
        return self.sync_every > 1

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        optim.check(self)
        if self.workload not in workloads.names():
            raise ValueError(f"unknown workload {self.workload!r}; choose one of {', '.join(workloads.names())}")
        if self.powersgd_start_iter < 2:
            raise ValueError(f"start-iter must be an integer >= 2 (PyTorch's minimum with error feedback), "
                             f"got {self.powersgd_start_iter!r}")
        for name in ("workers", "iterations", "eval_every", "eval_samples", "powersgd_rank"):
            value = getattr(self, name)
            check_count(value, name.replace("powersgd_", "").replace("_", "-"))
        if self.eval_every > self.iterations:
            raise ValueError(f"eval-every ({self.eval_every}) must not exceed iterations ({self.iterations})")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available")

    def resolved_lr(self) -> float:
        """The (inner) learning rate: ``lr``, else the workload's for SGD, DiLoCo's for AdamW."""
        if self.lr is not None:
            return float(self.lr)
        return optim.ADAMW.lr if self.optimizer == "adamw" else workloads.SPECS[self.workload].lr

    def build(self) -> workloads.Workload:
        """The workload with this run's knobs (seeded model and data)."""
        return workloads.build(self.workload, width=self.width, batch_size=self.batch_size, lr=self.resolved_lr(),
                               seed=self.seed, device=self.device, data=self.data)

    def make_optimizer(self, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """This run's (inner) optimizer over ``params`` at learning rate ``lr``."""
        return optim.inner(self.optimizer, params, lr, self.weight_decay)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (the store's configuration key), with resolved defaults."""
        work = workloads.SPECS[self.workload]
        return {
            "workload": self.workload, "workers": self.workers, "iterations": self.iterations,
            "eval_every": self.eval_every, "width": work.width if self.width is None else float(self.width),
            "batch_size": work.batch_size if self.batch_size is None else int(self.batch_size),
            "lr": self.resolved_lr(), "seed": self.seed,
            "eval_samples": self.eval_samples, "device": self.device, "bucket_cap_bytes": self.bucket_cap_bytes,
            "first_bucket_bytes": self.first_bucket_bytes,
            "optimizer": optim.describe(self.optimizer, self.weight_decay),
            "memory": "residual (error feedback per worker and bucket)", "data": self.data_name(),
            "powersgd_rank": self.powersgd_rank, "powersgd_start_iter": self.powersgd_start_iter,
            **optim.outer_fields(self),
        }

    def data_name(self) -> str:
        """The data trained on: ``synthetic``, ``pydoc`` or the absolute path given."""
        data = workloads.SPECS[self.workload].data if self.data is None else self.data
        return data if data in workloads.DATA_CHOICES else str(Path(data).resolve())


def evaluate(work: workloads.Workload, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """Mean loss and accuracy (fraction of correct predictions; next-token for text) over ``batches``."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in batches:
            output = model(inputs)
            n = targets.numel()
            loss_sum += float(work.loss(output, targets)) * n
            correct += int((output.argmax(dim=-1) == targets).sum())
            count += n
    model.train(was_training)
    return loss_sum / count, correct / count


def train(
    config: RunConfig,
    compressor: str,
    density: float | None,
    *,
    recorder_factory: Callable[[nn.Module, int], Recorder] | None = None,
    progress: Callable[[int, float], None] | None = None,
    observe: Callable[[int, nn.Module], None] | None = None,
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one row per iteration: ``compressor``, ``density``, ``iteration`` (from 1), ``loss``
    (mean training loss of the workers), ``eval_loss`` and ``accuracy`` (held-out; ``None`` on
    iterations that are not evaluated).

    ``density`` (``None`` or ignored for ``none``, the dense casts and PowerSGD: reported as 1.0, the store's number for no density). ``recorder_factory(model, batch_size)``
    returns a :class:`traces.Recorder` (with ``workers`` set) that records this run's per-worker
    gradients; it is closed (the trace written) after the last iteration. ``progress(iteration,
    loss)`` and ``observe(iteration, model)`` are called after every step. ``optimizer(params)``
    builds the optimizer (default: the config's, :meth:`RunConfig.make_optimizer`). Raises
    ``ValueError`` when the loss stops being finite or ``config`` synchronises every H > 1 steps
    (that is :func:`convergence.diloco.train_diloco`).
    """
    config.check()
    if config.diloco:
        raise ValueError(f"sync-every {config.sync_every} trains with convergence.diloco.train_diloco")
    work = config.build()
    model = work.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optimizer(params) if optimizer is not None else config.make_optimizer(params, work.lr)
    sent_density = float(density) if compressors.takes_density(compressor) else 1.0
    low_rank = compressors.message_kind(compressor) == "lowrank"  # PowerSGD's rank and first compressed step
    options = {"rank": config.powersgd_rank, "start_iter": config.powersgd_start_iter} if low_rank else {}
    exchange = SimulatedWorkers(params, compressor, sent_density, config.workers,
                                bucket_cap_bytes=config.bucket_cap_bytes, first_bucket_bytes=config.first_bucket_bytes,
                                **options)
    shards = [work.batches(w, config.workers) for w in range(config.workers)]
    eval_batches = list(work.heldout_batches(config.eval_samples))
    recorder = recorder_factory(model, work.batch_size) if recorder_factory is not None else None
    try:
        with recorder if recorder is not None else nullcontext():
            if recorder is not None:  # per-layer FLOPs, so projections onto other devices use them (untimed)
                recorder.count_flops(next(work.batches(0, config.workers))[0])
            for iteration in range(1, config.iterations + 1):
                grads, loss_sum, rank0_buffers = [], 0.0, None
                for worker, shard in enumerate(shards):
                    inputs, targets = next(shard)
                    optimizer.zero_grad(set_to_none=True)
                    loss = work.loss(model(inputs), targets)
                    loss.backward()
                    if worker == 0:
                        rank0_buffers = [b.detach().clone() for b in model.buffers()]
                    if recorder is not None:
                        recorder.capture(worker)
                    grads.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params])
                    loss_sum += float(loss.detach())
                for buffer, saved in zip(model.buffers(), rank0_buffers or []):
                    buffer.copy_(saved)
                exchange.exchange(grads)
                if recorder is not None:
                    with recorder.optimizer():
                        optimizer.step()
                    recorder.step()
                else:
                    optimizer.step()
                loss_mean = loss_sum / config.workers
                if not math.isfinite(loss_mean):
                    raise ValueError(f"{compressor} at density {density:g}: training diverged at iteration "
                                     f"{iteration} (loss not finite); lower --lr")
                row: dict[str, Any] = {"compressor": compressor, "density": sent_density, "iteration": iteration,
                                       "loss": loss_mean, "eval_loss": None, "accuracy": None}
                if iteration % config.eval_every == 0 or iteration == config.iterations:
                    row["eval_loss"], row["accuracy"] = evaluate(work, model, eval_batches)
                if progress is not None:
                    progress(iteration, loss_mean)
                if observe is not None:
                    observe(iteration, model)
                yield row
    finally:
        exchange.close()
