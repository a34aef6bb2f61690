"""What each compressor does per call, as a function of its size, density and stages.

:func:`work` returns a :class:`CallWork` (compress and decompress, each a :class:`Work`) that
counts, for one call on an ``numel``-element gradient, the kernels the code issues: passes over
the whole vector, bytes read and written by streaming kernels (whole or partial vectors),
kernel launches (eager op dispatches on a CPU), device→host synchronisations, and the
elements that go through top-k, sort, gather/scatter, compaction (``nonzero``) and
transcendental functions. :mod:`simulator.costmodel` turns it into seconds on a device.

The declarations mirror the code path by path (``backend="torch"``: the eager torch ops, any
device; ``"native"``: SIDCo's fused C kernels on CPU float32) and are checked against what
the code actually does by counting its torch operations (tests/test_costmodel.py). Loops whose
length depends on the data take it as an argument (``rounds``), with the default seen on
gradient-like data (:data:`DEFAULT_ROUNDS`); SIDCo's stage count is ``stages`` (default
:data:`DEFAULT_STAGES`). fp16, bf16 and PowerSGD are declared here by name, ahead of their
classes. With ``error_feedback`` (the default, as training runs them) the residual update is
part of compress. Units: elements, bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressors._validate import target_count
from compressors.dgc import sample_stride
from compressors.sidco import stage_probabilities
from compressors.wire import DENSE_ALLREDUCE, sparse_bytes

DEFAULT_STAGES = 2
"""SIDCo stages assumed when ``stages`` is not given (adaptive SIDCo settles at 1–3 on
gradient-like data below δ = 0.25)."""

DEFAULT_ROUNDS = {"gaussiank": 3, "redsync": 6, "dgc": 1, "randomk": 1, "sidco-e": 1, "sidco-p": 1}
"""Data-dependent loop counts seen on the benchmark's gradient-like vector at δ = 0.01:
Gaussian-k's corrections (all three), RedSync's probes, DGC's threshold lowerings, Random-k's
draw rounds; for SIDCo-E/-P's native path, its passes over the whole vector (1 when the previous
call's threshold guess holds, as it does in training)."""

POWERSGD_RANK = 4
"""PowerSGD rank assumed by its declaration (the gradient viewed as a ⌈√n⌉-row matrix)."""

SCALAR_OPS = {"finite": 5, "gaussian": 13, "redsync_setup": 4, "redsync_probe": 4}
"""Launches of 0-d tensor arithmetic per step (threshold formulas, finiteness checks), as the
torch path issues them; counted with a dispatch mode when the code was written."""


KINDS = ("map", "reduce", "compare", "count", "log", "native", "native_log")
"""Streaming kernels by what they compute per element (a device may be slower per element than
its memory for some): ``map`` (abs, add, clamp, copy, fill), ``reduce`` (sum, amax, norm),
``compare`` (``>``/``>=`` into a bool mask), ``count`` (``count_nonzero`` of a mask), ``log``
(logarithms), ``native`` / ``native_log`` (SIDCo's fused C kernels, without / with logarithms)."""


@dataclass
class Work:
    """Work of one call. ``streams``: the streaming kernels as ``(kind, elements, bytes read,
    bytes written)``; ``passes`` counts those over the whole vector; gathers, top-k, sort and
    compaction are charged per element by the device; ``allocations``: bytes of each fresh
    buffer the call allocates; ``working_set_bytes``: what the call keeps live."""

    passes: int = 0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    launches: int = 0
    syncs: int = 0
    streams: list[tuple[str, float, float, float]] = field(default_factory=list)
    topk: list[tuple[float, float]] = field(default_factory=list)
    sort_elements: float = 0.0
    gather_elements: float = 0.0
    compact_elements: float = 0.0
    compact_hits: float = 0.0
    allocations: list[float] = field(default_factory=list)
    flops: float = 0.0
    working_set_bytes: float = 0.0

    def stream(self, elements: float, read: float, written: float, kind: str = "map", full: bool = False) -> Work:
        """A streaming kernel of ``kind`` over ``elements`` reading/writing ``read``/``written``
        bytes per element."""
        if kind not in KINDS:
            raise ValueError(f"unknown kernel kind {kind!r}")
        self.passes += int(full)
        self.bytes_read += elements * read
        self.bytes_written += elements * written
        self.streams.append((kind, float(elements), elements * read, elements * written))
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

    def select_topk(self, elements: float, k: float) -> Work:
        """One ``torch.topk`` keeping ``k`` of ``elements``."""
        self.topk.append((float(elements), min(1.0, k / max(elements, 1.0))))
        self.launches += 1
        return self

    def sort(self, elements: float) -> Work:
        """One sort of ``elements``."""
        self.sort_elements += elements
        self.launches += 1
        return self

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


