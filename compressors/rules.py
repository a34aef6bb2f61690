"""The few counting rules the cost model (:mod:`compressors.work`, :mod:`costs.costmodel`) shares
with the tensor code (each compressor's own facts are on its card, :mod:`compressors.work.cards`).

This module imports nothing but the standard library, so projecting an iteration (``sidco
simulate``/``compare`` on a layout) never loads torch; the tensor modules import these rules
from here (one copy each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TOPK_SAMPLE = 4096
"""Minimum sample size (elements) of :func:`compressors.numerics.selection.exact_topk`'s threshold guess."""


def trains_with_error_feedback(name: str) -> bool:
    """Whether training through :func:`compressors.ddp.hook` with its default memory keeps a
    residual for compressor ``name`` (its card's ``error_feedback``): what profiles and the cost model
    assume of a compressor's calls."""
    from compressors import card

    return card(name).error_feedback


def target_count(density: float, numel: int) -> int:
    """Number of elements a compressor aims to send: ``max(1, round(density * numel))``."""
    return max(1, round(density * numel)) if numel else 0


COUNT_BAND = (0.5, 2.0)
"""The count rule of the threshold compressors that aim at the count (SIDCo with its in-call
corrections, the default; DGC; RedSync): a call sends between ``0.5·k`` and ``2·k`` elements,
never the whole vector unless ``k`` is all of it, never none (:func:`keeps_count`). A call whose
threshold misses it sends the exact top-``k`` instead (:func:`compressors.numerics.selection.guard_count`;
the message says ``fallback``)."""

ESTIMATOR_BAND = (0.1, 10.0)
"""The count rule of a threshold read off a fit alone, with nothing that steers its count
(Gaussian-k's three ×0.5/×1.5 corrections; SIDCo with ``adapt="paper"`` or ``corrections=0``):
within 10× of ``k`` either way its miss is the estimator's own quality, which the testbed
reports instead of hiding (Gaussian-k sends ≈ 6·k at δ = 0.001 on gradient-like data); beyond it
the fit has degenerated (a constant, uniform or subnormal vector, one huge outlier) and the
exact top-``k`` is sent, as for :data:`COUNT_BAND`."""


def keeps_count(count: int, k: int, numel: int, band: tuple[float, float] = COUNT_BAND) -> bool:
    """Whether a selection of ``count`` of ``numel`` elements, aiming at ``k``, keeps ``band``
    (:data:`COUNT_BAND` or :data:`ESTIMATOR_BAND`) and is not the whole vector while ``k < numel``."""
    low, high = band
    return low * k <= count <= high * k and (count < numel or k >= numel)


def sample_stride(numel: int, density: float, sample_ratio: float) -> int:
    """Stride of DGC's strided sample: odd multiple-of-32-plus-one, leaving enough samples."""
    wanted = max(math.ceil(numel * sample_ratio), math.ceil(2.0 / density))
    if numel <= wanted:
        return 1
    stride = math.ceil(numel / wanted / 32) * 32 + 1
    while stride > 1 and numel // stride < wanted:
        stride = max(1, stride - 8)
    return stride


def stage_probabilities(density: float, stages: int, first_ratio: float) -> list[float]:
    """Tail mass per stage under the paper's split: ``[p₁, p₂, …]`` with product ``density``.

    One stage (``[density]``) when ``stages == 1`` or ``density >= first_ratio``.
    """
    if stages == 1 or density >= first_ratio:
        return [density]
    rest = (density / first_ratio) ** (1.0 / (stages - 1))
    return [first_ratio] + [rest] * (stages - 1)


@dataclass(frozen=True)
class Block:
    """One matrix of a low-rank message: the layer at ``offset`` of ``rows × cols`` elements,
    approximated with ``rank`` columns (P is ``rows × rank``, Q is ``cols × rank``)."""

    offset: int
    rows: int
    cols: int
    rank: int


def plan(shapes: Sequence[Sequence[int]] | None, numel: int, rank: int, min_compression_rate: float
         ) -> tuple[tuple[Block, ...], tuple[tuple[int, int], ...], int]:
    """Split a flat vector of ``numel`` elements holding ``shapes`` into compressed blocks (grouped
    by shape, first-seen order) and uncompressed ``(offset, numel)`` slices; also return the padded
    length (``numel`` unless ``shapes`` is ``None``: then the square side², see module docstring)."""
    if shapes is None:
        side = math.isqrt(max(numel - 1, 0)) + 1 if numel else 0
        r = min(side, rank)
        return ((Block(0, side, side, r),) if side else ()), (), side * side
    blocks: dict[tuple[int, int], list[Block]] = {}
    rest: list[tuple[int, int]] = []
    offset = 0
    for shape in shapes:
        size = math.prod(shape)
        if len(shape) >= 1 and size > 0:
            rows, cols = shape[0], size // shape[0]
            r = min(rows, cols, rank)
            if (rows + cols) * r * min_compression_rate < rows * cols:
                blocks.setdefault((rows, cols), []).append(Block(offset, rows, cols, r))
                offset += size
                continue
        if size:
            rest.append((offset, size))
        offset += size
    if offset != numel:
        raise ValueError(f"layer shapes hold {offset} elements, the gradient has {numel}")
    return tuple(b for group in blocks.values() for b in group), tuple(rest), numel
