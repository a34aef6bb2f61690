"""Collectives for exchanging gradient selections between data-parallel ranks, and the four
exchanges a compression hook chooses among once per hook state (:func:`compressors.ddp.hooks.comm_hook`):
:class:`DenseAllReduce` (the whole bucket), :class:`ValuesAllReduce` (values at indices every rank
draws alike), :class:`PaddedAllGather` (each rank's own selection) and :class:`QuantizedAllGather`
(each rank's codes and scales). Each takes one rank's
:class:`Selection` of a bucket and starts its collectives, returning a :class:`Started`.

Every rank selects a different number of elements, and the all-gather collectives
of ``torch.distributed`` need equal sizes on every rank (uneven ``all_gather``
raises on gloo). :func:`sparse_allgather_sum` therefore runs the two-phase padded
all-gather:

1. all-gather the selection counts (one int64 per rank, ``compressors.messages.wire.COUNT_BYTES``);
2. pad every rank's selection to the largest count and all-gather one flat buffer
   per rank holding its indices (bit-cast into the value dtype with ``Tensor.view``,
   never converted by value) followed by its values;
3. scatter-add each rank's selection, rank by rank, into a dense buffer.

Each rank's indices are distinct, so the scatter-add of one rank never writes one
position twice and the sum is the same on every rank, bit for bit, also on CUDA
(no atomics race between ranks: the ranks are added in a fixed order).

Works on gloo (CPU tensors) and NCCL (CUDA tensors). Both flat all-gather entry
points are supported: ``all_gather_single`` (torch >= 2.13) and the older,
deprecated-in-2.13 ``all_gather_into_tensor``. On gloo the future of either
carries a list of chunks, so the result is always read from the output buffer
allocated here, never from the future's value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from compressors._validate import target_count
from compressors.messages.kinds import Quantized
from compressors.messages.wire import (FLAG_ELEMENTS, SCALE_BYTES, allgather_bytes, code_bytes, index_bytes,
                                       packed_slots, quantized_packed_bytes, sparse_bytes, values_allreduce_bytes)

GATHER_METHODS: tuple[str, ...] = ("auto", "single", "into_tensor")


@dataclass
class SparseExchange:
    """One rank's view of a sparse all-gather that is in flight.

    Attributes:
        future: completes with the dense sum (over ranks) of every rank's selection,
            a 1-D tensor of ``numel`` elements in the values' dtype, not divided by
            the world size.
        counts: the number of elements each rank selected, in rank order.
        padded_count: the largest count; every rank sent this many slots.
        bytes_sent: bytes this rank put into the collectives (bytes): the count
            (``compressors.messages.wire.COUNT_BYTES``) plus ``padded_count`` values and indices
            (``compressors.messages.wire.allgather_bytes``).
        payload_bytes: bytes of this rank's own selection without padding (bytes):
            its values in their dtype plus int32 (int64 for 64-bit values) indices.
    """

    future: torch.futures.Future
    counts: list[int]
    padded_count: int
    bytes_sent: int
    payload_bytes: int


def resolve_gather(method: str) -> str:
    """Return the concrete all-gather entry point (``single`` or ``into_tensor``) for ``method``.

    ``auto`` picks ``all_gather_single`` where this torch has it, else
    ``all_gather_into_tensor``. Raises ``ValueError`` for an unknown or unavailable method.
    """
    if method not in GATHER_METHODS:
        raise ValueError(f"gather method {method!r} is not one of {', '.join(GATHER_METHODS)}")
    if method == "auto":
        return "single" if hasattr(dist, "all_gather_single") else "into_tensor"
    if method == "single" and not hasattr(dist, "all_gather_single"):
        raise ValueError(f"gather method 'single' needs torch.distributed.all_gather_single (torch {torch.__version__} lacks it)")
    return method


def all_gather_flat(
    output: torch.Tensor,
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    method: str = "auto",
) -> dist.Work:
    """Start an all-gather of equal-sized 1-D ``tensor`` from every rank into ``output``.

    ``output`` must hold ``world_size * tensor.numel()`` elements; rank ``r``'s tensor
    lands at ``output[r * n:(r + 1) * n]``. Returns the asynchronous work handle.
    """
    if resolve_gather(method) == "single":
        return dist.all_gather_single(output, tensor, group=group, async_op=True)
    return dist.all_gather_into_tensor(output, tensor, group=group, async_op=True)


def index_dtype_for(values_dtype: torch.dtype) -> torch.dtype:
    """The integer dtype the indices travel as: int32, or int64 beside 64-bit values.

    The index dtype's size must be a multiple of the value dtype's size so that an
    index occupies a whole number of value slots when bit-cast.
    """
    return torch.int64 if index_bytes(values_dtype.itemsize) == 8 else torch.int32


def pack(values: torch.Tensor, indices: torch.Tensor, padded_count: int) -> torch.Tensor:
    """Pack one rank's selection into a flat buffer in the values' dtype, padded to ``padded_count``.

    Layout: ``padded_count`` indices bit-cast into the value dtype (``r`` slots each,
    ``r = index itemsize / value itemsize``), then ``padded_count`` values, then zero
    to ``r - 1`` slots so that the length is a multiple of ``r`` (so that every rank's
    chunk of the gathered buffer starts index-aligned). Padding slots are zero and are
    never read back (:func:`unpack_rank` uses the counts).
    """
    count = values.numel()
    if indices.numel() != count:
        raise ValueError(f"a selection has {count} values but {indices.numel()} indices")
    if count > padded_count:
        raise ValueError(f"a selection of {count} elements does not fit {padded_count} padded slots")
    idx_dtype = index_dtype_for(values.dtype)
    ratio = idx_dtype.itemsize // values.dtype.itemsize
    length = packed_slots(padded_count, values.dtype.itemsize)
    buffer = torch.zeros(length, dtype=values.dtype, device=values.device)
    buffer[: padded_count * ratio].view(idx_dtype)[:count] = indices.to(idx_dtype)
    buffer[padded_count * ratio : padded_count * ratio + count] = values
    return buffer


def unpack_rank(chunk: torch.Tensor, count: int, padded_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(values, indices)`` of the first ``count`` elements of one rank's packed ``chunk``.

    ``indices`` are int64 (ready for ``index_add_``), read back by bit-cast.
    """
    idx_dtype = index_dtype_for(chunk.dtype)
    ratio = idx_dtype.itemsize // chunk.dtype.itemsize
    indices = chunk[: padded_count * ratio].view(idx_dtype)[:count].long()
    values = chunk[padded_count * ratio : padded_count * ratio + count]
    return values, indices


