"""Offline, seeded training data with learnable structure (nothing is downloaded).

Images (CIFAR-10-shaped, 3×32×32, 10 classes): each class has a smooth random
template; a sample is its class template, randomly shifted by up to 4 pixels,
scaled by a random contrast, plus Gaussian noise. Text (PTB-like word-level
corpus): a sparse Markov chain over the vocabulary where every word has a
handful of likely successors with Zipf-like probabilities, so a model can learn
to predict the next word well above chance.

Sharding: batch ``b`` of worker ``w`` among ``W`` comes from its own generator
seeded by ``(seed, W, w, b)``, so workers see disjoint, reproducible streams and
every rank of a real data-parallel run can rebuild its own shard alone.
Held-out batches (:func:`heldout`) come from generators seeded by ``(seed, 0, 0, b)``:
worker count 0 is never a training configuration, so no held-out sample is a training
sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

class DataSource(Protocol):
    """What a workload's data provides: training batches per worker shard, held-out batches."""

    def batch(self, worker: int, workers: int, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def heldout_batch(self, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...


IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10


def seeded_generator(*parts: int) -> torch.Generator:
    """A torch generator seeded by the integers ``parts`` (e.g. seed, workers, worker, batch index):
    every data source draws each batch from its own, so a batch depends on nothing else."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part) + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


class ImageData:
    """Class-conditional image patterns (3×32×32 float32, 10 classes) plus noise, made hard on purpose.

    A sample of class ``y`` is ``(1 - m)·T_y + m·T_z``: its class template blended with another
    class's template ``z`` at weight ``m`` drawn uniformly from [0, ``blend``), rolled by up to
    ``shift`` pixels each way, scaled by a contrast in [0.5, 1.5), plus Gaussian noise of
    standard deviation ``noise``. With ``blend`` b > 1/2 a blend at m in (1 - b, b) is equally
    likely to come from (y, z, m) and (z, y, 1 - m), so no classifier beats
    ``1 - (2b - 1) / (2b)`` held-out accuracy (83.3 % at the default b = 0.6; the noise lowers
    it further). docs/usage.md states what dense fp32 reaches.
    """

    def __init__(self, seed: int = 0, noise: float = 1.0, blend: float = 0.6, shift: int = 8) -> None:
        gen = seeded_generator(seed, 17)
        coarse = torch.randn(CLASSES, 3, 8, 8, generator=gen)
        self.templates = torch.nn.functional.interpolate(coarse, size=IMAGE_SHAPE[1:], mode="bilinear", align_corners=False)
        self.seed = seed
        self.noise = noise
        self.blend = blend
        self.shift = shift

    def batch(self, worker: int, workers: int, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of ``worker``'s shard: images (B,3,32,32) float32 and labels (B,) int64."""
        gen = seeded_generator(self.seed, workers, worker, index)
        labels = torch.randint(0, CLASSES, (batch_size,), generator=gen)
        others = (labels + torch.randint(1, CLASSES, (batch_size,), generator=gen)) % CLASSES
        weight = self.blend * torch.rand(batch_size, 1, 1, 1, generator=gen)
        images = (1 - weight) * self.templates[labels] + weight * self.templates[others]
        shifts = torch.randint(-self.shift, self.shift + 1, (2,), generator=gen)
        images = torch.roll(images, shifts=(int(shifts[0]), int(shifts[1])), dims=(2, 3))
        contrast = 0.5 + torch.rand(batch_size, 1, 1, 1, generator=gen)
        images = images * contrast + self.noise * torch.randn(images.shape, generator=gen)
        return images, labels

    def heldout_batch(self, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out batch ``index`` (worker count 0: never a training stream)."""
        return self.batch(0, 0, index, batch_size)


class TextData:
    """Word-level Markov-chain corpus over ``vocab`` words; batches of (B, seq_len) token ids.

    Words fall into ``clusters`` word classes (``word % clusters``); the successors
    of a word are drawn from a list shared by its class (``successors`` words with
    Zipf probabilities), so, as in natural text, words of a class behave alike and
    the structure is learnable from few examples.
    """

    def __init__(self, vocab: int = 2000, seq_len: int = 35, successors: int = 8, clusters: int = 40, seed: int = 0) -> None:
        gen = seeded_generator(seed, 29)
        self.vocab = vocab
        self.seq_len = seq_len
        class_next = torch.randint(0, vocab, (clusters, successors), generator=gen)
        self.next_words = class_next[torch.arange(vocab) % clusters]
        ranks = torch.arange(1, successors + 1, dtype=torch.float32)
        self.probs = (1.0 / ranks).expand(vocab, successors).contiguous()
        self.seed = seed

    def heldout_batch(self, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out batch ``index`` (worker count 0: never a training stream)."""
        return self.batch(0, 0, index, batch_size)

    def batch(self, worker: int, workers: int, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of ``worker``'s shard: inputs and next-word targets, both (B, seq_len) int64."""
        gen = seeded_generator(self.seed, workers, worker, index)
        tokens = torch.empty(batch_size, self.seq_len + 1, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch_size,), generator=gen)
        for t in range(self.seq_len):
            current = tokens[:, t]
            choice = torch.multinomial(self.probs[current], 1, generator=gen).squeeze(1)
            tokens[:, t + 1] = self.next_words[current, choice]
        return tokens[:, :-1], tokens[:, 1:]


def shard(data: DataSource, worker: int, workers: int, batch_size: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless iterator over ``worker``'s batches (of ``batch_size`` samples) from batch ``start`` on."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} out of range for {workers} workers")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    index = start
    while True:
        yield data.batch(worker, workers, index, batch_size)
        index += 1


def heldout(data: DataSource, samples: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches (of at most ``batch_size``) holding ``samples`` held-out samples, disjoint from every shard."""
    if samples < 1 or batch_size < 1:
        raise ValueError(f"held-out samples and batch size must be >= 1, got {samples} and {batch_size}")
    for index, start in enumerate(range(0, samples, batch_size)):
        yield data.heldout_batch(index, min(batch_size, samples - start))
