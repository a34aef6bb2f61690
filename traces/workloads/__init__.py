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

import functools
from pathlib import Path

from traces.workloads.data import DataSource, ImageData, TextData, heldout, shard
from traces.workloads.models import GPTDecoder, LSTMLanguageModel, ResNetCifar, VGGCifar

NAMES = ("resnet20", "vgg16", "lstm", "transformer")


@dataclass(frozen=True)
class Spec:
    """Defaults of one workload (sizes chosen to train quickly on a 2-core CPU); ``data``: its
    default data (:func:`data_source`)."""

    kind: str  # "image" or "text"
    width: float
    batch_size: int  # samples per worker per step
    lr: float  # SGD learning rate
    options: dict[str, Any] = field(default_factory=dict)
    data: str = "synthetic"


SPECS: dict[str, Spec] = {
    "resnet20": Spec("image", 1.0, 32, 0.05),
    "vgg16": Spec("image", 0.25, 32, 0.02),
    "lstm": Spec("text", 1.0, 20, 1.0, {"vocab": 2000, "seq_len": 35}, "pydoc"),
    "transformer": Spec("text", 1.0, 16, 0.1, {"vocab": 2000, "seq_len": 64}, "pydoc"),
}

DATA_CHOICES = ("synthetic", "pydoc")
"""Built-in data names; anything else given as ``data`` is a path."""


@functools.lru_cache(maxsize=8)
def _text_corpus(data: str, vocab: int, seq_len: int, seed: int) -> DataSource:
    from traces.workloads import corpus

    if data == "pydoc":
        train, held = corpus.pydoc_texts()
        return corpus.TextCorpus(train, held, vocab=vocab, seq_len=seq_len, seed=seed, name="pydoc_data.topics")
    train, held = corpus.file_texts(data)
    return corpus.TextCorpus(train, held, vocab=vocab, seq_len=seq_len, seed=seed, name=data)


@functools.lru_cache(maxsize=2)
def _cifar(directory: str, seed: int) -> DataSource:
    from traces.workloads.cifar import CifarData

    return CifarData(directory, seed=seed)


def data_source(name: str, data: str | None = None, seed: int = 0) -> DataSource:
    """The data workload ``name`` trains on: ``data`` ``None`` (the workload's default:
    ``synthetic`` for images, ``pydoc`` for text), ``synthetic`` (seeded class templates / Markov
    chain, :mod:`traces.workloads.data`), ``pydoc`` (text: the CPython documentation,
    :mod:`traces.workloads.corpus`) or a path: a CIFAR-10 python directory for image workloads
    (:mod:`traces.workloads.cifar`), a UTF-8 text file for text workloads. ``ValueError`` (one
    line) for a path that does not fit the workload or a file that does not fit its format."""
    spec = SPECS[name]
    data = spec.data if data is None else str(data)
    if data == "synthetic":
        if spec.kind == "image":
            return ImageData(seed=seed)
        return TextData(vocab=spec.options["vocab"], seq_len=spec.options["seq_len"], seed=seed)
    if spec.kind == "image":
        if data == "pydoc":
            raise ValueError(f"--data pydoc is text; {name} is an image workload (synthetic or a CIFAR-10 directory)")
        if not Path(data).is_dir():
            raise ValueError(f"--data {data}: {name} needs a CIFAR-10 python directory (data_batch_1..5, test_batch)")
        return _cifar(str(Path(data).resolve()), seed)
    if data != "pydoc" and Path(data).is_dir():
        raise ValueError(f"--data {data}: {name} is a text workload; give a UTF-8 text file")
    path = data if data == "pydoc" else str(Path(data).resolve())
    return _text_corpus(path, spec.options["vocab"], spec.options["seq_len"], seed)


def _text_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _image_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


class Workload:
    """A model, its data shards and its loss; build with :func:`build`.

    Attributes: ``name``, ``model`` (``nn.Module`` on ``device``), ``batch_size``
    (samples per worker per step), ``lr`` (suggested SGD learning rate), ``seed``,
    ``width``, ``device``, ``data`` (:func:`data_source`) and ``data_name`` (what it was built from).
    """

    def __init__(self, name: str, *, width: float, batch_size: int, lr: float, seed: int, device: str | torch.device,
                 data: str | None = None) -> None:
        spec = SPECS[name]
        self.name = name
        self.width = width
        self.batch_size = batch_size
        self.lr = lr
        self.seed = seed
        self.device = torch.device(device)
        self.data: DataSource = data_source(name, data, seed)
        self.data_name = spec.data if data is None else str(data)
        self.model = self.build_model()
        self.loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _image_loss if spec.kind == "image" else _text_loss

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
    data: str | None = None,
) -> Workload:
    """Build workload ``name`` (one of :data:`NAMES`) on ``data`` (:func:`data_source`);
    unspecified knobs take the CPU-friendly defaults."""
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
    return Workload(name, width=width, batch_size=batch_size, lr=lr, seed=seed, device=device, data=data)
