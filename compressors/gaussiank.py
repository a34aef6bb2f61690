"""Gaussian-k (Shi et al., 2019): threshold from a normal fit of ``g``, then a few corrections.

``η = |μ| + z_{1−δ/2}·σ`` with ``μ, σ`` the mean and standard deviation of ``g``; then up to
``corrections`` (3) rounds: ×0.5 if fewer than ``2k/3`` are selected, ×1.5 if more than ``4k/3``.
Tie rule: ``|g| > η`` (strict). A final count more than 10× from ``k`` (:data:`compressors.rules.ESTIMATOR_BAND`:
none, as on a constant vector or one huge outlier, or hundreds of ``k`` on uniform magnitudes) sends
the exact top-``k`` instead.
Range-safe: when ``μ`` or ``σ²`` overflow (finite ``|g|`` near fp32's maximum), they are computed
on ``g / 2^⌈log₂ max|g|⌉`` and scaled back; the threshold is kept in float64, so one beyond the
dtype's range selects nothing and the corrections bring it back into range. Counting and selecting go through the shared
primitive :func:`compressors.numerics.selection.select_above` (the fused kernel on float32 CPU tensors;
the Triton compaction with ``backend="fused"``, or ``"auto"`` on a GPU with Triton installed:
:mod:`compressors.kernels.backends`).
"""

from __future__ import annotations

from statistics import NormalDist

import torch

from compressors.numerics import estimators
from compressors.work import gaussiank as gaussiank_work
from compressors._validate import power_of_two_above, raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.kernels import backends
from compressors.rules import ESTIMATOR_BAND
from compressors.numerics.selection import Workspace, guard_count, select_above
from compressors.messages.sparse import Sparse


class GaussianK(Compressor):
    """Gaussian-k. Options: ``corrections`` (int ≥ 0, default 3), ``backend`` (``"auto"``,
    ``"torch"`` or ``"fused"``: :mod:`compressors.kernels.backends`). After a call,
    :attr:`backend` names what ran its selections (``"native"``, ``"fused"``, ``"torch"`` or ``"cuda"``)."""

    name = "gaussiank"

    def __init__(self, density: float, corrections: int = 3, backend: str = "auto"):
        super().__init__(density)
        self.backend_choice = backends.check(backend)
        if isinstance(corrections, bool) or not isinstance(corrections, int) or corrections < 0:
            raise ValueError(f"corrections must be an int >= 0, got {corrections!r}")
        self.corrections = corrections
        self._z = NormalDist().inv_cdf(1.0 - self.density / 2.0) if self.density < 1 else 0.0
        self._workspace = Workspace()

    def _compress(self, grad: torch.Tensor) -> Sparse:
        n = grad.numel()
        k = target_count(self.density, n)
        mu, var = estimators.mean_and_var(grad)
        scale = 1.0
        if not bool(torch.isfinite(mu + var)):
            raise_if_not_finite(grad)
            scale = power_of_two_above(grad)
            mu, var = estimators.mean_and_var(grad / scale)
        # the threshold in float64 (``level``), so that one beyond the dtype's range (+Inf in it:
        # nothing is above) still comes back into range when a correction scales it down
        level = (mu.abs() + self._z * torch.sqrt(var)) * scale
        threshold = level.to(grad.dtype)
        found = select_above(grad, threshold, self._workspace, backend=self.backend_choice)
        for _ in range(self.corrections):
            if found.count < 2 * k / 3:
                factor = 0.5
            elif found.count > 4 * k / 3:
                factor = 1.5
            else:
                break
            level = torch.where(torch.isfinite(threshold), threshold.double(), level) * factor
            threshold = level.to(grad.dtype)
            found = select_above(grad, threshold, self._workspace, backend=self.backend_choice)
        self.backend = found.backend
        indices, reported, fallback = guard_count(grad, found.indices, found.count,
                                                  torch.clamp(threshold, max=torch.finfo(grad.dtype).max), k,
                                                  self._workspace, ESTIMATOR_BAND)
        return Sparse(grad.index_select(0, indices), indices, n, reported, fallback=fallback)

    work = staticmethod(gaussiank_work.gaussiank)
