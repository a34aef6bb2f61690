"""SIDCo's fused path: the stage loop of :meth:`compressors.sidco.SIDCo._chain` reading the data
through the Triton kernels of :mod:`compressors.kernels.fused` (``backend="fused"``, or ``"auto"`` on a
CUDA tensor when Triton is present; :func:`compressors.kernels.fused.serves` says which tensors).

The stage loop, its fits, count-targeted split, corrections, in-call stages and count guard are
the eager path's own (host float arithmetic on what a read brings back), so for the same
statistics the thresholds, and for the same threshold the selection, are the eager path's: every
count is an exact count of ``|x| > η`` with ``η`` rounded to the gradient's dtype. What differs is
how the data are read. A *read* launches what it needs back to back and brings everything to the
host in **one** transfer of one byte buffer (:class:`_Read`): stage 1's statistics (the
statistics kernel: ``Σ|x|``, ``Σx²``, ``max|x|``, ``#(x ≠ 0)`` in float32 per block, summed on
the host in float64; SIDCo-GP's ``Σ ln max(|x|, LOG_FLOOR)`` in the same kernel, likewise), a later stage's
statistics above a shift (a compaction that keeps nothing: its count and ``Σ(|x| − t)``,
``Σ(|x| − t)²``), and the pool (a compaction at the pool's level writing the survivors' positions
and values, as int32 and float32, into the buffer's first ``capacity`` slots; at stage 1 the
statistics kernel compacts it in its own read, the level being known before the call). Every later
count, a later stage's statistics above the pool's level and the selection are then computed on
the host from the pool (positions sorted there, then uploaded with their values: no sort, no
gather on the device).

A call of one stage after a call of the same size (the pool's guess held): the statistics kernel
(with error feedback reading the residual, zeroing its pending ``|r| > η`` as it goes, and writing
``g + r``), which also compacts the pool, one transfer (the call's one synchronisation), the
selected positions and values uploaded in one host→device copy: two launches, and the gradient is
read once. No launch zeroes the counters the compactions add to (:class:`_Counters`). Extra cost,
only where it is needed: a pool that outgrew its slots is taken again (one read), a try below the
pool reads the whole vector again (as on the eager path), more stages read a tail each (stage 2's
from the whole vector, with the pool), and a statistic that overflows float32 (``|x|`` beyond
about 1e19, or non-finite data) runs the call on the eager torch path instead (which rescales or
refuses as it always does), so selections stay the eager path's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from compressors.numerics import estimators
from compressors.kernels import fused
from compressors._validate import target_count
from compressors.numerics.tails import POOL_REGROW, Moments, Ops, Overflow, Tail, host_count, host_tail, round_to
from compressors.work.sidco import pool_slots

HEADROOM = 1.0
"""The read buffer grows to twice what a read needs (its pool's slots vary from call to call): a
new buffer costs one launch, the zeroing of its counters (:class:`_Counters`)."""


class _Read:
    """One byte buffer on the device, laid out for what one read brings back, and its transfer."""

    def __init__(self, ws, device: torch.device, blocks: int, statistics: bool, logs: bool, tail: bool,
                 capacity: int):
        sizes = {"counters": 16, "logs": 4 * blocks * logs, "stats": 16 * blocks * statistics, "tail": 12 * blocks * tail,
                 "slots": 8 * capacity}
        self.offsets, at = {}, 0
        for name, size in sizes.items():
            self.offsets[name] = (at, size)
            at += -(-size // 8) * 8
        self.buffer = ws.at_least("fused-read", at, torch.uint8, device, headroom=HEADROOM)

    def view(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The region ``name`` of the buffer as a 1-D tensor of ``dtype``."""
        at, size = self.offsets[name]
        return self.buffer[at:at + size].view(dtype)

    def fetch(self, slots: int) -> np.ndarray:
        """The buffer up to and with its first ``slots`` pool slots on the host (one device→host
        transfer: a synchronisation; :meth:`rest` reads more slots after it)."""
        return _to_host(self.buffer[:self.offsets["slots"][0] + 8 * slots])

    def rest(self, data: np.ndarray, slots: int) -> np.ndarray:
        """``data`` (what :meth:`fetch` read) followed by the pool's slots up to ``slots``: one more
        transfer."""
        return np.concatenate([data, _to_host(self.buffer[data.size:self.offsets["slots"][0] + 8 * slots])])

    def host(self, data: np.ndarray, name: str, dtype: type) -> np.ndarray:
        """The region ``name`` of fetched ``data`` as numpy ``dtype``."""
        at, size = self.offsets[name]
        return data[at:at + size].view(dtype)


def _to_host(buffer: torch.Tensor) -> np.ndarray:
    """``buffer`` (bytes) on the host (one device→host transfer: a synchronisation). From a GPU it
    lands in a page-locked buffer of PyTorch's caching host allocator (an asynchronous copy at the
    link's rate, then the one wait for the stream); a CPU tensor (the interpreter's) is copied."""
    if not buffer.is_cuda:
        return np.array(buffer.cpu().numpy())
    host, data = _host_bytes(buffer.numel(), buffer.device)
    host.copy_(buffer, non_blocking=True)
    torch.cuda.current_stream(buffer.device).synchronize()
    return data


class _Counters:
    """The two pairs of int32 counters at the head of a device's read buffer (a tail's count, the
    pool's count), kept between calls so that no call launches a zeroing of its own: a call's
    compactions add to one pair, which its statistics kernel finds zero (the call before zeroed it),
    while that kernel zeroes the other pair for the next call. ``parity``: the pair the next call
    adds to; ``buffer``: the address of the read buffer whose counters these are (a new buffer has
    both pairs zeroed once)."""

    def __init__(self) -> None:
        self.parity, self.buffer = 0, None

    def claim(self, read: _Read) -> None:
        """Zero both pairs of ``read``'s buffer unless it is the buffer of the last call."""
        if read.buffer.data_ptr() != self.buffer:
            read.view("counters", torch.int32).zero_()
            self.buffer = read.buffer.data_ptr()


class FusedOps(Ops):
    """The Triton kernels behind :class:`compressors.numerics.tails.Ops` (module docstring); every value
    it returns is on the host. The pool is kept on the host: its magnitudes (float32) and
    positions, in the order the compaction wrote them."""

    def __init__(self, owner, grad: torch.Tensor, logs: bool, variance: bool, capacity: int | None,
                 fetched: int | None = None):
        self.owner, self.grad, self.n = owner, grad, grad.numel()
        self.logs, self.variance, self.ws = logs, variance, owner._workspace
        self.variance_tail = owner.tail_needs_var
        self.blocks = fused.programs(self.n)
        self.pool_capacity = capacity if capacity is not None else pool_slots(self.n, 0, target_count(owner.density,
                                                                                                     self.n))
        self.pool_fetched = fetched  # the guessed pool's slots its read brings back (all of them: None)
        self.counters = owner._counters.setdefault(grad.device, _Counters())
        self.pair = self.counters.parity  # this call's pair, zero at its start
        self.clean = True  # nothing has added to this call's pair yet
        self.host_pool: np.ndarray | None = None
        self.host_values: np.ndarray | None = None
        self.host_positions: np.ndarray | None = None
        self.uploaded: tuple[torch.Tensor, torch.Tensor] | None = None  # (indices, values) of select
        # (gradient, residual, its pending threshold) summed into ``grad`` by stage 1
        self.feedback, owner._feedback = owner._feedback, None

    def _rounded(self, threshold: float) -> float:
        return round_to(threshold, self.grad.dtype)

    def _read(self, statistics: bool = False, tail: float | None = None, pool: float | None = None,
              capacity: int = 0, fetched: int | None = None) -> tuple[np.ndarray, _Read]:
        """Launch stage 1's statistics (``statistics``; with ``pool`` the pool's compaction in the
        same kernel), a tail's statistics above ``tail`` and the pool above ``pool`` into
        ``capacity`` slots, then one transfer of the first ``fetched`` of them (default all; a pool
        that filled more has the rest read after it); a pool that outgrew its slots is taken again
        into :data:`~compressors.numerics.tails.POOL_REGROW` times as many."""
        g = self.grad
        read = _Read(self.ws, g.device, self.blocks, statistics, statistics and self.logs, tail is not None,
                     capacity if pool is not None else 0)
        self.counters.claim(read)
        pairs = read.view("counters", torch.int32).view(2, 2)
        counters = pairs[self.pair]
        if not self.clean and (tail is not None or pool is not None):
            counters.zero_()  # a second read of the call adding to its pair
        if pool is not None:
            # positions and values interleaved, 8 bytes a slot: a prefix of the region holds the first hits whole
            level, slots = self._rounded(pool), (read.view("slots", torch.int32), read.view("slots", torch.float32)[1:])
        if statistics:
            source, residual, pending = self.feedback if self.feedback is not None else (g, None, math.inf)
            fused.launch_statistics(source, residual, g, read.view("stats", torch.float32), pairs[1 - self.pair], pending,
                                    read.view("logs", torch.float32) if self.logs else None,
                                    fused.Pool(level, counters[1:2], *slots, capacity, 2) if pool is not None else None)
            if self.blocks:  # the pair it zeroed is the next call's
                self.counters.parity = 1 - self.pair
            self.feedback = None
        scratch = self.ws.at_least("fused-parts", 3 * max(self.blocks, 1), torch.float32, g.device)
        if tail is not None:
            fused.launch_compact(g, self._rounded(tail), counters[0:1], counters, scratch, read.view("tail", torch.float32),
                                 0)
        if pool is not None and not statistics:
            fused.launch_compact(g, level, counters[1:2], *slots, scratch, capacity, slot=2)
        self.clean = self.clean and tail is None and pool is None
        wanted = 0 if pool is None else capacity if fetched is None else min(fetched, capacity)
        data = read.fetch(wanted)
        if pool is not None:
            size = int(read.host(data, "counters", np.int32)[2 * self.pair + 1])
            if size > capacity and capacity < self.n:
                self.pool_capacity = min(self.n, POOL_REGROW * capacity)
                self._read(pool=pool, capacity=self.pool_capacity)
            else:
                if size > wanted:
                    data = read.rest(data, size)
                self.pool_at, self.pool_size = pool, size
                pairs = read.host(data, "slots", np.int32)[:2 * size]
                self.host_values = pairs[1::2].view(np.float32)
                self.host_pool = np.abs(self.host_values)
                self.host_positions = pairs[0::2]
        return data, read

    def first(self, pool_at):
        data, read = self._read(statistics=True, pool=pool_at, capacity=self.pool_capacity, fetched=self.pool_fetched)
        sums = read.host(data, "stats", np.float32).reshape(-1, fused.STATISTICS).astype(np.float64).sum(0)
        total, squares = float(sums[0]), float(sums[1])
        if not math.isfinite(total) or (self.variance and not math.isfinite(squares)):
            raise Overflow
        n = self.n
        mean = total / n
        var = max(squares / n - mean * mean, 0.0) if self.variance else 0.0
        mean_log = estimators.mean_log_from_sums(float(read.host(data, "logs", np.float32).astype(np.float64).sum()),
                                                 int(sums[3]), n) if self.logs else 0.0
        return Moments(mean, var, mean_log)

    def tail(self, threshold, pool_at):
        if self.host_pool is not None and threshold >= self.pool_at:
            return host_tail(self.host_pool, threshold)
        data, read = self._read(tail=threshold, pool=pool_at, capacity=self.pool_capacity, fetched=self.pool_fetched)
        sums = read.host(data, "tail", np.float32).reshape(-1, fused.SURVIVORS).astype(np.float64).sum(0)
        count = int(read.host(data, "counters", np.int32)[2 * self.pair])
        if not (math.isfinite(sums[1]) and math.isfinite(sums[2])):
            raise Overflow
        return Tail(count, float(sums[1]), float(sums[2]) if self.variance_tail else 0.0)

    def pool_count(self, threshold):
        return host_count(self.host_pool, threshold)

    def collect(self, pool_at):
        self._read(pool=pool_at, capacity=self.pool_capacity)

    def full_count(self, threshold):
        data, read = self._read(tail=threshold)
        return int(read.host(data, "counters", np.int32)[2 * self.pair])

    def select(self, threshold, count):
        if self.host_pool is None or threshold < self.pool_at:  # no pool holds it: one as large as the count
            self.pool_capacity = max(count, 1)
            self.collect(threshold)
        above = self.host_pool > np.float32(threshold)
        positions = self.host_positions[above]
        order = np.argsort(positions)
        chosen, values = positions[order].astype(np.int64), _dtype_bytes(self.host_values[above][order], self.grad.dtype)
        device = self.grad.device
        packed, data = _host_bytes(chosen.nbytes + values.size, device)
        np.concatenate([chosen.view(np.uint8), values], out=data)  # the values need ≤ 8-byte alignment
        out = torch.empty(packed.numel(), dtype=torch.uint8, device=device)
        out.copy_(packed, non_blocking=device.type == "cuda")  # one host→device copy (no wait)
        self.uploaded = (out[:chosen.nbytes].view(torch.int64), out[chosen.nbytes:].view(self.grad.dtype))
        return self.uploaded[0]

    def values(self, grad, indices):
        if self.uploaded is not None and indices is self.uploaded[0]:
            return self.uploaded[1]  # came with the positions: no gather
        return super().values(grad, indices)


def _host_bytes(size: int, device: torch.device) -> tuple[torch.Tensor, np.ndarray]:
    """A host byte buffer of ``size`` bytes for a transfer with ``device``, as a tensor and a numpy
    view of the same memory: page-locked for a GPU (from PyTorch's caching host allocator, which
    keeps it from reuse until the copies recorded on it are done: copies run asynchronously at the
    link's rate), plain for the CPU."""
    if device.type == "cuda":
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return host, host.numpy()
    data = np.empty(size, dtype=np.uint8)
    return torch.from_numpy(data), data


def _dtype_bytes(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The bytes of float32 ``values`` that ``dtype`` holds exactly (they were read from a tensor
    of it) as ``dtype``: float32 as they are, float16 converted (exact), bfloat16 the upper half of
    each float32 (exact: no rounding happens)."""
    if dtype == torch.float16:
        return values.astype(np.float16).view(np.uint8)
    if dtype == torch.bfloat16:
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return values.view(np.uint8)


__all__ = ["FusedOps", "HEADROOM"]