def _ef(w: Work, n: int, k: float, itemsize: int, dense: bool) -> None:
    """Error feedback: a fresh ``grad + residual`` before, ``index_add_`` of what was sent (or a
    fresh zero residual for dense messages) after."""
    w.stream(n, 2 * itemsize, itemsize, full=True).allocate(n * itemsize)
    if dense:
        w.stream(n, 0, itemsize, full=True).allocate(n * itemsize)
    else:
        w.gather(k)


def _finite(w: Work, n: int, itemsize: int) -> None:
    """``raise_if_not_finite`` with a fresh sum: one read pass, scalar checks, one sync."""
    w.stream(n, itemsize, 0, "reduce", full=True).scalars(SCALAR_OPS["finite"]).sync()


def _sparse_decompress(n: int, k: float, itemsize: int) -> Work:
    return Work(working_set_bytes=n * itemsize).stream(n, 0, itemsize, full=True).gather(k)


def _none(n, density, itemsize, stages, rounds, backend):
    c = Work()
    _finite(c, n, itemsize)
    return c, Work().stream(n, itemsize, itemsize, full=True)


def _topk(n, density, itemsize, stages, rounds, backend):
    k = target_count(density, n)
    c = Work().stream(n, itemsize, itemsize, full=True).select_topk(n, k).sort(k).gather(k)
    _finite(c, n, itemsize)
    c.stream(k, itemsize, 0, "reduce")
    return c, _sparse_decompress(n, k, itemsize)


def _randomk(n, density, itemsize, stages, rounds, backend):
    k = target_count(density, n)
    c = Work()
    if 4 * k >= n:
        c.stream(n, 0, 8).sort(k)
    else:
        draw = k + k // 16 + 16
        for _ in range(rounds):
            c.stream(draw, 0, 8).stream(draw, 8, 8).sort(draw).sync()
        c.stream(draw, 0, 8).gather(k).sort(k)
    _finite(c, n, itemsize)
    return c.gather(k), _sparse_decompress(n, k, itemsize)


def _dgc(n, density, itemsize, stages, rounds, backend, trim=True):
    k = target_count(density, n)
    samples = math.ceil(n / sample_stride(n, density, 0.01))
    c = Work().stream(n, itemsize, itemsize, full=True)
    c.select_topk(samples, max(1, math.ceil(samples * density))).stream(1, 1, 1, "reduce")
    c.stream(n, itemsize, 1, "compare", full=True).compact(n, k)
    _finite(c, n, itemsize)
    for _ in range(rounds):
        c.scalars(1).stream(n, itemsize, 1, "compare", full=True).compact(n, 2 * k)
    if trim:
        c.gather(2 * k).select_topk(2 * k, k).gather(k).sort(k)
    return c.gather(k), _sparse_decompress(n, k, itemsize)


