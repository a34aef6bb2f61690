"""PowerSGD (Vogels et al., NeurIPS 2019) as PyTorch's ``powerSGD_hook`` computes it, on one worker.

Layout. ``shapes`` lists the layer shapes packed, in order, in the flat gradient. A layer is
the matrix ``M`` of ``(shape[0], rest)`` (a 1-D layer of n elements is ``n × 1``, as PyTorch views
it); it is compressed with rank ``r = min(rows, cols, rank)`` when that saves enough,
``(rows + cols)·r·min_compression_rate < rows·cols`` (PyTorch's rule: 1-D layers only pass it with
``min_compression_rate < 1``); layers not worth it and 0-d ones go uncompressed (the *rest*).
Without ``shapes`` the whole vector is one square matrix of side ``⌈√n⌉``, zero-padded, as
PyTorch's ``batched_powerSGD_hook`` does.

One power iteration per call, per matrix: ``P = M·Q``; orthogonalise P; ``Q = Mᵀ·P``; the
message is (P, Q, rest) and ``decompress`` returns ``P·Qᵀ`` (and the rest as sent).
**Orthogonalisation**: PyTorch's own ``_orthogonalize`` (imported, not copied): Gram-Schmidt
(column by column: normalise, subtract its projection from the later columns; ``epsilon`` added
to the norms) for rank ≤ 2 or 16-bit dtypes, ``torch.linalg.qr`` (Householder QR) otherwise.
A zero column (a zero gradient with ``epsilon = 0``) would become NaN there; it is set to 0, so a
zero matrix is sent as zeros.

**Warm start** (default): Q is kept between calls and re-orthogonalised before use; the first Q
(and every Q without warm start) is drawn as PyTorch draws it: ``numpy.random.RandomState(seed)``
gives a torch seed per draw, then ``torch.randn`` on the CPU per matrix, orthogonalised. Matrices
are visited grouped by shape (first-seen order), PyTorch's order, so the same seed gives the
same Q as ``PowerSGDState(random_seed=seed)``.

**Error feedback** is the memory role's job, as for every compressor
(``compressors.ErrorFeedback(c)`` keeps ``M − P·Qᵀ`` as the residual), which is what PyTorch's
``use_error_feedback`` does.

In a cluster P and Q are all-reduced (P before its orthogonalisation, Q after ``Mᵀ·P``), so the
result there is PowerSGD of the mean gradient; one worker alone computes the same steps without
the sums. Wire: the rest, P and Q, all in the gradient's dtype (:class:`LowRank`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

from compressors.work import powersgd as powersgd_work
from compressors._validate import raise_if_not_finite
from compressors.base import Compressor
from compressors.messages.kinds import Block, LowRank
from compressors.rules import plan
from units import check_count

SEED_RANGE = 1_000_000_000
"""Torch seeds for Q are drawn in ``[0, SEED_RANGE)``, as PyTorch's hook draws them."""


