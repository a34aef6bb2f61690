"""The memory role: state kept between calls per tensor key, composed with any compressor.

- :class:`ErrorFeedback`: the residual ``r``: ``g ← g + r``; send ``C(g)``; ``r ← g − decompress(C(g))``.
  Where the compressor sent exactly ``|g| > η`` (SIDCo's fused path), the subtraction is left
  *pending*: ``r`` keeps ``g`` and ``η``, and the next call's first read zeroes ``|r| > η`` as it goes
  (:func:`pending_residual`); every read of the residual from outside sees it done.
- :class:`DGCMemory`: DGC's momentum correction and momentum-factor masking: accumulate the
  velocity ``u ← m·u + g``, ``v ← v + u``; send ``C(v)``; zero ``u`` and ``v`` where sent.

State is kept per ``key`` (a parameter name, a bucket id: any hashable), on the gradient's device,
in the gradient's dtype.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from compressors._validate import check_gradient
from compressors.base import Compressor
from compressors.messages.kinds import Message, Sparse


class Memory:
    """Base of the memory role: wraps a compressor, keeps per-key state."""

    def __init__(self, compressor: Compressor):
        if not isinstance(compressor, Compressor):
            raise ValueError(f"expected a compressor, got {type(compressor).__name__}")
        self.compressor = compressor
        self._state: dict[Hashable, dict[str, torch.Tensor]] = {}

    @property
    def state(self) -> dict[Hashable, dict[str, torch.Tensor]]:
        """The state tensors per key (the dict itself: a caller may set a key's slot), every pending
        update applied first (:meth:`settle`)."""
        self.settle()
        return self._state

    def settle(self, key: Hashable = None, every: bool = True) -> None:
        """Apply any update left pending in the state (of ``key``, or of every key); none here."""

    def _slot(self, key: Hashable, grad: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        slot = self._state.get(key)
        if slot is None or slot[names[0]].shape != grad.shape or slot[names[0]].dtype != grad.dtype \
                or slot[names[0]].device != grad.device:
            slot = {name: torch.zeros_like(grad) for name in names}
            self._state[key] = slot
        return slot

    def decompress(self, sparse: Message, out: torch.Tensor | None = None) -> torch.Tensor:
        """Same as the wrapped compressor's ``decompress``."""
        return self.compressor.decompress(sparse, out)


def pending_residual(residual: torch.Tensor, pending: float) -> torch.Tensor:
    """``residual`` with what the call before selected zeroed, in place: ``where(|r| > pending, 0,
    r)`` (``pending`` rounded to the residual's dtype), the rule SIDCo's fused statistics kernel
    applies as it reads a residual (:func:`compressors.kernels.fused.launch_statistics`). NaN fails the
    comparison and stays, as the selection never takes it. For a message that is exactly the
    ``|x| > pending`` of ``x``, this is ``x − decompress(message)`` bit for bit (``x − x`` is +0)."""
    return residual.masked_fill_(residual.abs() > pending, 0)


def _subtract_sent(buffer: torch.Tensor, message: Message, compressor: Compressor, slot: dict[str, torch.Tensor]
                   ) -> None:
    """``buffer -= decompress(message)`` in place, building no fresh full-size vector: sparse
    messages are scattered; dense 16-bit and low-rank ones are decompressed into a scratch buffer
    kept in ``slot`` (a same-dtype ``sub_`` is several times faster on a CPU than one that widens
    16-bit values as it goes)."""
    if not isinstance(message, Sparse):
        scratch = slot.get("scratch")
        if scratch is None:
            scratch = slot["scratch"] = torch.empty_like(buffer)
        buffer.sub_(compressor.decompress(message, out=scratch))
    elif message.dense:
        buffer.sub_(message.values)
    elif message.values.numel():  # nothing sent, nothing to take back (empty tensors would alias)
        buffer.index_add_(0, message.indices, message.values, alpha=-1)


class ErrorFeedback(Memory):
    """Error feedback (residual memory) around ``compressor``.

    Conservation: after any sequence of calls for one key,
    ``Σ inputs = Σ decompress(sent) + residual(key)`` (up to floating-point rounding).
    """

    def __init__(self, compressor: Compressor):
        super().__init__(compressor)
        self._pending: dict[Hashable, tuple[torch.Tensor, float]] = {}
        """Per key, a residual tensor still holding what was sent, and the threshold η that sent
        exactly its ``|r| > η`` (it holds only for that very tensor: a slot replaced drops it)."""

    def compress(self, grad: torch.Tensor, key: Hashable = None) -> Message:
        """Compress ``grad + residual[key]`` and keep what was not sent as the new residual."""
        grad = check_gradient(grad)
        slot = self._slot(key, grad, ("residual",))
        spare = slot.get("spare")  # a slot holds one shape, dtype and device: a new one has no spare yet
        if spare is None:
            spare = torch.empty_like(grad)
        # grad + residual into a spare buffer kept from the last call: no fresh full-size vector
        # per call, and the residual (and what is pending in it) stays as it was if compressing raises
        pending = self._pending.get(key)
        held = pending[1] if pending is not None and pending[0] is slot["residual"] else None
        fused = self.compressor.compress_feedback(grad, slot["residual"], spare, held)
        corrected = spare
        if fused is None:  # no fused error feedback for this tensor: add them here
            self.settle(key, every=False)
            corrected = torch.add(grad, slot["residual"], out=spare)
            message, left = self.compressor.compress(corrected), None
        else:
            message, left = fused
        self._pending.pop(key, None)
        slot["spare"] = slot["residual"]
        if isinstance(message, Sparse) and message.dense:  # the message holds ``corrected`` itself
            slot["residual"] = torch.zeros_like(grad)
            return message
        if left is None:
            _subtract_sent(corrected, message, self.compressor, slot)
        else:
            self._pending[key] = (corrected, left)
        slot["residual"] = corrected
        return message

    def settle(self, key: Hashable = None, every: bool = True) -> None:
        """Zero in the residual (of ``key``; of every key when ``every``) what the last call sent
        and left pending (:func:`pending_residual`), so it reads as the eager residual exactly."""
        for name in list(self._pending) if every else [key]:
            pending = self._pending.pop(name, None)
            slot = self._state.get(name)
            if pending is not None and slot is not None and pending[0] is slot["residual"]:
                pending_residual(*pending)

    def residual(self, key: Hashable = None) -> torch.Tensor | None:
        """The residual kept for ``key`` (``None`` before the first call)."""
        self.settle(key, every=False)
        slot = self._state.get(key)
        return None if slot is None else slot["residual"]


class DGCMemory(Memory):
    """DGC momentum correction with momentum-factor masking (Lin et al., ICLR 2018).

    ``momentum`` in [0, 1). The optimizer that consumes the decompressed result should then
    run without its own momentum (DGC moves momentum into this memory).
    """

    def __init__(self, compressor: Compressor, momentum: float = 0.9):
        super().__init__(compressor)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)

    def compress(self, grad: torch.Tensor, key: Hashable = None) -> Message:
        """Accumulate velocity, compress it, and zero momentum and velocity where sent (everywhere
        for dense and low-rank messages, which send every position)."""
        grad = check_gradient(grad)
        slot = self._slot(key, grad, ("momentum", "velocity"))
        u, v = slot["momentum"], slot["velocity"]
        u.mul_(self.momentum).add_(grad)
        v.add_(u)
        sparse = self.compressor.compress(v.clone())
        if not isinstance(sparse, Sparse) or sparse.dense:
            u.zero_()
            v.zero_()
        else:
            u.index_fill_(0, sparse.indices, 0)
            v.index_fill_(0, sparse.indices, 0)
        return sparse