def sparse_allgather_sum(
    values: torch.Tensor,
    indices: torch.Tensor,
    numel: int,
    group: dist.ProcessGroup | None = None,
    gather: str = "auto",
    out: torch.Tensor | None = None,
    error: str | None = None,
) -> SparseExchange:
    """Exchange this rank's selection with every rank and sum all selections densely.

    Args:
        values: the selected values (1-D, any float dtype, on the communication device).
        indices: their positions in ``[0, numel)``, distinct, any integer dtype, same length.
        numel: length of the dense vector (elements); must fit int32 for ≤ 32-bit values.
        group: process group (``None``: the default group).
        gather: ``auto``, ``single`` (``all_gather_single``) or ``into_tensor``
            (``all_gather_into_tensor``).
        out: optional dense 1-D buffer of ``numel`` elements (values' dtype) to write the
            sum into (it is zeroed first, once the gather has finished); a new one otherwise.
        error: set when this rank could not produce a selection (e.g. its compressor
            rejected the input); the rank then sends count -1 in phase 1 and every rank
            raises ``ValueError`` naming the failed ranks, so nobody waits for phase 2.

    Phase 1 (counts) is waited for here: the padded size must be known on the host to
    allocate phase 2's buffers (on CUDA this is one device-to-host sync), and issuing
    phase 2 from the calling thread keeps every rank's collectives in the same order
    (launching it from a completion callback could interleave two buckets' collectives
    differently on different ranks). Phase 2 is asynchronous; the returned
    :class:`SparseExchange` carries its future.

    Every rank must call this with the same ``numel``, ``gather`` and value dtype, and
    every rank must send at least one element: an all-zero count everywhere would ask
    the collectives for empty buffers, which several backends reject, so it raises
    ``ValueError`` on every rank alike instead.
    """
    if values.dim() != 1 or indices.dim() != 1:
        raise ValueError("sparse exchange needs 1-D values and indices")
    if index_dtype_for(values.dtype) == torch.int32 and numel > torch.iinfo(torch.int32).max:
        raise ValueError(f"a dense vector of {numel} elements does not fit int32 indices")
    method = resolve_gather(gather)
    world = dist.get_world_size(group)
    device = values.device

    count = torch.tensor([-1 if error is not None else values.numel()], dtype=torch.int64, device=device)
    counts_out = torch.empty(world, dtype=torch.int64, device=device)
    all_gather_flat(counts_out, count, group, method).wait()
    counts = [int(c) for c in counts_out.tolist()]
    failed = [rank for rank, c in enumerate(counts) if c < 0]
    if failed:
        reason = f": {error}" if error is not None else ""
        raise ValueError(f"sparse exchange aborted on every rank: rank(s) {failed} could not select{reason}")
    padded = max(counts)
    if padded == 0:
        raise ValueError("every rank selected 0 elements: refusing to all-gather empty buffers")

    payload = pack(values, indices, padded)
    gathered = torch.empty(world * payload.numel(), dtype=payload.dtype, device=device)
    work = all_gather_flat(gathered, payload, group, method)
    dense = out if out is not None else torch.empty(numel, dtype=values.dtype, device=device)
    if dense.numel() != numel or dense.dtype != values.dtype:
        raise ValueError(f"output buffer has {dense.numel()} {dense.dtype} elements, expected {numel} {values.dtype}")

    def scatter(_: torch.futures.Future) -> torch.Tensor:
        dense.zero_()
        for rank, chunk in enumerate(gathered.view(world, payload.numel())):
            if counts[rank]:
                rank_values, rank_indices = unpack_rank(chunk, counts[rank], padded)
                dense.index_add_(0, rank_indices, rank_values)
        return dense

    return SparseExchange(
        future=work.get_future().then(scatter),
        counts=counts,
        padded_count=padded,
        bytes_sent=allgather_bytes(padded, values.element_size()),
        payload_bytes=sparse_bytes(values.numel(), values.element_size()),
    )


