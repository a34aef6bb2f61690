"""The optimizers of a convergence run: the inner one (SGD or AdamW) and DiLoCo's outer step.

Defaults of DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of
Language Models", arXiv 2311.08105, section 3 and its hyperparameter table): inner AdamW at
learning rate 4e-4 with weight decay 0.1; outer SGD with Nesterov momentum 0.9 at learning
rate 0.7. The paper does not state AdamW's betas: PyTorch's defaults (0.9, 0.999) are used.
The paper warms the inner learning rate up over 1000 steps and decays it by a cosine; runs
here are a few hundred steps at a constant learning rate (no schedule).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from compressors import check_names, takes_density
from compressors.rules import trains_with_error_feedback
from units import check_count, check_density


@dataclass(frozen=True)
class AdamWDefaults:
    """DiLoCo's inner AdamW: ``lr`` (learning rate), ``weight_decay`` (decoupled, per step × lr), ``betas``."""

    lr: float = 4e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)


ADAMW = AdamWDefaults()
"""DiLoCo's inner optimizer (arXiv 2311.08105); betas PyTorch's, the paper names none."""
OUTER_LR = 0.7
"""DiLoCo's outer learning rate (arXiv 2311.08105)."""
OUTER_MOMENTUM = 0.9
"""DiLoCo's outer Nesterov momentum (arXiv 2311.08105)."""
OPTIMIZERS = ("sgd", "adamw")
"""Inner optimizers: ``sgd`` (momentum 0.9, the testbed's per-step training) and ``adamw`` (DiLoCo's)."""


class _Config(Protocol):
    optimizer: str
    weight_decay: float | None
    sync_every: int
    outer_compressor: str
    outer_density: float | None
    outer_lr: float
    outer_momentum: float
    iterations: int
    eval_every: int

    @property
    def diloco(self) -> bool: ...


def check(config: _Config) -> None:
    """Raise ``ValueError`` (naming the command-line flag) for a bad optimizer or DiLoCo field of a
    :class:`convergence.RunConfig`."""
    if config.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {config.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if config.weight_decay is not None:
        if config.optimizer != "adamw":
            raise ValueError("--weight-decay is AdamW's: add --optimizer adamw")
        if isinstance(config.weight_decay, bool) or not config.weight_decay >= 0:
            raise ValueError(f"invalid --weight-decay {config.weight_decay!r}: must be >= 0")
    check_count(config.sync_every, "sync-every")
    check_names([config.outer_compressor])
    if takes_density(config.outer_compressor):
        if config.outer_density is None:
            raise ValueError(f"outer compressor {config.outer_compressor} needs --outer-density")
        check_density(config.outer_density, "invalid --outer-density")
    elif config.outer_density is not None:
        raise ValueError(f"outer compressor {config.outer_compressor} takes no --outer-density")
    if isinstance(config.outer_lr, bool) or not config.outer_lr > 0 or config.outer_lr == float("inf"):
        raise ValueError(f"invalid --outer-lr {config.outer_lr!r}: must be a finite number > 0")
    if isinstance(config.outer_momentum, bool) or not 0 <= config.outer_momentum < 1:
        raise ValueError(f"invalid --outer-momentum {config.outer_momentum!r}: must be in [0, 1)")
    for name, value in (("iterations", config.iterations), ("eval-every", config.eval_every)):
        if config.diloco and isinstance(value, int) and value % config.sync_every:
            raise ValueError(f"--{name} {value} must be a multiple of --sync-every {config.sync_every} "
                             "(the model is evaluated after an outer step)")


def outer_is_default(config: _Config) -> bool:
    """Whether ``config``'s outer step is DiLoCo's default (compressor ``none``, no density, the
    paper's learning rate and momentum): a per-step run (H = 1 through :func:`convergence.train`)
    has no outer step, so the command line refuses other outer settings with it."""
    return (config.outer_compressor, config.outer_density, config.outer_lr, config.outer_momentum) == (
        "none", None, OUTER_LR, OUTER_MOMENTUM)


def inner(name: str, params: Iterable[nn.Parameter], lr: float, weight_decay: float | None = None) -> torch.optim.Optimizer:
    """The inner optimizer ``name`` (:data:`OPTIMIZERS`) over ``params`` at learning rate ``lr``:
    SGD with momentum 0.9, or AdamW with ``weight_decay`` (``None``: :data:`ADAMW`'s) and its betas."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adamw":
        decay = ADAMW.weight_decay if weight_decay is None else float(weight_decay)
        return torch.optim.AdamW(params, lr=lr, betas=ADAMW.betas, weight_decay=decay)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def outer(params: Iterable[nn.Parameter], lr: float, momentum: float) -> torch.optim.Optimizer:
    """DiLoCo's outer optimizer: SGD at ``lr`` with Nesterov momentum ``momentum`` (plain SGD at 0)."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=momentum > 0)


def describe(name: str, weight_decay: float | None = None) -> str:
    """The inner optimizer as the store's configuration names it (``SGD(momentum=0.9)`` as before)."""
    if name == "adamw":
        decay = ADAMW.weight_decay if weight_decay is None else float(weight_decay)
        return f"AdamW(betas={ADAMW.betas}, weight_decay={decay:g})"
    return "SGD(momentum=0.9)"


def outer_fields(config: _Config) -> dict[str, Any]:
    """The DiLoCo fields of a run's stored configuration: none for H = 1 (a per-step run's key is
    what it always was); ``sync_every``, the outer compressor, density (1.0 where it takes none,
    the store's number for no density), learning rate, momentum and ``memory`` for H > 1."""
    if not config.diloco:
        return {}
    density = float(config.outer_density) if takes_density(config.outer_compressor) else 1.0
    return {"sync_every": config.sync_every, "outer_compressor": config.outer_compressor, "outer_density": density,
            "outer_lr": float(config.outer_lr), "outer_momentum": float(config.outer_momentum),
            "outer_optimizer": "SGD(nesterov=True)" if config.outer_momentum > 0 else "SGD",
            "memory": ("residual (error feedback per site on the outer exchange)"
                       if trains_with_error_feedback(config.outer_compressor) else "none")}