class PowerSGD(Compressor):
    """PowerSGD. Options: ``rank`` (int ≥ 1, default 1), ``shapes`` (layer shapes in the flat
    vector, default ``None``: one square matrix), ``min_compression_rate`` (2), ``warm_start``
    (True), ``seed`` (0), ``epsilon`` (0: added to column norms in Gram-Schmidt).
    ``density`` is accepted and ignored: the rank sets the size."""

    name = "powersgd"
    message = "lowrank"

    def __init__(self, density: float = 1.0, rank: int = 1, shapes: Sequence[Sequence[int]] | None = None,
                 min_compression_rate: float = 2.0, warm_start: bool = True, seed: int = 0,
                 epsilon: float = 0.0):
        super().__init__(density)
        check_count(rank, "rank")
        if shapes is not None:
            try:
                shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
            except (TypeError, ValueError):
                raise ValueError(f"shapes must be a list of integer shapes, got {shapes!r}") from None
            if any(d < 0 for shape in shapes for d in shape):
                raise ValueError(f"shapes must have dims >= 0, got {shapes!r}")
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
                or not min_compression_rate >= 0:
            raise ValueError(f"min_compression_rate must be >= 0, got {min_compression_rate!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not isinstance(epsilon, (int, float)) or not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
        self.rank = rank
        self.shapes = shapes
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = bool(warm_start)
        self.seed = seed
        self.epsilon = float(epsilon)
        self._rng = np.random.RandomState(seed)
        self._q: dict[tuple, torch.Tensor] = {}

    def _compress(self, grad: torch.Tensor) -> LowRank:
        n = grad.numel()
        blocks, rest_slices, padded = plan(self.shapes, n, self.rank, self.min_compression_rate)
        raise_if_not_finite(grad, torch.linalg.vector_norm(grad, dtype=torch.float32 if grad.dtype != torch.float64 else None))
        if padded != n:
            source = torch.zeros(padded, dtype=grad.dtype, device=grad.device)
            source[:n] = grad
        else:
            source = grad
        key = (blocks, grad.dtype, grad.device)
        q = self._q.get(key) if self.warm_start else None
        if q is None:
            q = draw_q(self._rng, blocks, grad.dtype, grad.device, self.epsilon)
        else:
            for view in factor_views(q, blocks, "cols"):
                orthogonalize(view, self.epsilon)
        p = torch.empty(sum(b.rows * b.rank for b in blocks), dtype=grad.dtype, device=grad.device)
        matrices = block_matrices(source, blocks)
        left_factor(matrices, q, blocks, out=p)
        for pv in factor_views(p, blocks, "rows"):
            orthogonalize(pv, self.epsilon)
        right_factor(matrices, p, blocks, out=q)
        if self.warm_start:
            self._q = {key: q}
        rest = gather_rest(grad, rest_slices)
        return LowRank(blocks, p, q.clone() if self.warm_start else q, rest, rest_slices, n)

    work = staticmethod(powersgd_work.powersgd)

    def decompress(self, message: LowRank, out: torch.Tensor | None = None) -> torch.Tensor:
        """``P·Qᵀ`` in each matrix's place, the rest as sent (into ``out`` when given)."""
        dtype, device = message.p.dtype, message.p.device
        if out is None:
            out = torch.empty(message.numel, dtype=dtype, device=device)
        elif out.shape != (message.numel,) or out.dtype != dtype:
            raise ValueError(f"out buffer must be 1-D {dtype} of {message.numel} elements, "
                             f"got {out.dtype} {tuple(out.shape)}")
        return expand(message.blocks, message.p, message.q, message.rest, message.rest_slices, out)


def orthogonalize(factor: torch.Tensor, epsilon: float) -> None:
    """PyTorch's orthogonalisation of one ``(1, length, rank)`` factor in place, then NaN (a zero
    column normalised by its zero norm in Gram-Schmidt) set to 0: a zero gradient sends zeros, not NaN."""
    _orthogonalize(factor, epsilon)
    torch.nan_to_num_(factor, nan=0.0)


def factor_views(flat: torch.Tensor, blocks: tuple[Block, ...], side: str) -> list[torch.Tensor]:
    """``(1, rows|cols, rank)`` views of each block's factor packed in ``flat`` (``side``: "rows" for
    P, "cols" for Q), PyTorch's packing of ``p_memory_dict`` / ``q_memory_dict``."""
    views, position = [], 0
    for b in blocks:
        length = getattr(b, side)
        views.append(flat[position:position + length * b.rank].view(1, length, b.rank))
        position += length * b.rank
    return views


def draw_q(rng: np.random.RandomState, blocks: tuple[Block, ...], dtype: torch.dtype, device: torch.device,
           epsilon: float) -> torch.Tensor:
    """A fresh packed Q for ``blocks``, drawn as PyTorch's hook draws it: one torch seed from ``rng``
    (advancing it), then ``torch.randn`` on the CPU per block in order, each orthogonalised."""
    gen = torch.Generator().manual_seed(int(rng.randint(SEED_RANGE)))
    q = torch.empty(sum(b.cols * b.rank for b in blocks), dtype=dtype, device=device)
    for view in factor_views(q, blocks, "cols"):
        view.copy_(torch.randn(*view.shape, generator=gen, dtype=dtype))
        orthogonalize(view, epsilon)
    return q


def block_matrices(source: torch.Tensor, blocks: tuple[Block, ...]) -> list[torch.Tensor]:
    """``(1, rows, cols)`` views of each block's matrix in the flat (padded) gradient ``source``."""
    return [source[b.offset:b.offset + b.rows * b.cols].view(1, b.rows, b.cols) for b in blocks]


def left_factor(matrices: Sequence[torch.Tensor], q: torch.Tensor, blocks: tuple[Block, ...], *,
                out: torch.Tensor) -> torch.Tensor:
    """``P = M·Q`` per block, into the packed ``out`` (rows side)."""
    for m, qv, pv in zip(matrices, factor_views(q, blocks, "cols"), factor_views(out, blocks, "rows")):
        torch.bmm(m, qv, out=pv)
    return out


def right_factor(matrices: Sequence[torch.Tensor], p: torch.Tensor, blocks: tuple[Block, ...], *,
                 out: torch.Tensor) -> torch.Tensor:
    """``Q = Mᵀ·P`` per block, into the packed ``out`` (cols side)."""
    for m, pv, qv in zip(matrices, factor_views(p, blocks, "rows"), factor_views(out, blocks, "cols")):
        torch.bmm(m.transpose(1, 2), pv, out=qv)
    return out


def gather_rest(flat: torch.Tensor, rest_slices: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The uncompressed ``(offset, numel)`` slices of ``flat``, concatenated in order."""
    return torch.cat([flat[o:o + k] for o, k in rest_slices]) if rest_slices else flat[:0]


def expand(blocks: tuple[Block, ...], p: torch.Tensor, q: torch.Tensor, rest: torch.Tensor,
           rest_slices: Sequence[tuple[int, int]], out: torch.Tensor) -> torch.Tensor:
    """Write ``P·Qᵀ`` in each block's place and ``rest`` in its slices into the flat ``out`` and
    return it. The blocks and the rest cover ``out`` (:func:`plan`), so nothing is zeroed first;
    the padding of the square beyond ``out`` is dropped."""
    numel = out.numel()
    for b, pv, qv in zip(blocks, factor_views(p, blocks, "rows"), factor_views(q, blocks, "cols")):
        end = b.offset + b.rows * b.cols
        if end <= numel:  # a whole matrix: P·Qᵀ straight into its place, as PyTorch's hook writes it
            torch.bmm(pv, qv.transpose(1, 2), out=out[b.offset:end].view(1, b.rows, b.cols))
        else:  # the zero-padded square: only its first numel − offset elements are kept
            out[b.offset:] = torch.bmm(pv, qv.transpose(1, 2)).view(-1)[:numel - b.offset]
    position = 0
    for o, k in rest_slices:
        out[o:o + k] = rest[position:position + k]
        position += k
    return out