@dataclass(frozen=True)
class Selection:
    """What one rank hands to an exchange for one bucket.

    Attributes:
        values: the values to send (the bucket's dtype and device); the whole bucket for
            :class:`DenseAllReduce`.
        indices: their positions in the bucket (``None`` for the whole bucket).
        payload_bytes: bytes of this rank's own message without padding or control (bytes).
        compress_s: seconds spent selecting it (memory and compressor; 0 for the whole bucket).
        error: why this rank could not select (its compressor raised ``ValueError``), else
            ``None``: the exchange still joins its first collective and makes every rank raise.
        message: the compressed message itself, for an exchange that sends it whole
            (:class:`QuantizedAllGather`; ``values`` is then empty), else ``None``.
        decompress: the compressor's ``decompress(message, out=...)``, with ``message``.
    """

    values: torch.Tensor
    indices: torch.Tensor | None
    payload_bytes: int
    compress_s: float = 0.0
    error: str | None = None
    message: Any = None
    decompress: Callable[..., torch.Tensor] | None = None


@dataclass(frozen=True)
class Started:
    """An exchange in flight.

    Attributes:
        future: completes with the bucket's buffer holding the sum over ranks (not divided by
            the world size).
        selected: elements this rank sent (the bucket's size on the dense path).
        padded: value slots every rank sent (the largest count on the all-gather path).
        bytes_sent: bytes this rank handed to the collectives (bytes), padding and control
            (the all-gather's count, the values all-reduce's flag) included.
    """

    future: torch.futures.Future
    selected: int
    padded: int
    bytes_sent: int


class Exchange:
    """How a hook's buckets travel between ranks, chosen once per hook state. ``path`` names it in
    the hook's per-bucket log; ``compresses`` says whether a bucket is compressed before it is sent
    (``False``: the whole bucket travels)."""

    path = ""
    compresses = True

    def start(self, buffer: torch.Tensor, selection: Selection, group: dist.ProcessGroup | None) -> Started:
        """Start exchanging ``selection`` of the bucket whose flat gradient is ``buffer``; the sum
        over ranks lands in ``buffer``."""
        raise NotImplementedError


@dataclass(frozen=True)
class DenseAllReduce(Exchange):
    """All-reduce of the whole bucket (compressor ``none``)."""

    path = "allreduce"
    compresses = False

    def start(self, buffer, selection, group):
        dense_bytes = buffer.numel() * buffer.element_size()
        work = dist.all_reduce(buffer, group=group, async_op=True)
        return Started(work.get_future(), buffer.numel(), buffer.numel(), dense_bytes)


