"""The selection result every compressor returns (the message a worker would send)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from compressors.messages.wire import sparse_bytes


@dataclass(frozen=True)
class Sparse:
    """A compressed gradient: ``values`` at ``indices`` of a vector of ``numel`` elements.

    - ``values``: selected values, same dtype and device as the gradient.
    - ``indices``: their positions (int64), same device, ascending unless a compressor says otherwise.
    - ``numel``: length of the original gradient.
    - ``threshold``: the magnitude threshold the estimator used (float) or ``None``.
      It is kept as a 0-d tensor internally and converted on first access, so compressing
      never forces a device->host copy of it.
    - ``stages``: number of estimation stages used (SIDCo) or ``None``.
    - ``dense``: the message is the whole vector (``none``): ``indices`` is ``arange(numel)``
      only conceptually and is not sent.
    - ``shared_indices``: every worker derives the same indices (Random-k with a shared seed),
      so only the values travel.
    - ``fallback``: the estimator's threshold missed the count rule
      (:data:`compressors.rules.COUNT_BAND`) and the exact top-k was sent instead
      (:func:`compressors.numerics.selection.guard_count`); ``threshold`` is then the k-th largest ``|g|``.
    """

    values: torch.Tensor
    indices: torch.Tensor
    numel: int
    threshold_tensor: torch.Tensor | None = field(default=None, repr=False)
    stages: int | None = None
    dense: bool = False
    shared_indices: bool = False
    fallback: bool = False

    @property
    def exchange(self) -> str:
        """How workers combine it: ``"allreduce"`` for ``dense`` and ``shared_indices`` messages
        (identical layout on every worker), ``"allgather"`` otherwise."""
        return "allreduce" if self.dense or self.shared_indices else "allgather"

    @property
    def threshold(self) -> float | None:
        """The magnitude threshold as a Python float (``None`` if the compressor has none)."""
        if self.threshold_tensor is None:
            return None
        return float(self.threshold_tensor)

    @property
    def selected(self) -> int:
        """Number of elements sent."""
        return int(self.values.numel())

    @property
    def density(self) -> float:
        """Achieved density: selected / numel (0 for an empty gradient)."""
        return self.selected / self.numel if self.numel else 0.0

    def wire_bytes(self) -> int:
        """Bytes on the wire (:mod:`compressors.messages.wire`): values in their own dtype plus int32
        indices (int64 beside 64-bit values).

        ``dense`` messages send ``numel * itemsize`` bytes; ``shared_indices`` messages send the
        values only.
        """
        itemsize = self.values.element_size()
        if self.dense:
            return self.numel * itemsize
        if self.shared_indices:
            return self.selected * itemsize
        return sparse_bytes(self.selected, itemsize)

    def phase_bytes(self) -> tuple[int, ...]:
        """Bytes per collective: one message, :meth:`wire_bytes` (bytes)."""
        return (self.wire_bytes(),)
