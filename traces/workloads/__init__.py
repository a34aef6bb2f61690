"""Built-in training workloads that need no download: resnet20, vgg16, lstm, transformer.

>>> w = build("resnet20", workers=4)
>>> model = w.model                          # seeded: identical on every rank for equal seed
>>> for x, y in w.batches(worker=0, workers=4):  # endless iterator over this worker's shard
...     loss = w.loss(model(x), y)

The emulation engineer's real DistributedDataParallel runs use exactly these
three pieces (model, shard iterator, loss), so simulated and real data
parallelism train the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from traces.workloads.data import ImageData, TextData, heldout, shard
from traces.workloads.models import GPTDecoder, LSTMLanguageModel, ResNetCifar, VGGCifar

NAMES = ("resnet20", "vgg16", "lstm", "transformer")


@dataclass(frozen=True)
class Spec:
    """Defaults of one workload (sizes chosen to train quickly on a 2-core CPU)."""

    kind: str  # "image" or "text"
    width: float
    batch_size: int  # samples per worker per step
    lr: float  # SGD learning rate
    options: dict[str, Any] = field(default_factory=dict)


SPECS: dict[str, Spec] = {
    "resnet20": Spec("image", 1.0, 32, 0.05),
    "vgg16": Spec("image", 0.25, 32, 0.02),
    "lstm": Spec("text", 1.0, 20, 1.0, {"vocab": 2000, "seq_len": 35}),
    "transformer": Spec("text", 1.0, 16, 0.1, {"vocab": 2000, "seq_len": 64}),
}


def _text_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _image_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


class Workload:
    """A model, its data shards and its loss; build with :func:`build`.

    Attributes: ``name``, ``model`` (``nn.Module`` on ``device``), ``batch_size``
    (samples per worker per step), ``lr`` (suggested SGD learning rate), ``seed``,
    ``width``, ``device``.
    """

    def __init__(self, name: str, *, width: float, batch_size: int, lr: float, seed: int, device: str | torch.device) -> None:
        spec = SPECS[name]
        self.name = name
        self.width = width
        self.batch_size = batch_size
        self.lr = lr
        self.seed = seed
        self.device = torch.device(device)
        self.model = self.build_model()
        if spec.kind == "image":
            self.data: ImageData | TextData = ImageData(seed=seed)
            self.loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _image_loss
        else:
            self.data = TextData(vocab=spec.options["vocab"], seq_len=spec.options["seq_len"], seed=seed)
            self.loss = _text_loss

    def build_model(self, device: str | torch.device | None = None) -> nn.Module:
        """A fresh model with parameters drawn from ``seed`` (same on every call and every rank)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = _make_model(self.name, self.width)
        return model.to(device or self.device)

    def batches(self, worker: int = 0, workers: int = 1, batch_size: int | None = None, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless iterator of ``(inputs, targets)`` on ``device`` for ``worker``'s shard of ``workers``."""
        for inputs, targets in shard(self.data, worker, workers, batch_size or self.batch_size, start):
            yield inputs.to(self.device), targets.to(self.device)

    def heldout_batches(self, samples: int, batch_size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(inputs, targets)`` batches on ``device`` holding ``samples`` evaluation samples that no
        training shard contains (same every call)."""
        for inputs, targets in heldout(self.data, samples, batch_size or self.batch_size):
            yield inputs.to(self.device), targets.to(self.device)

    def optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Plain SGD with momentum 0.9 at ``lr`` over ``model`` (default: ``self.model``)."""
        return torch.optim.SGD((model or self.model).parameters(), lr=self.lr, momentum=0.9)


def _make_model(name: str, width: float) -> nn.Module:
    spec = SPECS[name]
    if name == "resnet20":
        return ResNetCifar(3, width)
    if name == "vgg16":
        return VGGCifar(width)
    if name == "lstm":
        return LSTMLanguageModel(spec.options["vocab"], width)
    return GPTDecoder(spec.options["vocab"], width, context=spec.options["seq_len"])


def parameter_count(name: str, width: float) -> int:
    """Parameters of workload ``name`` at ``width``, counted on the ``meta`` device (no memory used)."""
    if name not in SPECS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(NAMES)}")
    with torch.device("meta"):
        model = _make_model(name, width)
    return sum(p.numel() for p in model.parameters())


def names() -> list[str]:
    """Names of the built-in workloads."""
    return list(NAMES)


def build(
    name: str,
    *,
    width: float | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Workload:
    """Build workload ``name`` (one of :data:`NAMES`); unspecified knobs take the CPU-friendly defaults."""
    if name not in SPECS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(NAMES)}")
    spec = SPECS[name]
    width = spec.width if width is None else float(width)
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width}")
    batch_size = spec.batch_size if batch_size is None else int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    lr = spec.lr if lr is None else float(lr)
    if not lr > 0:
        raise ValueError(f"learning rate must be > 0, got {lr}")
    return Workload(name, width=width, batch_size=batch_size, lr=lr, seed=seed, device=device)
