"""Compressors without an estimator: ``none`` (send everything) and exact Top-k."""

from __future__ import annotations

import torch

from compressors.work import reference as reference_work
from compressors._validate import raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.numerics.selection import Workspace, exact_topk
from compressors.messages.sparse import Sparse


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

    work = staticmethod(reference_work.none)


class TopK(Compressor):
    """Exact Top-k: the ``k = max(1, round(density * n))`` largest ``|g|``.

    Implementation: :func:`compressors.numerics.selection.exact_topk`, the fastest exact method for the
    device (``torch.topk`` on CUDA; on the CPU a sampled threshold guess, the fused
    above-threshold selection and ``torch.topk`` among the candidates).
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
        top = exact_topk(grad, k, self._workspace)
        raise_if_not_finite(grad, top.total)
        self.backend = top.backend
        return Sparse(grad.index_select(0, top.indices), top.indices, grad.numel(), torch.min(top.magnitudes))

    work = staticmethod(reference_work.topk)
