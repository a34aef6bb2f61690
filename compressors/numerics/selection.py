"""The shared selection primitive: "the elements with ``|x|`` above a threshold", with their count,
on the best backend for the tensor; exact Top-k built on it; reusable buffers; the count guard
(:func:`guard_count`).

Every threshold compressor (SIDCo's torch path, DGC's final selection, Gaussian-k, RedSync) and
exact Top-k select through :func:`select_above` / :func:`count_above`, so they get the same
engineering, on the kernels :func:`compressors.kernels.backends.path` picks for the tensor and the
caller's ``backend`` option: on a contiguous float32 CPU tensor the fused C kernel of
:mod:`compressors.kernels.native` (one pass that reads ``x``, compares ``|x|``, writes the hits and,
on request, sums ``|x|``); on a tensor the Triton kernels serve (CUDA with Triton installed, or CPU
under the interpreter when asked for) one compaction launch of :mod:`compressors.kernels.fused`
(the threshold read on the device, the count read to the host, the positions sorted); elsewhere
(fp64, native library unavailable, ``backend="torch"``) torch (``abs`` into a reused buffer, ``gt``,
``nonzero``). All return the same positions, ascending; the result says which ran (``"native"``,
``"fused"``, ``"torch"`` or ``"cuda"``).

Tie rule: an element is selected when ``|x| > threshold`` (strictly greater); the threshold is
first rounded to ``x``'s dtype. For ``|x| ≥ t`` (DGC), pass ``torch.nextafter(t, -inf)`` (in
``x``'s dtype): ``|x| > nextafter(t, −∞)`` ⇔ ``|x| ≥ t``.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import torch

from compressors.kernels import backends, native
from compressors.rules import COUNT_BAND, TOPK_SAMPLE, keeps_count

class Workspace:
    """Reusable scratch buffers keyed by (name, numel, dtype, device).

    A training loop compresses tensors of the same few sizes every step; reusing the buffers
    avoids re-allocating (and page-faulting) hundreds of megabytes per call.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Return a 1-D buffer of ``numel`` elements (contents undefined)."""
        key = (name, numel, dtype, device)
        buf = self._buffers.get(key)
        if buf is None:
            stale = [k for k in self._buffers if k[0] == name]
            if len(stale) >= 4:
                del self._buffers[stale[0]]
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf

    def at_least(self, name: str, numel: int, dtype: torch.dtype, device: torch.device,
                 headroom: float = 0.25) -> torch.Tensor:
        """A view of ``numel`` elements into one growing buffer per (name, dtype, device).

        For outputs whose size changes from call to call (selections): the buffer grows by
        ``headroom`` (a fraction: a quarter by default) more than needed and is otherwise reused,
        so steady state allocates nothing.
        """
        return self.grown(name, numel, dtype, device, headroom)[:numel]

    def grown(self, name: str, numel: int, dtype: torch.dtype, device: torch.device,
              headroom: float = 0.25) -> torch.Tensor:
        """The whole growing buffer behind :meth:`at_least` (at least ``numel`` elements), not a
        view: for kernels that take a capacity and write a prefix (no slicing on the call path)."""
        key = (name, "grow", dtype, device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel + int(numel * headroom), dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf


class Above(NamedTuple):
    """What :func:`select_above` found.

    - ``indices``: positions (int64, ascending) with ``|x| > threshold``; may be empty;
    - ``magnitudes``: ``|x|`` at those positions (``x``'s dtype);
    - ``count``: ``len(indices)`` (a Python int: the one device→host sync);
    - ``total``: ``Σ|x|`` over all of ``x`` (0-d tensor, accumulated in float32/float64) when asked
      with ``total=True``, else ``None``: a statistic that is finite iff ``x`` is (barring
      overflow), for the NaN/Inf check without another pass;
    - ``backend``: ``"native"``, ``"torch"``, ``"cuda"`` or ``"fused"``;
    - ``above``: on the fused path with a tensor threshold, that threshold as a host float (rounded
      to ``x``'s dtype: the selection is exactly ``|x| > above``), read with the count; else ``None``.
    """

    indices: torch.Tensor
    magnitudes: torch.Tensor
    count: int
    total: torch.Tensor | None
    backend: str
    above: float | None = None


def torch_backend(x: torch.Tensor) -> str:
    """The backend name of the torch path for ``x``: ``"cuda"`` on a GPU, else ``"torch"``."""
    return "cuda" if x.is_cuda else "torch"


def _threshold_float(x: torch.Tensor, threshold: torch.Tensor | float) -> float:
    """``threshold`` rounded to ``x``'s dtype, as a Python float (for the native kernel)."""
    if isinstance(threshold, torch.Tensor):
        return float(threshold.to(x.dtype))
    return float(torch.tensor(threshold, dtype=x.dtype))


def select_above(x: torch.Tensor, threshold: torch.Tensor | float, workspace: Workspace, *,
                 total: bool = False, backend: str = "auto",
                 feedback: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> Above:
    """The elements of the 1-D tensor ``x`` with ``|x| > threshold`` (strict; see the module docstring).

    ``threshold``: a float or a 0-d tensor (on ``x``'s device: the torch and fused paths then need
    no device→host copy of it). ``total``: also return ``Σ|x|`` (from the same pass on the native
    and fused paths). ``backend``: the caller's option, ``"auto"``, ``"torch"`` or ``"fused"``
    (:func:`compressors.kernels.backends.path`; ``"torch"`` forces the torch path). Buffers come
    from ``workspace``; the returned tensors are views into them, valid until the next call with
    the same workspace. ``feedback`` ``(grad, residual, pending)``, on the fused path only: ``x``
    is not yet written; the compaction reads ``grad`` and ``residual`` (``|r| > pending`` read as
    zero) and writes their sum into ``x`` as it selects from it (error feedback's addition in the
    selection's read).
    """
    n = x.numel()
    kind = backends.path(x, backend)
    if feedback is not None and kind != "fused":
        raise ValueError("error feedback folds into the selection on the fused path only")
    if kind == "fused":
        return _select_fused(x, threshold, workspace, total, feedback)
    if kind == "native":
        buffers = (workspace.at_least("above-idx", n, torch.int32, x.device),
                   workspace.at_least("above-mag", n, torch.float32, x.device))
        thr = _threshold_float(x, threshold)
        if total:
            hits, sums = native.select_above(x, thr, absolute=True, buffers=buffers, with_stats=True)
            whole = torch.tensor(sums.total, dtype=torch.float32)
        else:
            hits, whole = native.select_above(x, thr, absolute=True, buffers=buffers), None
        return Above(hits.indices.long(), hits.magnitudes, int(hits.indices.numel()), whole, "native")
    a = magnitude(x, workspace)
    mask = workspace.get("mask", n, torch.bool, x.device)
    torch.gt(a, threshold, out=mask)
    indices = torch.nonzero(mask).squeeze(1)
    whole = torch.sum(a, dtype=torch.float64 if a.dtype == torch.float64 else torch.float32) if total else None
    return Above(indices, a.index_select(0, indices), int(indices.numel()), whole, torch_backend(x))


def count_above(x: torch.Tensor, threshold: torch.Tensor | float, workspace: Workspace, *,
                backend: str = "auto") -> tuple[int, str]:
    """``(number of elements with |x| > threshold, backend)``: one pass, one device→host sync
    (``backend``: as :func:`select_above`)."""
    kind = backends.path(x, backend)
    if kind == "fused":
        return _compact(x, threshold, workspace, 0, False).count, "fused"
    if kind == "native":
        found = select_above(x, threshold, workspace)
        return found.count, found.backend
    a = magnitude(x, workspace)
    mask = workspace.get("mask", x.numel(), torch.bool, x.device)
    torch.gt(a, threshold, out=mask)
    return int(torch.count_nonzero(mask)), torch_backend(x)


class _Compacted(NamedTuple):
    """What one fused compaction left in the workspace: the first ``capacity`` hits' positions
    (int64) and magnitudes (``x``'s dtype) in the order blocks wrote them, their ``count`` (a host
    int) and, when asked, each block's ``Σ|x|`` (float32)."""

    positions: torch.Tensor
    magnitudes: torch.Tensor
    count: int
    totals: torch.Tensor | None
    above: float | None


def _compact(x: torch.Tensor, threshold: torch.Tensor | float, workspace: Workspace, capacity: int,
             total: bool, feedback: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> _Compacted:
    """One compaction launch of :mod:`compressors.kernels.fused` over ``x`` at ``threshold``
    (rounded to ``x``'s dtype first; a tensor stays on the device, as float32, and comes back with
    the count), writing at most ``capacity`` hits: a zeroed int32 counter pair, the launch, the
    count read to the host (the one sync). With ``feedback`` ``(grad, residual, pending)`` the
    kernel reads those and writes their sum into ``x``. Buffers from ``workspace``."""
    from compressors.kernels import fused  # imports Triton: only where the fused kernels serve ``x``

    n, device = x.numel(), x.device
    if isinstance(threshold, torch.Tensor):
        t = threshold.to(device=device, dtype=x.dtype).to(torch.float32)
    else:
        t = _threshold_float(x, threshold)
    blocks = fused.programs(n)
    counter = workspace.get("fused-counter", 2, torch.int32, device)
    counter.zero_()
    slots = max(capacity, 1)  # a kernel argument is never an empty tensor
    positions = workspace.get("fused-positions", slots, torch.int64, device)
    magnitudes = workspace.get("fused-magnitudes", slots, x.dtype, device)
    parts = workspace.get("fused-parts", fused.SURVIVORS * blocks, torch.float32, device)
    totals = workspace.get("fused-totals", blocks, torch.float32, device) if total else None
    source, folded = x, None
    if feedback is not None:  # read grad and residual, write their sum into x
        source, residual, pending = feedback
        folded = (residual, x, float(pending))
    fused.launch_compact(source, t, counter, positions, magnitudes, parts, capacity, totals, absolute=True,
                         feedback=folded)
    count, bits = counter.tolist()
    above = struct.unpack("<f", struct.pack("<i", bits))[0] if isinstance(t, torch.Tensor) else None
    return _Compacted(positions, magnitudes, count, totals, above)


def _select_fused(x: torch.Tensor, threshold: torch.Tensor | float, workspace: Workspace, total: bool,
                  feedback: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> Above:
    """:func:`select_above` on the fused path: :func:`_compact` into ``x.numel()`` slots, the
    count's prefix of the positions sorted (blocks land in any order on a GPU), the magnitudes
    taken in that order (both into growing workspace buffers), ``Σ|x|`` the sum of the blocks'
    (float32)."""
    found = _compact(x, threshold, workspace, x.numel(), total, feedback)
    count, device = found.count, x.device
    indices, order = (workspace.at_least(name, count, torch.int64, device) for name in ("fused-sorted", "fused-order"))
    torch.sort(found.positions[:count], out=(indices, order))
    magnitudes = torch.index_select(found.magnitudes[:count], 0, order,
                                    out=workspace.at_least("fused-picked", count, x.dtype, device))
    whole = torch.sum(found.totals, dtype=torch.float32) if total else None
    return Above(indices, magnitudes, count, whole, "fused", found.above)


def exact_topk(x: torch.Tensor, k: int, workspace: Workspace) -> Above:
    """The exactly ``k`` largest ``|x|`` (indices ascending), the best way for ``x``'s device.

    CUDA: ``torch.topk`` over ``|x|`` (a radix select on the GPU). CPU (measured in BENCHMARKS.md:
    ``torch.topk`` over 26 M floats is two orders of magnitude slower than one read pass): guess a
    threshold just below the k-th largest from a strided sample (the top ``1.5·k/n`` of
    ``max(4096, 20·n/k)`` samples), select the candidates ``|x| > guess`` with
    :func:`select_above` (the fused kernel), halving the guess while fewer than ``k`` are found,
    then ``torch.topk`` among the candidates. Exact: once at least ``k`` candidates exceed the
    guess, the k-th largest does too, so every one of the top k is a candidate. Among elements tied
    with the k-th largest magnitude, which ones are sent is up to ``torch.topk``. ``total`` is
    ``Σ|x|`` (for the NaN/Inf check). Small ``n`` or ``k ≥ n/4`` use ``torch.topk`` directly.
    """
    n = x.numel()
    if x.is_cuda or 4 * k >= n or n < 4 * TOPK_SAMPLE:
        return _topk_direct(x, k, workspace)
    wanted = max(TOPK_SAMPLE, math.ceil(20 * n / k))
    stride = max(1, n // wanted)
    sample = x[::stride].abs()
    top = min(sample.numel(), math.ceil(1.5 * sample.numel() * k / n) + 3)
    guess = torch.min(torch.topk(sample, top, sorted=False).values)
    found = select_above(x, guess, workspace, total=True)
    if not bool(torch.isfinite(found.total)):
        return _topk_direct(x, k, workspace)
    for _ in range(8):
        if found.count >= k or not bool(guess > 0):
            break
        guess = guess * 0.5
        found = select_above(x, guess, workspace)
    if found.count < k:
        return _topk_direct(x, k, workspace)
    top_mag, chosen = torch.topk(found.magnitudes, k, sorted=False)
    order = torch.argsort(chosen)
    whole = found.total
    return Above(found.indices.index_select(0, chosen.index_select(0, order)), top_mag.index_select(0, order), k,
                 whole, found.backend)


def _topk_direct(x: torch.Tensor, k: int, workspace: Workspace) -> Above:
    a = magnitude(x, workspace)
    top, indices = torch.topk(a, k, sorted=False)
    indices, order = torch.sort(indices)
    whole = torch.sum(a, dtype=torch.float64 if a.dtype == torch.float64 else torch.float32)
    return Above(indices, top.index_select(0, order), k, whole, torch_backend(x))


def magnitude(grad: torch.Tensor, workspace: Workspace) -> torch.Tensor:
    """``|grad|`` written into a reused buffer of the same dtype."""
    buf = workspace.get("abs", grad.numel(), grad.dtype, grad.device)
    return torch.abs(grad, out=buf)


def guard_count(x: torch.Tensor, indices: torch.Tensor, count: int, threshold: torch.Tensor | float | None,
                k: int, workspace: Workspace, band: tuple[float, float] = COUNT_BAND,
                ) -> tuple[torch.Tensor, torch.Tensor | float | None, bool]:
    """The count guard every threshold compressor ends with: ``(indices, threshold, False)`` when
    the estimator's ``count`` keeps :func:`compressors.rules.keeps_count` with ``band``, else the exact top-``k``
    of ``|x|`` (:func:`exact_topk`), its ``k``-th largest magnitude as the threshold (a 0-d
    tensor) and ``True``. ``count`` is a host int the selection already has: the guard adds no
    device→host sync to a call that keeps the rule. It catches fits that degenerate (one huge
    outlier, constant, uniform or subnormal magnitudes): without it such a call sent nothing but
    the largest element, or the whole vector."""
    if keeps_count(count, k, x.numel(), band):
        return indices, threshold, False
    top = exact_topk(x, k, workspace)
    return top.indices, torch.min(top.magnitudes), True