@dataclass(frozen=True)
class ValuesAllReduce(Exchange):
    """All-reduce of ``[values..., failure flag]`` where every rank draws the same indices
    (shared-seed Random-k at ``density``: ``k = target_count(density, numel)`` values), then a
    scatter of the summed values into the bucket. A rank that could not select sets the flag
    (:data:`~compressors.messages.wire.FLAG_ELEMENTS`) and every rank raises ``ValueError``."""

    density: float
    path = "allreduce-values"

    def start(self, buffer, selection, group):
        k = target_count(self.density, buffer.numel())
        message = torch.zeros(k + FLAG_ELEMENTS, dtype=buffer.dtype, device=buffer.device)
        if selection.error is None:
            message[:k] = selection.values
        else:
            message[k] = 1
        work = dist.all_reduce(message, group=group, async_op=True)
        error, indices = selection.error, selection.indices

        def scatter(_: torch.futures.Future) -> torch.Tensor:
            if bool(message[k] != 0):
                reason = f": {error}" if error is not None else ""
                raise ValueError(f"values all-reduce aborted on every rank: a rank could not select{reason}")
            return buffer.zero_().index_add_(0, indices, message[:k])

        return Started(work.get_future().then(scatter), k, k, values_allreduce_bytes(k, buffer.element_size()))


@dataclass(frozen=True)
class PaddedAllGather(Exchange):
    """The two-phase padded all-gather of every rank's selection (:func:`sparse_allgather_sum`)
    through ``gather`` (``"single"`` or ``"into_tensor"``, :func:`resolve_gather`)."""

    gather: str
    path = "allgather"

    def start(self, buffer, selection, group):
        exchange = sparse_allgather_sum(selection.values, selection.indices, buffer.numel(), group, self.gather,
                                        out=buffer, error=selection.error)
        return Started(exchange.future, int(selection.values.numel()), exchange.padded_count, exchange.bytes_sent)


@dataclass(frozen=True)
class QuantizedAllGather(Exchange):
    """All-gather of every rank's block-quantized message (``int8``, ``fp8``, ``int4``: its float32
    scales and its codes, the same sizes on every rank, and a failure flag byte;
    :func:`compressors.messages.wire.quantized_packed_bytes`) through ``gather``; each rank then
    dequantizes every rank's message and adds them, rank by rank, into the bucket (the network
    cannot sum codes whose scales differ). A rank that could not quantize sets its flag and every
    rank raises ``ValueError``. ``block``: elements per scale; ``bits``: bits per code;
    ``codes``: the dtype the code bytes are read back as (the quantizer's ``code_dtype``)."""

    gather: str
    block: int
    bits: int
    codes: torch.dtype
    path = "allgather-quantized"

    def start(self, buffer, selection, group):
        world, n = dist.get_world_size(group), buffer.numel()
        blocks = -(-n // self.block)
        first, last = SCALE_BYTES * blocks, SCALE_BYTES * blocks + code_bytes(n, self.bits)
        size = quantized_packed_bytes(n, self.block, self.bits)
        payload = torch.zeros(size, dtype=torch.uint8, device=buffer.device)
        if selection.error is None:
            payload[:first] = selection.message.scales.view(torch.uint8)
            payload[first:last] = selection.message.codes.view(torch.uint8)
        else:
            payload[-1] = 1
        gathered = torch.empty(world * size, dtype=torch.uint8, device=buffer.device)
        work = all_gather_flat(gathered, payload, group, self.gather)
        error, decompress, dtype = selection.error, selection.decompress, buffer.dtype

        def dequantize_and_sum(_: torch.futures.Future) -> torch.Tensor:
            chunks = gathered.view(world, size)
            failed = [rank for rank, flag in enumerate(chunks[:, -1].tolist()) if flag]
            if failed:
                reason = f": {error}" if error is not None else ""
                raise ValueError(f"quantized all-gather aborted on every rank: rank(s) {failed} could not "
                                 f"quantize{reason}")
            buffer.zero_()
            scratch = torch.empty_like(buffer)
            for chunk in chunks:
                message = Quantized(chunk[first:last].view(self.codes), chunk[:first].view(torch.float32),
                                    self.block, dtype, n, self.bits)
                buffer.add_(decompress(message, out=scratch))
            return buffer

        return Started(work.get_future().then(dequantize_and_sum), n, n, size)
