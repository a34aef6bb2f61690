"""RedSync's trimmed threshold search (Fang et al., 2019).

Binary search of ``thr = μ + t·(max − μ)`` over ``t ∈ [0, 1]`` on ``a = |g|`` (``μ`` its mean),
accepting the first probe that selects between ``k`` and ``2k`` elements; after ``probes`` probes
without success the probe whose count was closest to ``k`` (in ratio, non-empty) is used.
Tie rule: ``|g| > thr`` (strict). A selection outside the count rule (:data:`compressors.rules.COUNT_BAND`;
none found, or the closest probe still too far from ``k``) sends the exact top-``k`` instead.
Range-safe: when the mean of ``|g|`` overflows (finite ``|g|`` near fp32's maximum) it is computed
on ``|g| / 2^⌈log₂ max|g|⌉`` and scaled back. Probes and the selection go through the shared
primitive :func:`compressors.numerics.selection.select_above` / ``count_above`` (the Triton compaction
with ``backend="fused"``, or ``"auto"`` on a GPU with Triton installed: :mod:`compressors.kernels.backends`).
"""

from __future__ import annotations

import math

import torch

from compressors.numerics import estimators
from compressors.work import redsync as redsync_work
from compressors._validate import power_of_two_above, raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.kernels import backends
from compressors.numerics.selection import Workspace, count_above, guard_count, magnitude, select_above
from compressors.messages.sparse import Sparse
from units import check_count


class RedSync(Compressor):
    """RedSync. Options: ``probes`` (int ≥ 1, default 10), ``backend`` (``"auto"``, ``"torch"``
    or ``"fused"``: :mod:`compressors.kernels.backends`). After a call, :attr:`backend` names what
    ran its probes and selection (``"native"``, ``"fused"``, ``"torch"`` or ``"cuda"``)."""

    name = "redsync"

    def __init__(self, density: float, probes: int = 10, backend: str = "auto"):
        super().__init__(density)
        self.backend_choice = backends.check(backend)
        check_count(probes, "probes")
        self.probes = probes
        self._workspace = Workspace()

    def _compress(self, grad: torch.Tensor) -> Sparse:
        n = grad.numel()
        k = target_count(self.density, n)
        a = magnitude(grad, self._workspace)
        top = torch.amax(a).double()
        mu = estimators.mean(a)
        if not bool(torch.isfinite(mu)):
            raise_if_not_finite(grad)
            scale = power_of_two_above(grad)
            mu = estimators.mean(torch.div(a, scale, out=a)) * scale
        limit = torch.finfo(grad.dtype).max
        low, high = 0.0, 1.0
        best, best_error = None, math.inf
        for _ in range(self.probes):
            mid = 0.5 * (low + high)
            threshold = torch.clamp(mu + mid * (top - mu), max=limit).to(grad.dtype)
            count, self.backend = count_above(grad, threshold, self._workspace,
                                              backend=self.backend_choice)
            if k <= count <= 2 * k:
                best = threshold
                break
            if count > 0 and abs(math.log(count / k)) < best_error:
                best, best_error = threshold, abs(math.log(count / k))
            if count > 2 * k:
                low = mid
            else:
                high = mid
        indices, count = torch.empty(0, dtype=torch.int64, device=grad.device), 0
        if best is not None:
            found = select_above(grad, best, self._workspace, backend=self.backend_choice)
            indices, count, self.backend = found.indices, found.count, found.backend
        indices, best, fallback = guard_count(grad, indices, count, best, k, self._workspace)
        return Sparse(grad.index_select(0, indices), indices, n, best, fallback=fallback)

    work = staticmethod(redsync_work.redsync)
