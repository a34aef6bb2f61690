"""The wire format of a compressed gradient and the rule for which collective carries it.

One home for what :class:`compressors.Sparse` counts, what the DDP hook
(:mod:`compressors.ddp`, :mod:`compressors.ddp.exchange`) really sends and what the simulator
charges (:mod:`simulator.iteration`). All sizes are bytes.

- **Values** travel in the gradient's own dtype (``value_itemsize`` bytes each).
- **Indices** travel as int32 (4 bytes), or int64 (8 bytes) beside 64-bit values: an index must
  fill a whole number of value slots when the hook bit-casts it into the value buffer
  (:func:`index_bytes`).
- **Counts**: the padded all-gather first all-gathers each rank's selection count as one int64
  (:data:`COUNT_BYTES`), then every rank's indices and values padded to the largest count
  (:func:`packed_slots`).
- **Quantized** messages (``int8``, ``fp8``: one byte per code; ``int4``: half a byte) send one
  code per element and one float32 scale per block (:func:`quantized_bytes`), all-gathered in one
  collective: their size is set by the bucket's elements, so no counts go first (:func:`counts_first`).
- **Values all-reduce** (shared-seed Random-k): every rank has the same indices, so the ``k``
  values are all-reduced with one more element, a failure flag (:data:`FLAG_ELEMENTS`).

Which collective (:func:`collective`): the one on the compressor's card
(:class:`compressors.work.cards.Card`): ``none``, the casts and PowerSGD all-reduce their message
whole; a compressor with a shared seed (Random-k's ``seed``) all-reduces its values when it is
given (every rank draws the same indices); the others go through an all-gather.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compressors.rules import target_count

COUNT_BYTES = 8
"""Bytes of one rank's selection count in phase 1 of the padded all-gather (one int64)."""

FLAG_ELEMENTS = 1
"""Extra elements (value dtype) of a values all-reduce: the failure flag after the ``k`` values."""

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"


def index_bytes(value_itemsize: int) -> int:
    """Bytes per index beside values of ``value_itemsize`` bytes: 8 (int64) for 64-bit values, else 4 (int32)."""
    return 8 if value_itemsize == 8 else 4


def sparse_bytes(count: int, value_itemsize: int) -> int:
    """Bytes of ``count`` values and their indices, unpadded (``Sparse.wire_bytes()``)."""
    return count * (value_itemsize + index_bytes(value_itemsize))


SCALE_BYTES = 4
"""Bytes of one block scale of a quantized message (float32)."""


def code_bytes(numel: int, bits: int = 8) -> int:
    """Bytes of the codes of ``numel`` elements at ``bits`` bits each (8: one a byte; 4: two a
    byte, the last byte half empty for an odd ``numel``)."""
    return -(-numel * bits // 8)


def quantized_bytes(numel: int, block: int, bits: int = 8) -> int:
    """Bytes of a block-quantized message of ``numel`` elements: its codes of ``bits`` bits each
    (:func:`code_bytes`) and one float32 scale (:data:`SCALE_BYTES`) per block of ``block``
    elements (the last one partial)."""
    return code_bytes(numel, bits) + -(-numel // block) * SCALE_BYTES


def quantized_packed_bytes(numel: int, block: int, bits: int = 8) -> int:
    """Bytes of one rank's buffer in the all-gather of block-quantized messages: its float32
    scales, its codes and a one-byte failure flag, padded to a multiple of 4 bytes (so that every
    rank's scales start 4-byte aligned in the gathered buffer)."""
    return -(-(quantized_bytes(numel, block, bits) + 1) // SCALE_BYTES) * SCALE_BYTES


def packed_slots(padded_count: int, value_itemsize: int) -> int:
    """Value-dtype elements of one rank's packed all-gather buffer for ``padded_count`` slots.

    Layout: ``padded_count`` indices bit-cast into ``r = index_bytes / value_itemsize`` value
    slots each, then ``padded_count`` values rounded up to a multiple of ``r`` (so that the
    buffer stays a whole number of indices long).
    """
    ratio = index_bytes(value_itemsize) // value_itemsize
    return padded_count * ratio + -(-padded_count // ratio) * ratio


def allgather_bytes(padded_count: int, value_itemsize: int) -> int:
    """Bytes one rank sends in the padded sparse all-gather: its count, then its packed buffer."""
    return COUNT_BYTES + packed_slots(padded_count, value_itemsize) * value_itemsize


def values_allreduce_bytes(k: int, value_itemsize: int) -> int:
    """Bytes of the shared-index values all-reduce of ``k`` values (the flag included)."""
    return (k + FLAG_ELEMENTS) * value_itemsize


def counts_first(name: str) -> bool:
    """Whether the padded all-gather of compressor ``name``'s messages exchanges every rank's count
    (:data:`COUNT_BYTES`) before them: a selection's size differs from rank to rank; a quantized
    message's is set by the bucket's elements, the same on every rank, so it is gathered in one
    collective (:class:`compressors.ddp.exchange.QuantizedAllGather`)."""
    from compressors import card

    return card(name).message != "quantized"


def collective(name: str, options: Mapping[str, Any] | None = None) -> str:
    """``"allreduce"`` or ``"allgather"``: the collective that carries compressor ``name``'s message
    (its card's :meth:`~compressors.work.cards.Card.collective_for`).

    ``options`` are the compressor's keyword options (as for ``compressors.create``).
    """
    from compressors import card

    return card(name).collective_for(options)


def allreduce_bytes(
    name: str, numel: int, density: float | None, value_itemsize: int = 4, options: Mapping[str, Any] | None = None
) -> int | None:
    """Bytes one rank puts into the all-reduce of a ``numel``-element bucket, where they are fixed
    by the compressor: a shared-index compressor (shared-seed ``randomk``) its ``k`` values and the
    flag, a dense message all-reduced whole (``none``, the casts) its declared wire bytes. ``None``
    for a compressor that does not all-reduce or whose size must be measured (a low-rank message:
    its size depends on the layer shapes, see :func:`compressors.powersgd.plan`)."""
    from compressors import card

    found = card(name)
    if found.collective_for(options) != ALLREDUCE:
        return None
    if found.shares_indices(options):
        return values_allreduce_bytes(target_count(float(density), numel), value_itemsize)
    if found.message == "lowrank":
        return None
    return int(found.declared.wire(numel, 1.0, value_itemsize))
