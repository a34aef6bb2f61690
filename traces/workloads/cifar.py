"""CIFAR-10 in its published python format, loaded without unpickling arbitrary classes.

A directory holding ``data_batch_1`` … ``data_batch_5`` (training; those present are used)
and ``test_batch`` (held out), each a pickle of a dict with ``b"data"`` (uint8 array
N×3072: 1024 red, 1024 green, 1024 blue values of a 32×32 image, row-major) and ``b"labels"``
(N integers 0-9), as https://www.cs.toronto.edu/~kriz/cifar.html publishes them.

Unpickling is restricted (:class:`_CifarUnpickler`): the only globals it admits are what
numpy needs to rebuild an array (``numpy.ndarray``, ``numpy.dtype``, the array
reconstructor) and ``_codecs.encode`` (protocol 2's byte strings); any other class or
function is refused with one line before anything is called. The arrays must then be uint8
of the right shape and the labels integers 0-9.

Images are scaled to [0, 1] and normalised per channel by the training set's mean and
standard deviation. Sharding: the training images in a permutation seeded by ``seed`` are
cut into ``W`` contiguous shards; batch ``b`` of worker ``w`` draws ``B`` images of its shard
with a generator seeded by ``(seed, W, w, b)``, each flipped left-right with probability 1/2.
Held-out batches are the test images in file order.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from traces.workloads.data import seeded_generator

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
MAX_FILE_BYTES = 256 * 1024 * 1024
"""Largest batch file read (bytes; a published one is about 31 MB)."""
_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that only admits the globals of numpy arrays and byte strings (:data:`_ALLOWED`)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def _load_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 N×3×32×32, labels int64 N)`` of one batch file; ``ValueError`` (one line) otherwise."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"{path}: {size} bytes, more than the {MAX_FILE_BYTES} a CIFAR-10 batch may have")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"--data: {path} is missing (a CIFAR-10 python directory has data_batch_1..5 and "
                         "test_batch)") from None
    try:
        batch = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"--data: refused {path}: it pickles {exc}, not one of the CIFAR-10 format's arrays") from None
    except Exception as exc:  # a truncated or garbled pickle fails in many ways; all are "not this format"
        raise ValueError(f"--data: {path} is not a CIFAR-10 python batch ({type(exc).__name__})") from None
    if not isinstance(batch, dict):
        raise ValueError(f"--data: {path} is not a CIFAR-10 python batch (not a dict)")
    data, labels = batch.get(b"data", batch.get("data")), batch.get(b"labels", batch.get("labels"))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"--data: {path}: data must be a uint8 array N x 3072")
    labels = np.asarray(labels if labels is not None else [], dtype=object)
    if labels.shape != (data.shape[0],) or not all(isinstance(v, (int, np.integer)) and 0 <= v < 10 for v in labels):
        raise ValueError(f"--data: {path}: labels must be {data.shape[0]} integers 0-9")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


class CifarData:
    """CIFAR-10 from a python-format directory (module docstring): float32 images (B,3,32,32), labels (B,)."""

    def __init__(self, directory: str | Path, seed: int = 0) -> None:
        directory = Path(directory)
        if not directory.is_dir():
            raise ValueError(f"--data {directory}: not a directory (a CIFAR-10 python directory for image workloads)")
        present = [directory / name for name in TRAIN_FILES if (directory / name).exists()]
        if not present:
            raise ValueError(f"--data {directory}: no data_batch_1..5 (a CIFAR-10 python directory)")
        parts = [_load_batch(path) for path in present]
        test_images, test_labels = _load_batch(directory / TEST_FILE)
        train = torch.from_numpy(np.concatenate([p[0] for p in parts])).float().div_(255)
        self.mean = train.mean(dim=(0, 2, 3), keepdim=True)
        self.std = train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
        self.images = (train - self.mean) / self.std
        self.labels = torch.from_numpy(np.concatenate([p[1] for p in parts]))
        self.test_images = (torch.from_numpy(test_images).float().div_(255) - self.mean) / self.std
        self.test_labels = torch.from_numpy(test_labels)
        self.order = torch.randperm(len(self.labels), generator=seeded_generator(seed, 41))
        self.seed = seed

    def batch(self, worker: int, workers: int, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of ``worker``'s shard: images (B,3,32,32) float32 and labels (B,) int64."""
        size = len(self.order) // workers
        shard = self.order[worker * size:(worker + 1) * size] if size else self.order
        gen = seeded_generator(self.seed, workers, worker, index)
        picks = shard[torch.randint(0, len(shard), (batch_size,), generator=gen)]
        images = self.images[picks].clone()
        flip = torch.rand(batch_size, generator=gen) < 0.5
        images[flip] = images[flip].flip(-1)
        return images, self.labels[picks]

    def heldout_batch(self, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out batch ``index``: test images in file order (wrapping around)."""
        picks = torch.arange(index * batch_size, (index + 1) * batch_size) % len(self.test_labels)
        return self.test_images[picks], self.test_labels[picks]
