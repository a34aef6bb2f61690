"""Forward FLOPs of one batch, per parameter tensor, counted by PyTorch's own FLOP counter.

:func:`count` runs the model once on one batch under :class:`torch.utils.flop_counter.FlopCounterMode`
(untimed, without autograd, in eval mode, the random state restored afterwards, so the training it
is called from is unchanged) and attributes the counted FLOPs to the trainable parameters:

* a module's own FLOPs (its count less its child modules' counts) go to the parameters it holds
  directly, split in proportion to their element counts (the split the recorder applies to
  backward times: a ``Linear``'s ``weight`` and ``bias`` share its matrix product);
* FLOPs counted outside any module that holds parameters (attention scores inside a module
  without parameters of its own, a tied output head computed in the model's ``forward``) are
  spread over the parameters that already carry FLOPs, in proportion to those FLOPs, so the
  per-parameter FLOPs sum to the whole forward count.

Parameters of modules whose operations the counter does not count (norms, embeddings, element-wise
work, and any operator without a registered FLOP formula) get 0. FLOPs count a multiply and an add
as two operations and are **per batch** of the inputs given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

COUNTER = "torch.utils.flop_counter.FlopCounterMode"
"""What counted the FLOPs (stored in the trace manifest)."""


@dataclass(frozen=True)
class ForwardFlops:
    """Forward FLOPs of one batch of ``batch_size`` samples: ``per_parameter`` aligned with the
    trainable parameters in ``named_parameters`` order (FLOPs), ``total`` the whole forward (FLOPs)."""

    per_parameter: tuple[float, ...]
    total: float
    batch_size: int


def _module_counts(model: nn.Module, inputs: Sequence[Any]) -> tuple[dict[str, float], float]:
    """FlopCounterMode's count per module path (``""`` = the model) and for the whole forward (FLOPs)."""
    was_training = model.training
    counter = FlopCounterMode(display=False)
    devices = [t.device for t in inputs if isinstance(t, torch.Tensor) and t.device.type == "cuda"]
    try:
        model.eval()
        with torch.random.fork_rng(devices=devices), torch.no_grad(), counter:
            model(*inputs)
    finally:
        model.train(was_training)
    raw = {name: float(sum(ops.values())) for name, ops in counter.get_flop_counts().items()}
    root = type(model).__name__
    counts = {path: raw.get(f"{root}.{path}" if path else root, 0.0) for path, _ in model.named_modules()}
    return counts, raw.get("Global", 0.0)


def count(model: nn.Module, inputs: Sequence[Any], batch_size: int) -> ForwardFlops:
    """Forward FLOPs of ``model(*inputs)`` (one batch of ``batch_size`` samples) per trainable
    parameter, attributed as the module docstring states."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    counts, total = _module_counts(model, inputs)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    owners = [name.rpartition(".")[0] for name, _ in named]
    owned_numel: dict[str, int] = {}
    for owner, (_, param) in zip(owners, named):
        owned_numel[owner] = owned_numel.get(owner, 0) + param.numel()
    own: dict[str, float] = {}
    for path, module in model.named_modules():
        if path in owned_numel:
            children = sum(counts.get(f"{path}.{c}" if path else c, 0.0) for c, _ in module.named_children())
            own[path] = max(0.0, counts[path] - children)
    flops = [own[owner] * p.numel() / owned_numel[owner] if owned_numel[owner] else 0.0
             for owner, (_, p) in zip(owners, named)]
    attributed = sum(own.values())
    rest = total - attributed
    if rest > 0:
        if attributed > 0:
            flops = [f * total / attributed for f in flops]
        else:
            numel = sum(p.numel() for _, p in named)
            flops = [rest * p.numel() / numel for _, p in named]
    return ForwardFlops(tuple(flops), total, int(batch_size))
