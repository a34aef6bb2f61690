"""Compressors without an estimator: ``none`` (send everything) and exact Top-k."""

from __future__ import annotations

import torch

from compressors._validate import raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.selection import Workspace, magnitude
from compressors.sparse import Sparse


class NoCompression(Compressor):
    """``none``: the dense gradient is the message (``wire_bytes = numel * itemsize``).

    ``indices`` is ``arange(numel)``, cached per size and device and shared between calls (read it,
    do not modify it); ``values`` is the gradient itself.
    """

    name = "none"

    def __init__(self, density: float = 1.0):
        super().__init__(density)
        self._positions: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _compress(self, grad: torch.Tensor) -> Sparse:
        raise_if_not_finite(grad, grad.sum(dtype=torch.float32 if grad.dtype != torch.float64 else None))
        key = (grad.numel(), grad.device)
        indices = self._positions.get(key)
        if indices is None:
            indices = torch.arange(grad.numel(), device=grad.device)
            self._positions = {key: indices}
        return Sparse(grad, indices, grad.numel(), dense=True)


class TopK(Compressor):
    """Exact Top-k: the ``k = max(1, round(density * n))`` largest ``|g|`` (``torch.topk``).

    Tie rule: exactly ``k`` elements are sent; among elements tied with the k-th largest
    magnitude, which ones are sent is up to ``torch.topk``. ``threshold`` is the k-th largest
    magnitude. Indices are returned in ascending order.
    """

    name = "topk"

    def __init__(self, density: float):
        super().__init__(density)
        self._workspace = Workspace()

    def _compress(self, grad: torch.Tensor) -> Sparse:
        k = target_count(self.density, grad.numel())
        a = magnitude(grad, self._workspace)
        top, indices = torch.topk(a, k, sorted=False)
        indices, _ = torch.sort(indices)
        values = grad.index_select(0, indices)
        raise_if_not_finite(grad, a.sum(dtype=torch.float32 if a.dtype != torch.float64 else None))
        return Sparse(values, indices, grad.numel(), torch.min(top))
