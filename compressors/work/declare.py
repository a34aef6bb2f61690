"""The vocabulary in which a compressor declares its work: :class:`Work` and the pieces shared by
several compressors' declarations.

A compressor declares the work of one compress and one decompress call beside its code, in a
torch-free companion module (``compressors/work/<module>.py`` for ``compressors/<module>.py``,
bound to the class as its ``work``) so that the cost model reads it without loading torch, and
with it (:class:`Declared`) what the cost model prices differently for it around its calls; see
:func:`compressors.work.work` for what it counts and docs/extending.md for how to add one. A
declaration is a function ``(n, density, itemsize, stages, rounds, backend, **counts) -> (compress,
decompress)``: ``n`` elements of ``itemsize`` bytes at target ``density``, the code path
``backend`` (``torch``, ``cuda``, ``native``, ``fused``), SIDCo's ``stages``, its loop count ``rounds``
(``None``: its own default, seen on gradient-like data) and, by keyword, the other data-dependent
counts it takes (``trim``, ``hits``, SIDCo's ``corrections``, ``adapt``, ``steps``, ``pool``,
``collects``). Units: elements, bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from compressors.messages.wire import sparse_bytes
from compressors.rules import target_count

FINITE_OPS = 5
"""Launches of 0-d tensor arithmetic in ``raise_if_not_finite``'s check of a sum, as the torch path
issues them (counted with a dispatch mode when the code was written)."""

ISFINITE_OPS = 4
"""Launches of 0-d tensor arithmetic in a finiteness check of a float threshold (likewise)."""

KINDS = ("map", "rewrite", "reduce", "minmax", "compare", "count", "log", "outer", "native", "native_select",
         "native_log")
"""Streaming kernels by what they compute per element (a device may be slower per element than
its memory for some): ``map`` (abs, add, clamp, copy, fill), ``rewrite`` (a map in place that
writes back into the lines it has just read, such as ``mul_`` of a buffer the call filled:
:mod:`costs.costmodel` lets its writes, like its reads, go at the cache's speed, and on a CPU
overlap its reads), ``reduce`` (sum, amax, norm),
``minmax`` (``aminmax`` of 16-bit values: two comparisons per element and a widening),
``outer`` (a rank-r product ``P·Qᵀ`` written out: a matrix product whose output is the whole
vector, ``2·r`` FLOPs per element),
``compare`` (``>``/``>=`` into a bool mask), ``count`` (``count_nonzero`` of a mask), ``log``
(logarithms), ``native`` (a fused C pass of statistics only: SIDCo's tails),
``native_select`` (a fused C pass that also compacts what lies above a threshold: the selection
primitive, SIDCo's pool and final selection), ``native_log`` (SIDCo's statistics with
logarithms)."""


@dataclass
class Work:
    """Work of one call. ``streams``: the streaming kernels as ``(kind, elements, bytes read,
    bytes written, cold)``; ``passes`` counts those over the whole vector; gathers, top-k, sorts and
    compaction are charged per element by the device (``sorts``: the length of each sort, whose rate
    per element depends on it); ``allocations``: bytes of each fresh
    buffer the call allocates; ``working_set_bytes``: what the call touches (how much of what it
    reads twice a cache still holds)."""

    passes: int = 0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    launches: int = 0
    syncs: int = 0
    streams: list[tuple[str, float, float, float, bool]] = field(default_factory=list)
    topk: list[tuple[float, float]] = field(default_factory=list)
    sorts: list[float] = field(default_factory=list)
    gather_elements: float = 0.0
    compact_elements: float = 0.0
    compact_hits: float = 0.0
    allocations: list[float] = field(default_factory=list)
    flops: float = 0.0
    working_set_bytes: float = 0.0
    host_bytes: float = 0.0

    def stream(self, elements: float, read: float, written: float, kind: str = "map", full: bool = False,
               cold: bool = False) -> Work:
        """A streaming kernel of ``kind`` over ``elements`` reading/writing ``read``/``written``
        bytes per element; ``cold``: what it reads comes from outside the call (state kept
        between calls, touched once per iteration), so it is read from memory even when the
        call's working set would fit in a cache."""
        if kind not in KINDS:
            raise ValueError(f"unknown kernel kind {kind!r}")
        self.passes += int(full)
        self.bytes_read += elements * read
        self.bytes_written += elements * written
        self.streams.append((kind, float(elements), elements * read, elements * written, cold))
        self.launches += 1
        return self

    def scalars(self, count: int) -> Work:
        """``count`` launches of 0-d arithmetic."""
        self.launches += count
        return self

    def sync(self, count: int = 1) -> Work:
        """``count`` device→host synchronisations."""
        self.syncs += count
        return self

    def to_host(self, nbytes: float) -> Work:
        """One device→host copy of ``nbytes`` read on the host (a synchronisation)."""
        self.syncs += 1
        self.host_bytes += nbytes
        return self

    def select_topk(self, elements: float, k: float) -> Work:
        """One ``torch.topk`` keeping ``k`` of ``elements``."""
        self.topk.append((float(elements), min(1.0, k / max(elements, 1.0))))
        self.launches += 1
        return self

    def sort(self, elements: float) -> Work:
        """One sort of ``elements``."""
        self.sorts.append(float(elements))
        self.launches += 1
        return self

    @property
    def sort_elements(self) -> float:
        """Elements sorted in all, over every sort of the call."""
        return sum(self.sorts)

    def gather(self, elements: float) -> Work:
        """One gather/scatter (``index_select``, ``index_add_``, ``index_copy_``) of ``elements``."""
        self.gather_elements += elements
        self.launches += 1
        return self

    def compact(self, elements: float, hits: float) -> Work:
        """One ``nonzero`` over ``elements`` finding ``hits`` (sizing its output syncs)."""
        self.compact_elements += elements
        self.compact_hits += hits
        self.launches += 1
        self.syncs += 1
        return self

    def allocate(self, nbytes: float) -> Work:
        """A fresh buffer of ``nbytes`` (a new tensor each call, not a reused workspace)."""
        self.allocations.append(float(nbytes))
        return self


@dataclass(frozen=True)
class CallWork:
    """Work of one compress call and one decompress call."""

    compress: Work
    decompress: Work


Declaration = Callable[..., tuple[Work, Work]]
"""A compressor's declaration: ``(n, density, itemsize, stages, rounds, backend, **counts)`` to
the work of one compress and one decompress call."""

Wire = Callable[[int, float, int], float]
"""Bytes one worker sends for ``(n, density, itemsize)``: ``n`` elements of ``itemsize`` bytes at
target ``density``."""

Residual = Literal["fresh", "decompressed", "sent"]
"""How error feedback makes a compressor's new residual (:class:`Declared`)."""


@dataclass(frozen=True)
class Declared:
    """What the cost model reads of one compressor: the work of its calls and what it prices
    differently for it around them (:func:`compressors.work.work`, :func:`compressors.work.wire_bytes`)."""

    work: Declaration
    """The work of one compress and one decompress call (the class binds it as its ``work``)."""
    wire: Wire
    """Bytes one worker sends (:data:`Wire`)."""
    residual: Residual = "sent"
    """Error feedback's new residual: ``fresh`` (a zero vector: everything was sent), ``decompressed``
    (``sub_`` of the message decompressed into a kept scratch buffer: dense and low-rank messages)
    or ``sent`` (``index_add_`` of the elements a call sent)."""
    sent: float = 1.0
    """Elements a call sends per target count ``k`` (RedSync's selection: about 1.5·k)."""
    sends_last_hits: bool = False
    """Whether what its last selecting pass kept (``hits[-1]``) is what a call sent."""
    fused: Callable[[int, float, float | None], bool] | None = None
    """Whether its own fused GPU path (``backend="fused"``) takes ``(n, density, pool)``; ``None``:
    it has none and runs what it runs on a GPU otherwise (``cuda``)."""
    eager_feedback: bool | Callable[[int, float], bool] = False
    """Whether its fused path keeps error feedback's eager passes (the add before the call, the
    new residual after it) rather than folding them into its first read (SIDCo's statistics kernel,
    DGC's first compaction), or a function of ``(n, density)`` saying so for a call; a declaration
    that folds it and takes an ``error_feedback`` keyword declares what the fold adds besides."""

    def eager_for(self, n: int, density: float) -> bool:
        """:attr:`eager_feedback` for an ``n``-element call at ``density``."""
        return self.eager_feedback(n, density) if callable(self.eager_feedback) else self.eager_feedback


def dense_wire(n: int, density: float, itemsize: int) -> float:
    """Bytes of the whole vector (``none``): ``n · itemsize``."""
    return float(n * itemsize)


def sparse_wire(n: int, density: float, itemsize: int) -> float:
    """Bytes of the sparse message of ``k`` values and their indices
    (:func:`compressors.messages.wire.sparse_bytes`)."""
    return float(sparse_bytes(target_count(density, n), itemsize))


def finite(w: Work, n: int, itemsize: int) -> None:
    """``raise_if_not_finite`` with a fresh sum: one read pass, scalar checks, one sync."""
    w.stream(n, itemsize, 0, "reduce", full=True).scalars(FINITE_OPS).sync()


def sparse_decompress(n: int, k: float, itemsize: int) -> Work:
    """:meth:`compressors.base.Compressor.decompress` of ``k`` values into a kept buffer: the
    buffer zeroed, the values scattered in."""
    return Work(working_set_bytes=n * itemsize).stream(n, 0, itemsize, full=True).gather(k)


def select(w: Work, n: int, hits: float, itemsize: int, backend: str, total: bool = False) -> None:
    """:func:`compressors.numerics.selection.select_above`. Torch path: ``|x|`` into a reused buffer, the
    ``>`` mask, ``nonzero`` (its one sync), optionally ``Σ|x|``, the hits' magnitudes. Native
    path (CPU float32): the threshold read back (one sync), one fused pass writing 8 bytes per
    hit (with ``total``: a second kernel over the hits, and ``Σ|x|`` wrapped in a tensor), the
    positions widened to int64. Fused path: :func:`fused_compaction` writing each hit's position
    and magnitude, the positions sorted, the magnitudes gathered in their order (with ``total``:
    the blocks' ``Σ|x|`` summed)."""
    if backend == "fused":
        fused_compaction(w, n, hits, itemsize, total)
        w.sort(hits).gather(hits)
        if total:
            w.stream(fused_blocks(n), 4, 0, "reduce")
        return
    if backend == "native":
        w.sync().stream(n, itemsize, 8 * hits / n, "native_select", full=True)
        if total:
            w.stream(hits, 4, 0, "native").scalars(1)
        w.stream(hits, 4, 8)
        return
    w.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 1, "compare", full=True).compact(n, hits)
    if total:
        w.stream(n, itemsize, 0, "reduce", full=True)
    w.gather(hits)


