"""The compressor role: ``compress(grad) -> message`` and ``decompress(message) -> dense``.

Messages are :class:`~compressors.messages.sparse.Sparse` (values at indices) or, for the dense,
low-rank and quantized compressors, the siblings in :mod:`compressors.messages.kinds`.
"""

from __future__ import annotations

import math

import torch

from compressors._validate import check_density, check_gradient
from compressors.messages.sparse import Sparse


class Compressor:
    """Base class of every compressor.

    Subclasses implement :meth:`_compress` for a validated, non-empty 1-D floating tensor.
    ``density`` is the target fraction of elements sent, in (0, 1].

    Class attributes: ``name`` (the registry name), ``message`` (the kind of message it
    returns: ``"sparse"``, ``"dense"``, ``"lowrank"`` or ``"quantized"``) and ``work``, its declared work: the
    work of one compress and one decompress call as a function of size, density and loop counts
    (:mod:`compressors.work.declare`), a torch-free function of the companion module
    ``compressors/work/<module>.py`` that the cost model reads and tests/test_compressors_work.py
    holds to what ``_compress`` does. Instance attribute ``backend``: what ran
    the last call, ``"native"`` (the fused C kernels), ``"torch"`` (torch on the CPU) or
    ``"cuda"`` (torch on a GPU); before the first call, ``"torch"``.
    """

    name = "base"
    message = "sparse"
    backend = "torch"
    _feedback: tuple[torch.Tensor, torch.Tensor, float] | None = None
    """During :meth:`compress_feedback`: ``(grad, residual, pending)`` for ``_compress`` to fold in."""
    _exactly_above: float | None = None
    """``η`` where the last call folding error feedback sent exactly ``|x| > η``, else ``None``."""

    def __init__(self, density: float):
        self.density = check_density(density)

    def compress(self, grad: torch.Tensor) -> Sparse:
        """Select what to send from ``grad`` (1-D floating tensor on any device).

        Raises ``ValueError`` for a tensor that is not 1-D floating or holds NaN/Inf.
        A non-empty gradient never yields an empty selection.
        """
        grad = check_gradient(grad)
        self.backend = "cuda" if grad.is_cuda else "torch"
        if grad.numel() == 0 and self.message == "sparse":
            return Sparse(grad, torch.empty(0, dtype=torch.int64, device=grad.device), 0)
        return self._compress(grad)

    def _compress(self, grad: torch.Tensor) -> Sparse:
        raise NotImplementedError

    def compress_feedback(self, grad: torch.Tensor, residual: torch.Tensor, out: torch.Tensor,
                          pending: float | None = None) -> tuple[Sparse, float | None] | None:
        """Error feedback fused into the call: write ``grad + residual`` (same shape, dtype and
        device; the residual read as :func:`compressors.memory.pending_residual` of ``pending``
        when given) into ``out`` and compress it, as ``compress(torch.add(grad, residual, out=out))``
        does. Returns the message and ``η`` where it is exactly ``out``'s ``|x| > η`` (the caller may
        leave zeroing it in the residual pending), else ``None`` in its place; ``None`` (nothing
        written) where this compressor has no such path for ``grad`` (:meth:`_folds_feedback`):
        the caller adds them itself (:class:`compressors.memory.ErrorFeedback`). SIDCo's and DGC's
        fused paths have one: their first kernel reads both and writes the sum. A subclass's
        ``_compress`` finds ``(grad, residual, pending)`` in ``self._feedback`` during the call
        and leaves ``η`` in ``self._exactly_above``."""
        grad = check_gradient(grad)
        if grad.numel() == 0 or residual.dtype != grad.dtype or residual.shape != grad.shape or \
                not residual.is_contiguous() or not out.is_contiguous() or not self._folds_feedback(grad):
            return None
        self._feedback = (grad, residual, math.inf if pending is None else pending)
        self._exactly_above = None
        try:
            message = self.compress(out)
        finally:
            self._feedback = None
        return message, self._exactly_above

    def _folds_feedback(self, grad: torch.Tensor) -> bool:
        """Whether this compressor folds error feedback into its call on the non-empty ``grad``
        (:meth:`compress_feedback`); none does by default."""
        return False

    def reseed(self, seed: int) -> None:
        """Make the following random draws a function of ``seed`` (an int ≥ 0) alone.

        Replays call it before each call with a seed derived from (replay, worker,
        iteration, bucket) so identical replays select identically. Deterministic
        compressors ignore it; randomised ones (``dgc``, ``randomk``) override it.
        """

    def decompress(self, sparse: Sparse, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return the dense vector of ``sparse``: zeros where nothing was sent.

        ``out`` (optional) is a buffer of ``sparse.numel`` elements of the values' dtype and device
        to reuse; it is overwritten and returned.
        """
        values = sparse.values
        if out is None:
            out = torch.empty(sparse.numel, dtype=values.dtype, device=values.device)
        elif out.shape != (sparse.numel,) or out.dtype != values.dtype:
            raise ValueError(f"out buffer must be 1-D {values.dtype} of {sparse.numel} elements, "
                             f"got {out.dtype} {tuple(out.shape)}")
        if sparse.dense:
            return out.copy_(values)
        out.zero_()
        return out.index_copy_(0, sparse.indices, values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, density={self.density})"
