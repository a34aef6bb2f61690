"""DiLoCo for real: W simulated sites, H inner steps each, an outer step on the compressed pseudo-gradients.

Each of ``config.workers`` sites holds its own replica of the model and its own inner optimizer
(its state kept across outer steps, as in DiLoCo) and trains on its own data shard (the shard
:func:`convergence.train` gives that worker). Every ``config.sync_every`` (H) steps:

1. each site's pseudo-gradient is ``Δ_w = θ − θ_w`` (parameters at the last sync minus the
   site's), flattened into one vector in parameter order;
2. it goes through :class:`OuterExchange`: each site compresses ``Δ_w`` with its own compressor
   and error feedback (``compressors.ErrorFeedback``, for every compressor that trains with
   one: :func:`compressors.rules.trains_with_error_feedback`), and the outer gradient is the
   sum of the decompressed messages in site order divided by W (what an all-gather of the
   messages, or for ``none`` the all-reduce, computes);
3. the outer optimizer (:func:`convergence.optim.outer`: SGD with Nesterov momentum) steps the
   shared parameters θ with that gradient, and every site starts again from θ. BatchNorm running
   statistics follow site 0, as the per-step training's follow rank 0.

The model is evaluated after an outer step (``eval_every`` and ``iterations`` are multiples of H).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

import compressors
from compressors.rules import trains_with_error_feedback
from convergence import optim
from convergence.train import RunConfig, evaluate


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class OuterExchange:
    """The outer exchange of ``sites`` DiLoCo sites: each compresses its flat pseudo-gradient with
    compressor ``name`` at ``density`` (its own compressor and error-feedback residual), and the
    result is the mean of the decompressed messages. ``shapes``: the parameters' shapes (PowerSGD
    factors each matrix of them); ``options``: compressor options (PowerSGD's ``rank``)."""

    def __init__(self, name: str, density: float, sites: int, shapes: Sequence[Sequence[int]], **options: Any) -> None:
        if sites < 1:
            raise ValueError(f"sites must be >= 1, got {sites}")
        self.name = name
        if compressors.message_kind(name) == "lowrank":  # PowerSGD factors each layer's matrix
            options = {**options, "shapes": [tuple(s) for s in shapes]}
        made = [compressors.create(name, density=density, **options) for _ in range(sites)]
        self.memories = [compressors.ErrorFeedback(c) if trains_with_error_feedback(name) else None for c in made]
        self.compressors = made

    def average(self, deltas: Sequence[torch.Tensor]) -> torch.Tensor:
        """The mean over the sites of their decompressed messages of ``deltas`` (one flat vector per site)."""
        if len(deltas) != len(self.compressors):
            raise ValueError(f"expected pseudo-gradients of {len(self.compressors)} sites, got {len(deltas)}")
        total: torch.Tensor | None = None
        for delta, compressor, memory in zip(deltas, self.compressors, self.memories):
            if self.name == "none":
                part = delta
            else:
                message = memory.compress(delta) if memory is not None else compressor.compress(delta)
                part = compressor.decompress(message).to(delta.dtype)
            total = part.clone() if total is None else total.add_(part)
        assert total is not None
        return total.div_(len(deltas))


def train_diloco(
    config: RunConfig,
    *,
    progress: Callable[[int, float], None] | None = None,
    observe: Callable[[int, nn.Module], None] | None = None,
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one row per inner step, as :func:`convergence.train` does: ``compressor`` and
    ``density`` (the outer compressor and the density it sends; 1.0 where it takes none),
    ``iteration`` (inner steps, from 1), ``loss`` (mean training loss of the sites on their own
    parameters, nats), ``eval_loss`` and ``accuracy`` (of the shared parameters, held out, after
    an outer step; ``None`` elsewhere).

    Runs for any ``config.sync_every`` ≥ 1 (H = 1 is an outer step after every inner one).
    ``optimizer(params)`` builds each site's inner optimizer (default: the config's,
    :meth:`RunConfig.make_optimizer`). ``progress(iteration, loss)`` and ``observe(iteration,
    model)`` (the shared model) are called after every step. Raises ``ValueError`` when the loss
    stops being finite.
    """
    config.check()
    work = config.build()
    model = work.model
    model.train()
    params = _trainable(model)
    sites = [copy.deepcopy(model) for _ in range(config.workers)]
    make = optimizer if optimizer is not None else (lambda ps: config.make_optimizer(ps, work.lr))
    inner = [make(_trainable(site)) for site in sites]
    outer = optim.outer(params, config.outer_lr, config.outer_momentum)
    density = float(config.outer_density) if compressors.takes_density(config.outer_compressor) else 1.0
    low_rank = compressors.message_kind(config.outer_compressor) == "lowrank"
    options = {"rank": config.powersgd_rank} if low_rank else {}
    exchange = OuterExchange(config.outer_compressor, density, config.workers, [p.shape for p in params], **options)
    shards = [work.batches(w, config.workers) for w in range(config.workers)]
    eval_batches = list(work.heldout_batches(config.eval_samples))
    for iteration in range(1, config.iterations + 1):
        loss_sum = 0.0
        for site, site_optimizer, shard in zip(sites, inner, shards):
            inputs, targets = next(shard)
            site_optimizer.zero_grad(set_to_none=True)
            loss = work.loss(site(inputs), targets)
            loss.backward()
            site_optimizer.step()
            loss_sum += float(loss.detach())
        loss_mean = loss_sum / config.workers
        if not math.isfinite(loss_mean):
            raise ValueError(f"DiLoCo (H={config.sync_every}, outer {config.outer_compressor}): training diverged "
                             f"at iteration {iteration} (loss not finite); lower --lr or --outer-lr")
        if iteration % config.sync_every == 0:
            _outer_step(model, params, sites, exchange, outer)
        row: dict[str, Any] = {"compressor": config.outer_compressor, "density": density, "iteration": iteration,
                               "loss": loss_mean, "eval_loss": None, "accuracy": None}
        if iteration % config.eval_every == 0 or iteration == config.iterations:
            row["eval_loss"], row["accuracy"] = evaluate(work, model, eval_batches)
        if progress is not None:
            progress(iteration, loss_mean)
        if observe is not None:
            observe(iteration, model)
        yield row


def _outer_step(model: nn.Module, params: list[nn.Parameter], sites: list[nn.Module], exchange: OuterExchange,
                outer: torch.optim.Optimizer) -> None:
    """Pseudo-gradients through the exchange, the outer step on ``params``, every site reset to them."""
    with torch.no_grad():
        deltas = [torch.cat([(p - q).reshape(-1) for p, q in zip(params, _trainable(site))]) for site in sites]
        mean = exchange.average(deltas)
        offset = 0
        for param in params:
            numel = param.numel()
            param.grad = mean[offset : offset + numel].view_as(param).clone()
            offset += numel
    outer.step()
    outer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for buffer, lead in zip(model.buffers(), sites[0].buffers()):
            buffer.copy_(lead)
        for site in sites:
            for mine, shared in zip(_trainable(site), params):
                mine.copy_(shared)
            for mine, shared in zip(site.buffers(), model.buffers()):
                mine.copy_(shared)