def count(w: Work, n: int, hits: float, itemsize: int, backend: str) -> None:
    """:func:`compressors.numerics.selection.count_above`: on the torch path ``|x|``, the mask,
    ``count_nonzero`` and its sync; natively a selection (:func:`select`); fused a compaction that
    writes no hit (:func:`fused_compaction`)."""
    if backend == "fused":
        fused_compaction(w, n, 0, itemsize)
        return
    if backend == "native":
        select(w, n, hits, itemsize, backend)
        return
    w.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 1, "compare", full=True)
    w.stream(n, 1, 0, "count", full=True).sync()


FUSED_BLOCK = 4096
"""Elements per program of the fused Triton kernels (:data:`compressors.kernels.fused.BLOCK`): each
writes its partial statistics per block (16 bytes from the statistics kernel, 12 from a tail's
compaction, 12 or 16 from the selection primitive's)."""


def fused_blocks(n: int) -> int:
    """Programs of the fused kernels over ``n`` elements (:data:`FUSED_BLOCK` each)."""
    return -(-n // FUSED_BLOCK)


def fused_compaction(w: Work, n: int, hits: float, itemsize: int, total: bool = False) -> None:
    """One compaction of the selection primitive's fused path
    (:func:`compressors.numerics.selection._compact`): a 0-d threshold of 16-bit data widened to
    float32 (one launch; float32 needs none), its int32 counter zeroed, the kernel (one read of
    ``x``; per hit an int64 position and a magnitude, per block three float32 partials and with
    ``total`` its ``Σ|x|``), the count read to the host with the threshold the kernel used (the one
    sync)."""
    w.scalars(int(itemsize != 4)).stream(1, 0, 4)
    per_block = 12 + 4 * total
    w.stream(n, itemsize, ((8 + itemsize) * hits + per_block * fused_blocks(n)) / max(n, 1), "compare", full=True)
    w.to_host(8)


def fused_selection(n: int, density: float, pool: float | None = None) -> bool:
    """Whether the selection primitive's fused path takes an ``n``-element call (DGC's, Gaussian-k's
    and RedSync's ``Declared.fused``): any size the Triton kernels serve (below 2³¹ elements)."""
    return n < 2 ** 31


def kept(hits: Sequence[float], i: int, default: float) -> float:
    """Elements kept by selecting pass ``i`` of a call: the recorded count when there is one."""
    return float(hits[i]) if i < len(hits) else default
