"""RedSync's trimmed threshold search (Fang et al., 2019).

Binary search of ``thr = μ + t·(max − μ)`` over ``t ∈ [0, 1]`` on ``a = |g|`` (``μ`` its mean),
accepting the first probe that selects between ``k`` and ``2k`` elements; after ``probes`` probes
without success the probe whose count was closest to ``k`` (in ratio, non-empty) is used.
Tie rule: ``|g| > thr`` (strict). A selection that would be empty falls back to the largest ``|g|``.
"""

from __future__ import annotations

import math

import torch

from compressors import estimators
from compressors._validate import raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.selection import Workspace, argmax_fallback, count_above, indices_above, magnitude
from compressors.sparse import Sparse


class RedSync(Compressor):
    """RedSync. Option: ``probes`` (int ≥ 1, default 10)."""

    name = "redsync"

    def __init__(self, density: float, probes: int = 10):
        super().__init__(density)
        if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
            raise ValueError(f"probes must be an int >= 1, got {probes!r}")
        self.probes = probes
        self._workspace = Workspace()

    def _compress(self, grad: torch.Tensor) -> Sparse:
        n = grad.numel()
        k = target_count(self.density, n)
        a = magnitude(grad, self._workspace)
        mu = estimators.mean(a)
        top = torch.amax(a).double()
        raise_if_not_finite(grad, mu)
        low, high = 0.0, 1.0
        best, best_error = None, math.inf
        for _ in range(self.probes):
            mid = 0.5 * (low + high)
            threshold = (mu + mid * (top - mu)).to(a.dtype)
            count = count_above(a, threshold, self._workspace)
            if k <= count <= 2 * k:
                best = threshold
                break
            if count > 0 and abs(math.log(count / k)) < best_error:
                best, best_error = threshold, abs(math.log(count / k))
            if count > 2 * k:
                low = mid
            else:
                high = mid
        if best is None:
            indices = argmax_fallback(a)
            best = a.index_select(0, indices)[0]
        else:
            indices = indices_above(a, best, self._workspace)
        return Sparse(grad.index_select(0, indices), indices, n, best)
