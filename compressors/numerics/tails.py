"""What SIDCo's stage loop reads of a gradient, whichever backend reads it: the statistics it
fits (:class:`Moments`, :class:`Tail`), the reads a backend provides (:class:`Ops`: stage 1's
statistics, a tail's, counts above a threshold from a pool of the largest magnitudes or by a full
pass, the selection), the pool's rules (:data:`GUESS_MARGIN`, :data:`WILD_TRY`,
:data:`POOL_REGROW`), the counts and tails of a pool held on the host, thresholds rounded to a
gradient's dtype (:func:`round_to`) and the overflow that sends a call to scaled data
(:class:`Overflow`).

The stage loop itself, its fits and corrections, is :meth:`compressors.sidco.SIDCo._chain`; the
backends are its eager ones (:mod:`compressors.sidco`: native C kernels, torch) and the fused Triton
one (:mod:`compressors.kernels.sidco_fused`), which shares these and imports nothing of
:mod:`compressors.sidco`.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np
import torch

GUESS_MARGIN = 0.9
"""The pool holds ``|g| > 0.9·τ``, ``τ`` the threshold the previous call of the same size selected
at (with more than one stage scaled by how this call's ``η₁`` moved; with one, as it was, the pool
collected with stage 1's statistics). A try below the pool collects a new one at 0.9 × the try."""

WILD_TRY = 0.5
"""A try below ``0.5 ×`` the pool's threshold (a correction step that overshot, e.g. the first
secant step after a stage-1 fit that selected a hundredth of ``k``) is counted by a full pass that
collects nothing."""

POOL_REGROW = 4
"""The torch and fused paths: a pool that filled its slots is collected again into this many times as many (at
most ``n``, which cannot fill)."""


class Moments(NamedTuple):
    """What a fit needs, as host floats: mean, variance (divisor n), mean of ln."""

    mean: float
    var: float = 0.0
    mean_log: float = 0.0


class Tail(NamedTuple):
    """Exceedances of a threshold: count, Σ excess and Σ excess² (host values)."""

    count: int
    excess: float
    excess_sq: float

    def moments(self) -> Moments:
        """Mean and variance of the excess (count clamped at 1)."""
        c = max(self.count, 1)
        mean = self.excess / c
        return Moments(mean, max(self.excess_sq / c - mean * mean, 0.0))



class Overflow(Exception):
    """A statistic overflowed on finite data: redo the call on scaled data."""


class Ops:
    """What the stage loop needs from a backend. Every value it returns is on the host.

    The pool: the magnitudes above ``pool_at`` (collected when a stage's statistics are read, at
    a level the stage loop picks from the previous call), from which every later count and the
    selection are taken without reading the whole vector again; :meth:`count` below the pool is
    a full pass (:meth:`collect` a new pool on the way, or :meth:`full_count`).
    """

    pool_at = math.inf
    pool_size = 0
    pool_capacity: int | None = None
    bounds_left = 3
    """Tries a call may take as "too many" without counting them (:meth:`probe`): three; a
    correction that keeps falling below the pool counts its tries."""

    def first(self, pool_at: float | None) -> Moments:
        """Stage 1's statistics of all magnitudes (and the pool above ``pool_at``)."""
        raise NotImplementedError

    def tail(self, threshold: float, pool_at: float | None) -> Tail:
        """Statistics of the exceedances of ``threshold`` (and the pool above ``pool_at``)."""
        raise NotImplementedError

    def pool_count(self, threshold: float) -> int:
        """``#(|g| > threshold)`` from the pool (``threshold >= pool_at``)."""
        raise NotImplementedError

    def collect(self, pool_at: float) -> None:
        """A new pool: every magnitude above ``pool_at`` (a full pass)."""
        raise NotImplementedError

    def full_count(self, threshold: float) -> int:
        """``#(|g| > threshold)`` by a full pass that keeps no pool."""
        raise NotImplementedError

    def select(self, threshold: float, count: int) -> torch.Tensor:
        """Positions (int64, ascending) of the ``count`` magnitudes above ``threshold``."""
        raise NotImplementedError

    def values(self, grad: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The values of ``grad`` at ``indices`` (what :meth:`select` or the count guard chose):
        a gather."""
        return grad.index_select(0, indices)

    def probe(self, threshold: float, enough: float) -> tuple[int, bool]:
        """``(count, exact)`` for a correction's try: below a pool of more than ``enough``
        elements the try certainly selects too many, and ``(pool size, False)`` says so without a
        pass; otherwise the exact :meth:`count`."""
        if threshold >= self.pool_at:  # the common case: the pool answers
            return self.pool_count(threshold), True
        if self.pool_at != math.inf and self.pool_size > enough and self.bounds_left:
            self.bounds_left -= 1
            return self.pool_size, False
        return self.count(threshold), True

    def count(self, threshold: float) -> int:
        """``#(|g| > threshold)``, exact: from the pool when it holds the threshold, else a full
        pass that collects a new pool just below it (or only counts, for a try far below the pool)."""
        if threshold >= self.pool_at:
            return self.pool_count(threshold)
        if self.pool_at != math.inf and threshold < WILD_TRY * self.pool_at:
            return self.full_count(threshold)
        self.collect(GUESS_MARGIN * threshold)
        return self.pool_count(threshold)



def host_tail(values: np.ndarray, threshold: float) -> Tail:
    """The exceedances of ``threshold`` among a pool's values on the host (magnitudes, or signed
    values widened to float64), compared in their own dtype."""
    t = values.dtype.type(threshold)
    above = values[values > t]
    excess = above.astype(np.float64) - float(t)
    return Tail(int(above.size), float(excess.sum()), float(np.dot(excess, excess)))


def host_count(values: np.ndarray, threshold: float) -> int:
    """``#(values > threshold)`` over a pool's values on the host, compared in their own dtype."""
    return int(np.count_nonzero(values > values.dtype.type(threshold)))



F32 = struct.Struct("<f")
"""A float32's bytes (little-endian): rounding to float32, and its bits."""

_PACK = {torch.float32: F32, torch.float16: struct.Struct("<e")}


def round_to(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` (as the comparison ``|g| > value`` in that dtype sees it), −0 made +0."""
    packer = _PACK.get(dtype)
    if packer is not None:  # float32 and float16: round to nearest even through the C type, as a cast does
        try:
            return packer.unpack(packer.pack(value))[0] + 0.0
        except OverflowError:
            return math.copysign(math.inf, value)
    if dtype == torch.float64:
        return float(value) + 0.0
    if dtype != torch.bfloat16:
        raise TypeError(f"no rounding to {dtype}")
    with np.errstate(over="ignore"):
        bits = np.array([value], dtype=np.float32).view(np.uint32)[0].item()
        if math.isfinite(value):
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # to nearest, ties to even
        else:
            bits &= 0xFFFF0000
        return float(np.array([bits], dtype=np.uint32).view(np.float32)[0]) + 0.0

