"""DGC's threshold selection as its reference implementation does it (Lin et al., ICLR 2018).

Sample ``|g|`` with a stride from a random offset (about 1 % of the elements and at least
``2/δ`` samples), take the top-``δ`` value of the sample as the threshold, select ``|g| ≥ thr``;
if more than ``1.3·k`` are selected take an exact top-k among them (hierarchical top-k); if fewer
than ``0.8·k``, lower the threshold by ×0.8 and retry, up to 10 rounds.
Tie rule: ``|g| >= threshold`` (greater or equal, as the reference). Momentum correction is the
memory :class:`compressors.DGCMemory`.
"""

from __future__ import annotations

import math
import random

import torch

from compressors._validate import raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.selection import Workspace, argmax_fallback, magnitude
from compressors.sparse import Sparse


def sample_stride(numel: int, density: float, sample_ratio: float) -> int:
    """Stride of DGC's strided sample: odd multiple-of-32-plus-one, leaving enough samples."""
    wanted = max(math.ceil(numel * sample_ratio), math.ceil(2.0 / density))
    if numel <= wanted:
        return 1
    stride = math.ceil(numel / wanted / 32) * 32 + 1
    while stride > 1 and numel // stride < wanted:
        stride = max(1, stride - 8)
    return stride


class DGC(Compressor):
    """DGC sparsification. Options: ``sample_ratio`` (0.01), ``max_rounds`` (10), ``seed``
    (for the sample offset; ``None`` = nondeterministic)."""

    name = "dgc"

    def __init__(self, density: float, sample_ratio: float = 0.01, max_rounds: int = 10,
                 seed: int | None = None):
        super().__init__(density)
        if isinstance(sample_ratio, bool) or not isinstance(sample_ratio, (int, float)) or not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1], got {sample_ratio!r}")
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_rounds must be an int >= 1, got {max_rounds!r}")
        self.sample_ratio = float(sample_ratio)
        self.max_rounds = max_rounds
        self._rng = random.Random(seed)
        self._workspace = Workspace()

    def reseed(self, seed: int) -> None:
        """Draw the following sample offsets from ``random.Random(seed)``."""
        self._rng = random.Random(seed)

    def _compress(self, grad: torch.Tensor) -> Sparse:
        n = grad.numel()
        k = target_count(self.density, n)
        a = magnitude(grad, self._workspace)
        stride = sample_stride(n, self.density, self.sample_ratio)
        samples = a[self._rng.randrange(stride)::stride] if stride > 1 else a
        top_samples = max(1, math.ceil(samples.numel() * self.density))
        threshold = torch.min(torch.topk(samples, top_samples, sorted=False).values)
        mask = self._workspace.get("mask", n, torch.bool, a.device)
        indices = torch.nonzero(torch.ge(a, threshold, out=mask)).squeeze(1)
        raise_if_not_finite(grad, torch.sum(a, dtype=torch.float64 if a.dtype == torch.float64 else torch.float32))
        if stride > 1:
            for _ in range(self.max_rounds):
                count = indices.numel()
                if count > k:
                    if count > 1.3 * k:
                        chosen = a.index_select(0, indices)
                        top = torch.topk(chosen, k, sorted=False).indices
                        indices = torch.sort(indices.index_select(0, top)).values
                    break
                if count >= 0.8 * k:
                    break
                threshold = threshold * 0.8
                indices = torch.nonzero(torch.ge(a, threshold, out=mask)).squeeze(1)
        if indices.numel() == 0:
            indices = argmax_fallback(a)
        return Sparse(grad.index_select(0, indices), indices, n, threshold)