def _gaussiank(n, density, itemsize, stages, rounds, backend):
    k = target_count(density, n)
    c = Work().stream(n, itemsize, 0, "reduce", full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.scalars(SCALAR_OPS["gaussian"]).stream(n, itemsize, itemsize, full=True)
    for _ in range(rounds):
        c.stream(n, itemsize, 1, "compare", full=True).stream(n, 1, 0, "count", full=True).sync().scalars(1)
    c.stream(n, itemsize, 1, "compare", full=True).compact(n, k)
    c.scalars(SCALAR_OPS["finite"] + 1).sync()
    return c.gather(k), _sparse_decompress(n, k, itemsize)


def _redsync(n, density, itemsize, stages, rounds, backend):
    k = target_count(density, n)
    c = Work().stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.scalars(2).stream(n, itemsize, 0, "reduce", full=True).scalars(SCALAR_OPS["redsync_setup"] - 3)
    c.scalars(SCALAR_OPS["finite"]).sync()
    for _ in range(rounds):
        c.scalars(SCALAR_OPS["redsync_probe"]).stream(n, itemsize, 1, "compare", full=True)
        c.stream(n, 1, 0, "count", full=True).sync()
    c.stream(n, itemsize, 1, "compare", full=True).compact(n, 1.5 * k)
    return c.gather(1.5 * k), _sparse_decompress(n, 1.5 * k, itemsize)


_TAIL_E = ((1, 1, "map"), (1, 0, "reduce"), (1, 0.25, "compare"))
_TAIL_GP = ((1, 1, "map"), (1, 0, "reduce"), (1, 0, "reduce"), (1, 0, "reduce"), (1, 0.25, "compare"))
SIDCO_STEPS = {
    "sidco-e": (((1, 0, "reduce"),), 10, _TAIL_E, 5),
    "sidco-p": (((1, 0, "reduce"), (1, 0, "reduce")), 48, _TAIL_GP, 44),
    "sidco-gp": (((1, 0, "reduce"), (1, 1, "map"), (1, 1, "log"), (1, 0, "count"), (1, 0, "reduce")), 197,
                 _TAIL_GP, 44),
}
"""SIDCo's torch path step by step: stage 1's streaming kernels over |g| as (bytes read,
written, in units of the itemsize; 0.25 = a one-byte mask; kind), its 0-d launches, then each
later stage's kernels over the exceedances and 0-d launches. Stage 1 takes |g|'s statistics
(SIDCo-GP also clamps and takes logarithms); later stages shift the exceedances and refit them
(SIDCo-P/-GP: the mean twice and a norm)."""


def _sidco(name):
    first, first_scalars, tail, tail_scalars = SIDCO_STEPS[name]

    def declare(n, density, itemsize, stages, rounds, backend):
        probs = stage_probabilities(density, stages, 0.25)
        counts = [n * math.prod(probs[: i + 1]) for i in range(len(probs))]
        k = counts[-1]
        if backend == "native":
            return _sidco_native(name, n, itemsize, counts, rounds), _sparse_decompress(n, k, itemsize)
        c = Work().stream(n, itemsize, itemsize, full=True)
        for read, written, kind in first:
            c.stream(n, read * itemsize, written * itemsize, kind, full=True)
        c.scalars(first_scalars).stream(n, itemsize, 1, "compare", full=True).compact(n, counts[0])
        for before, after in zip(counts, counts[1:]):
            c.gather(before)
            for read, written, kind in tail:
                c.stream(before, read * itemsize, written * itemsize, kind)
            c.scalars(tail_scalars).compact(before, after).gather(after)
        return c.gather(k), _sparse_decompress(n, k, itemsize)

    return declare


NATIVE_SCALARS = {"sidco-e": (5, 5), "sidco-p": (36, 37), "sidco-gp": (184, 37)}
"""SIDCo's native path: 0-d launches of stage 1's threshold and of each later stage's."""


def _sidco_native(name, n, itemsize, counts, full_passes):
    """Fused kernels (``native.stats`` / ``native.select_above``: one read pass each, 8 bytes
    written per hit). SIDCo-E/-P at steady state take the statistics and a superset at 0.9·η₁
    of the previous call in one pass (``full_passes`` = 1; 2 when η₁ fell below that guess);
    SIDCo-GP needs logarithms: a statistics pass, then a selection pass."""
    c = Work()
    first, tail = NATIVE_SCALARS[name]
    superset = n * (counts[0] / n) ** 0.9
    if name == "sidco-gp":
        c.stream(n, itemsize, 0, "native_log", full=True).stream(n, itemsize, 8 * counts[0] / n, "native", full=True)
        pool = counts[0]
    elif full_passes <= 1 and len(counts) > 1:
        c.stream(n, itemsize, 8 * superset / n, "native", full=True).stream(superset, 4, 0, "native")
        pool = superset
    elif full_passes <= 1:
        c.stream(n, itemsize, 8 * superset / n, "native", full=True)
        c.stream(superset, 8, 8 * counts[0] / superset, "native")
        pool = counts[0]
    else:
        c.stream(n, itemsize, 8 * superset / n, "native", full=True)
        c.stream(n, itemsize, 8 * counts[0] / n, "native", full=True)
        pool = counts[0]
    c.scalars(first).sync()
    for after in counts[1:]:
        c.stream(pool, 8, 8 * after / pool, "native").scalars(tail).sync(2)
        pool = after
    k = counts[-1]
    return c.stream(k, 4, 8).gather(k)


def _cast(n, density, itemsize, stages, rounds, backend, half=2):
    c = Work().stream(n, itemsize, half, full=True)
    _finite(c, n, itemsize)
    return c, Work().stream(n, half, itemsize, full=True)


def _powersgd(n, density, itemsize, stages, rounds, backend):
    rows = math.ceil(math.sqrt(n))
    cols = math.ceil(n / rows)
    r = POWERSGD_RANK
    c = Work().stream(n, itemsize, 0, "reduce", full=True).stream(n, itemsize, 0, "reduce", full=True)
    c.flops += 4.0 * rows * cols * r + 2.0 * rows * r * r
    c.scalars(4 * r)
    d = Work().stream(n, 0, itemsize, full=True)
    d.flops += 2.0 * rows * cols * r
    return c, d


DECLARATIONS = {
    "none": _none, "topk": _topk, "randomk": _randomk, "dgc": _dgc, "gaussiank": _gaussiank,
    "redsync": _redsync, "sidco-e": _sidco("sidco-e"), "sidco-p": _sidco("sidco-p"),
    "sidco-gp": _sidco("sidco-gp"), "fp16": _cast, "bf16": _cast, "powersgd": _powersgd,
}


def work(name: str, numel: int, density: float, *, stages: int | None = None, rounds: int | None = None,
         backend: str = "torch", error_feedback: bool = True, itemsize: int = 4, trim: bool = True) -> CallWork:
    """The declared work of one compress and one decompress call of compressor ``name``.

    ``numel`` elements of ``itemsize`` bytes at target ``density``; ``stages``: SIDCo stages
    (default :data:`DEFAULT_STAGES`); ``rounds``: the data-dependent loop count of Gaussian-k,
    RedSync, DGC and Random-k (default :data:`DEFAULT_ROUNDS`); ``backend``: ``torch`` (eager
    ops, any device) or ``native`` (SIDCo's fused CPU kernels; other compressors ignore it);
    ``trim``: DGC ends with an exact top-k among its selection (it does when the selection
    exceeds 1.3·k).
    """
    if name not in DECLARATIONS:
        raise ValueError(f"no work declared for compressor {name!r}; declared: {', '.join(DECLARATIONS)}")
    if backend not in ("torch", "native"):
        raise ValueError(f"backend must be torch or native, got {backend!r}")
    n = int(numel)
    stages = DEFAULT_STAGES if stages is None else int(stages)
    rounds = DEFAULT_ROUNDS.get(name, 0) if rounds is None else int(rounds)
    extra = {"trim": trim} if name == "dgc" else {}
    compress, decompress = DECLARATIONS[name](n, float(density), itemsize, stages, rounds, backend, **extra)
    if error_feedback and name not in ("fp16", "bf16", "powersgd"):
        ef = Work()
        dense = name == "none"
        _ef(ef, n, 0 if dense else target_count(density, n), itemsize, dense)
        compress = _merge(ef, compress)
    elif error_feedback:
        residual = Work().stream(n, 2 * itemsize, itemsize, full=True).stream(n, 2 * itemsize, itemsize, full=True)
        compress = _merge(residual, compress)
    compress.working_set_bytes = 4.0 * n * itemsize
    decompress.working_set_bytes = 2.0 * n * itemsize
    return CallWork(compress, decompress)


def _merge(a: Work, b: Work) -> Work:
    return Work(
        a.passes + b.passes, a.bytes_read + b.bytes_read, a.bytes_written + b.bytes_written,
        a.launches + b.launches, a.syncs + b.syncs, a.streams + b.streams, a.topk + b.topk,
        a.sort_elements + b.sort_elements, a.gather_elements + b.gather_elements,
        a.compact_elements + b.compact_elements, a.compact_hits + b.compact_hits, a.allocations + b.allocations,
        a.flops + b.flops,
    )


def wire_bytes(name: str, numel: int, density: float, itemsize: int = 4) -> float:
    """Bytes one worker sends for an ``numel``-element gradient: dense for ``none``, half-width
    values for fp16/bf16, the two PowerSGD factors (the vector as one square matrix), else the
    sparse message of ``k`` values and their indices (:mod:`compressors.wire`)."""
    if name == "none":
        return float(numel * itemsize)
    if name in ("fp16", "bf16"):
        return float(numel * DENSE_ALLREDUCE[name])
    if name == "powersgd":
        rows = math.ceil(math.sqrt(numel))
        return float((rows + math.ceil(numel / rows)) * POWERSGD_RANK * itemsize)
    return float(sparse_bytes(target_count(density, numel), itemsize))


def record_ops(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``call`` and return its result and the names of the torch operations it dispatched,
    in order (``torch.utils._python_dispatch.TorchDispatchMode``; untimed, for counting)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    names: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Recorder():
        result = call()
    return result, names


def loop_counts(name: str, ops: Sequence[str]) -> dict[str, Any]:
    """The data-dependent loop counts of one torch-path call of ``name`` from the operations it
    dispatched (:func:`record_ops`), as :func:`work` takes them (``rounds``, DGC's ``trim``)."""
    if name in ("gaussiank", "redsync"):
        return {"rounds": ops.count("count_nonzero")}
    if name == "dgc":
        return {"rounds": ops.count("nonzero") - 1, "trim": ops.count("topk") == 2}
    if name == "randomk":
        return {"rounds": ops.count("_unique2")}
    return {}
