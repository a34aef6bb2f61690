"""The dense, low-rank and quantized siblings of :class:`compressors.messages.sparse.Sparse`: every
message a compressor can return, and how it travels.

Every message (``Sparse``, :class:`Dense`, :class:`LowRank`, :class:`Quantized`) answers the same questions, so that
replay, the simulator and the DDP hook treat every compressor alike:

- ``numel``: elements of the original (uncompressed) gradient;
- ``selected``: scalars this worker puts on the wire (sparse: values sent; dense and quantized:
  ``numel``; low-rank: the elements of P, Q and the uncompressed rest);
- ``density``: ``selected / numel`` (0 for an empty gradient);
- ``wire_bytes()``: bytes this worker sends (bytes);
- ``phase_bytes()``: the same bytes split per collective, in the order they run (bytes);
- ``exchange``: how workers combine messages: ``"allgather"`` (every worker's selection is
  gathered and summed: sparse values + indices, quantized codes + scales) or ``"allreduce"``
  (messages of identical layout are summed elementwise by the network: dense casts, low-rank
  factors, shared-index values);
- ``threshold`` / ``stages``: ``None`` for the dense, low-rank and quantized kinds; ``fallback``
  (the count guard of the threshold compressors) ``False``.

Decompression lives in the compressor (``compressor.decompress(message)``), since only it knows
how to undo its own message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

import torch

from compressors.messages.sparse import Sparse
from compressors.messages.wire import quantized_bytes
from compressors.rules import Block


@dataclass(frozen=True)
class Dense:
    """The whole gradient cast to a narrower wire dtype (``fp16``, ``bf16``).

    - ``values``: the cast gradient (wire dtype), ``numel`` elements, on the gradient's device;
    - ``dtype``: the gradient's own dtype, restored by ``decompress``.
    """

    values: torch.Tensor
    dtype: torch.dtype

    exchange: ClassVar[str] = "allreduce"
    threshold: ClassVar[None] = None
    stages: ClassVar[None] = None
    fallback: ClassVar[bool] = False

    @property
    def numel(self) -> int:
        """Elements of the gradient."""
        return int(self.values.numel())

    @property
    def selected(self) -> int:
        """Scalars sent: every element."""
        return self.numel

    @property
    def density(self) -> float:
        """1 (0 for an empty gradient)."""
        return 1.0 if self.numel else 0.0

    def wire_bytes(self) -> int:
        """``numel`` × the wire dtype's size (bytes)."""
        return self.numel * self.values.element_size()

    def phase_bytes(self) -> tuple[int, ...]:
        """One all-reduce of the cast vector (bytes)."""
        return (self.wire_bytes(),)


@dataclass(frozen=True)
class LowRank:
    """A PowerSGD message: per compressed layer the factors P (``rows × r``) and Q (``cols × r``)
    of ``M ≈ P·Qᵀ``, and the uncompressed ``rest``.

    - ``blocks``: where each matrix lies in the flat gradient, and its rank;
    - ``p``, ``q``: the factors of every block packed in one flat vector each (block order),
      in the gradient's dtype: each is all-reduced as one buffer;
    - ``rest``: the elements of the layers sent uncompressed (1-D layers and matrices too small to
      be worth compressing), concatenated in gradient order;
    - ``rest_slices``: ``(offset, numel)`` of each uncompressed layer in the flat gradient;
    - ``numel``: elements of the gradient.

    Exchange: three all-reduces, in PyTorch's order: the rest, then P, then (after the
    orthogonalisation and ``Q = Mᵀ·P`` on the compute stream) Q.
    """

    blocks: tuple[Block, ...]
    p: torch.Tensor
    q: torch.Tensor
    rest: torch.Tensor
    rest_slices: tuple[tuple[int, int], ...]
    numel: int

    exchange: ClassVar[str] = "allreduce"
    threshold: ClassVar[None] = None
    stages: ClassVar[None] = None
    fallback: ClassVar[bool] = False

    @property
    def selected(self) -> int:
        """Scalars sent: the elements of P, Q and the rest."""
        return int(self.p.numel() + self.q.numel() + self.rest.numel())

    @property
    def density(self) -> float:
        """``selected / numel`` (0 for an empty gradient)."""
        return self.selected / self.numel if self.numel else 0.0

    def wire_bytes(self) -> int:
        """Bytes of P, Q and the rest (bytes)."""
        return self.selected * self.p.element_size()

    def phase_bytes(self) -> tuple[int, ...]:
        """Bytes of the three all-reduces: rest, P, Q (bytes)."""
        size = self.p.element_size()
        return (int(self.rest.numel()) * size, int(self.p.numel()) * size, int(self.q.numel()) * size)


@dataclass(frozen=True)
class Quantized:
    """A block-quantized gradient: per block of ``block`` consecutive elements one float32
    ``scale`` and per element a signed ``code``, the element being ``code · scale``.

    - ``codes``: the codes, on the gradient's device: one a byte (``int8``'s int8 integers,
      ``fp8``'s float8_e4m3fn numbers) or ``bits`` = 4, two a byte (``int4``'s uint8 bytes, element
      ``i`` in byte ``i``'s lower nibble and element ``i + ⌈numel/2⌉`` in its upper one; the
      quantizer that made them unpacks them);
    - ``scales``: ``⌈numel / block⌉`` scales (float32), the last block's covering the tail;
    - ``block``: elements per block;
    - ``dtype``: the gradient's own dtype, restored by ``decompress``;
    - ``numel``: elements of the gradient;
    - ``bits``: bits per code on the wire (8 or 4).

    Exchange: codes and scales differ from worker to worker, so the network cannot sum them: every
    worker's message is all-gathered, and each worker dequantizes and averages them all.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    block: int
    dtype: torch.dtype
    numel: int
    bits: int = 8

    exchange: ClassVar[str] = "allgather"
    threshold: ClassVar[None] = None
    stages: ClassVar[None] = None
    fallback: ClassVar[bool] = False

    @property
    def selected(self) -> int:
        """Scalars sent: every element (as its code)."""
        return self.numel

    @property
    def density(self) -> float:
        """1 (0 for an empty gradient)."""
        return 1.0 if self.numel else 0.0

    def wire_bytes(self) -> int:
        """The codes and the scales (bytes; :func:`compressors.messages.wire.quantized_bytes`)."""
        return quantized_bytes(self.numel, self.block, self.bits)

    def phase_bytes(self) -> tuple[int, ...]:
        """One all-gather of codes and scales (bytes)."""
        return (self.wire_bytes(),)


Message = Union[Sparse, Dense, LowRank, Quantized]
"""What ``Compressor.compress`` returns."""

__all__ = ["Block", "Dense", "LowRank", "Message", "Quantized", "Sparse"]
