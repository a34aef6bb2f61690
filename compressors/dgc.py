"""DGC's threshold selection as its reference implementation does it (Lin et al., ICLR 2018).

Sample ``|g|`` with a stride from a random offset (about 1 % of the elements and at least
``2/δ`` samples), take the top-``δ`` value of the sample as the threshold, select ``|g| ≥ thr``;
if more than ``1.3·k`` are selected take an exact top-k among them (hierarchical top-k); if fewer
than ``0.8·k``, lower the threshold by ×0.8 and retry, up to 10 rounds. A selection still outside the
count rule (:data:`compressors.rules.COUNT_BAND`) sends the exact top-``k`` instead.
Tie rule: ``|g| >= threshold`` (greater or equal, as the reference), computed with the shared
strict primitive as ``|g| > nextafter(threshold, −∞)``. The sample is taken from ``g`` itself (only
the sampled elements' ``|g|`` is computed) and the selection is one pass of
:func:`compressors.numerics.selection.select_above` (the fused kernel on contiguous float32 CPU tensors),
which also yields the magnitudes the hierarchical top-k needs; its ``backend`` option picks the
kernels (:mod:`compressors.kernels.backends`: the Triton compaction with ``"fused"``, or ``"auto"``
on a GPU with Triton installed). Momentum correction is the memory :class:`compressors.DGCMemory`.
"""

from __future__ import annotations

import math
import random

import torch

from compressors.work import dgc as dgc_work
from compressors._validate import raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.kernels import backends
from compressors.rules import sample_stride
from compressors.numerics.selection import Workspace, guard_count, select_above
from compressors.messages.sparse import Sparse
from units import check_count


class DGC(Compressor):
    """DGC sparsification. Options: ``sample_ratio`` (0.01), ``max_rounds`` (10), ``seed``
    (for the sample offset; ``None`` = nondeterministic), ``backend`` (``"auto"``, ``"torch"`` or
    ``"fused"``: :mod:`compressors.kernels.backends`). After a call, :attr:`backend` names what ran
    its selection (``"native"``, ``"fused"``, ``"torch"`` or ``"cuda"``)."""

    name = "dgc"

    def __init__(self, density: float, sample_ratio: float = dgc_work.SAMPLE_RATIO, max_rounds: int = 10,
                 seed: int | None = None, backend: str = "auto"):
        super().__init__(density)
        self.backend_choice = backends.check(backend)
        if isinstance(sample_ratio, bool) or not isinstance(sample_ratio, (int, float)) or not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1], got {sample_ratio!r}")
        check_count(max_rounds, "max_rounds")
        self.sample_ratio = float(sample_ratio)
        self.max_rounds = max_rounds
        self._rng = random.Random(seed)
        self._workspace = Workspace()

    def reseed(self, seed: int) -> None:
        """Draw the following sample offsets from ``random.Random(seed)``."""
        self._rng = random.Random(seed)

    def _folds_feedback(self, grad: torch.Tensor) -> bool:
        """The fused path folds error feedback into its first selection's read
        (:meth:`Compressor.compress_feedback`): the sample is taken from ``grad`` and ``residual``
        at its positions, and the compaction reads both and writes their sum as it selects; ``η``
        comes back where the call sent exactly ``|x| > η`` (no trim, no count guard). Not where
        the Triton kernels do not serve ``grad`` or its sample is the whole vector."""
        return (sample_stride(grad.numel(), self.density, self.sample_ratio) > 1
                and backends.path(grad, self.backend_choice) == "fused")

    def _compress(self, grad: torch.Tensor) -> Sparse:
        feedback, self._feedback = self._feedback, None
        self._exactly_above = None
        n = grad.numel()
        k = target_count(self.density, n)
        stride = sample_stride(n, self.density, self.sample_ratio)
        if feedback is not None:  # grad is not written yet: sample grad + residual where the sample is
            g, r, pending = feedback
            offset = self._rng.randrange(stride)
            r = r[offset::stride]
            if pending != math.inf:  # the last call's selection, left pending in the residual
                r = r.masked_fill(r.abs() > pending, 0)
            samples = torch.add(g[offset::stride], r).abs_()
        else:
            samples = grad[self._rng.randrange(stride)::stride].abs() if stride > 1 else grad.abs()
        top_samples = max(1, math.ceil(samples.numel() * self.density))
        threshold = torch.min(torch.topk(samples, top_samples, sorted=False).values)
        below = torch.tensor(-math.inf, dtype=grad.dtype, device=grad.device)
        # |g| >= thr  <=>  |g| > nextafter(thr, -inf): DGC's rule with the strict primitive
        found = select_above(grad, torch.nextafter(threshold, below), self._workspace, total=True,
                             backend=self.backend_choice, feedback=feedback)
        raise_if_not_finite(grad, found.total)
        indices, exact = found.indices, True
        if stride > 1:
            for _ in range(self.max_rounds):
                count = found.count
                if count > k:
                    if count > 1.3 * k:
                        top = torch.topk(found.magnitudes, k, sorted=False).indices
                        indices = torch.sort(found.indices.index_select(0, top)).values
                        exact = False
                    break
                if count >= 0.8 * k:
                    break
                threshold = threshold * 0.8
                found = select_above(grad, torch.nextafter(threshold, below), self._workspace,
                                     backend=self.backend_choice)
                indices = found.indices
        self.backend = found.backend
        indices, threshold, fallback = guard_count(grad, indices, indices.numel(), threshold, k, self._workspace)
        if exact and not fallback:
            self._exactly_above = found.above
        return Sparse(grad.index_select(0, indices), indices, n, threshold, fallback=fallback)

    work = staticmethod(dgc_work.dgc)
