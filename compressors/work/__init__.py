"""What each compressor does per call, as a function of its size, density and stages.

:func:`work` returns a :class:`CallWork` (compress and decompress, each a :class:`Work`) that
counts, for one call on an ``numel``-element gradient, the kernels the code issues: passes over
the whole vector, bytes read and written by streaming kernels (whole or partial vectors),
kernel launches (eager op dispatches on a CPU), device→host synchronisations, and the
elements that go through top-k, sort, gather/scatter, compaction (``nonzero``) and
transcendental functions. :mod:`costs.costmodel` turns it into seconds on a device.

Each compressor declares its own work beside its code: the class's ``work``, a torch-free function
in the companion module of the one that implements it (``compressors/work/<module>.py`` for
``compressors/<module>.py``, in the vocabulary of :mod:`compressors.work.declare`), and with it what
is priced differently for it around its calls (:class:`compressors.work.declare.Declared`: its wire
bytes, its residual, a fused path), on the compressor's card (:class:`compressors.work.cards.Card`).
:data:`REGISTRY` lists the cards; :data:`DECLARATIONS` derives from it, and :func:`work` adds what
the memory training gives a compressor does. The declarations mirror the code path by path (``backend="torch"``: the eager
torch ops, any device; ``"cuda"``: the same where a GPU runs other code (exact Top-k);
``"native"``: the fused C kernels on CPU float32, SIDCo's and the selection primitive's) and are
checked against what the code does, op by op and kernel by kernel (tests/test_compressors_work.py,
with the op recorder :func:`compressors.work.counting.record_ops` and
:func:`compressors.work.counting.loop_counts`). Work that depends on the data is declared as a function
of counts the call reveals, with defaults seen on gradient-like data: ``rounds`` (selection
loops, each declaration's own default; SIDCo's native full passes), DGC's ``trim``, SIDCo's
``stages`` (:data:`DEFAULT_STAGES`), the stages it adds within a call (``deepened``) and its
native correction ``steps``. SIDCo's torch path is
declared for a call whose pool guess held (every call after the first on a steady stream): its
work follows the planned stage count and the pool size. With ``error_feedback`` (the default, as
training runs them) the residual update is part of compress. Units: elements, bytes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

from compressors.rules import target_count
from compressors.work import casts, dgc, fp8, gaussiank, int4, int8, powersgd, randomk, redsync, reference, sidco
from compressors.work.cards import Card
from compressors.work.declare import CallWork, Declaration, Declared, Work

REGISTRY: tuple[Card, ...] = (
    reference.NONE,
    reference.TOPK,
    randomk.CARD,
    dgc.CARD,
    gaussiank.CARD,
    redsync.CARD,
    sidco.SIDCO_E,
    sidco.SIDCO_P,
    sidco.SIDCO_GP,
    casts.FP16,
    casts.BF16,
    powersgd.CARD,
    int8.CARD,
    fp8.CARD,
    int4.CARD,
)
"""Every compressor's card, in the stable order of :func:`compressors.names`: the registry. Adding
a compressor is its class, its card beside its declared work, and one line here (docs/extending.md)."""

CARDS: dict[str, Card] = {c.name: c for c in REGISTRY}
"""The cards by name (:func:`compressors.card` checks the name)."""
if len(CARDS) != len(REGISTRY):
    raise ImportError(f"two cards share a name in the registry: {[c.name for c in REGISTRY]}")


DECLARATIONS: dict[str, Declared] = {c.name: c.declared for c in REGISTRY}
"""Every registered compressor's declaration (its work and what is priced differently for it) by name, in
the registry's order (from the cards)."""

FUSED: tuple[str, ...] = tuple(name for name, declared in DECLARATIONS.items() if declared.fused is not None)
"""Compressors with a fused path of their own (``backend="fused"``: the Triton kernels of
:mod:`compressors.kernels.fused` on a GPU; SIDCo's with error feedback folded into its first read,
DGC's, Gaussian-k's and RedSync's the selection primitive's compaction with error feedback eager:
``Declared.eager_feedback``); the others declare what they run on a GPU (``cuda``) there."""

DEFAULT_STAGES = 1
"""SIDCo stages planned when ``stages`` is not given: what SIDCo with its default options
(adaptive stage count, count corrections) plans. Its controller starts at one stage and the
in-call corrections keep every call's count within the band, so it stays there: seen in every
call on Gaussian, Student-t (3 d.o.f.), Laplace and gradient-like data at δ = 0.01 and 0.001,
with and without error feedback (tests/test_sidco_lean.py). Where one stage's fit cannot reach
the density, the call adds stages from the pool (``deepened``,
:func:`compressors.work.sidco.default_deepened`)."""

def _ef_in(n: int, itemsize: int) -> Work:
    """Error feedback before compressing: ``grad + residual`` into a kept spare buffer (the
    residual is state from the last iteration: cold)."""
    return Work().stream(n, 2 * itemsize, itemsize, full=True, cold=True)


def _ef_out(declared: Declared, n: int, density: float, itemsize: int, decompress: Work,
            hits: Sequence[float]) -> Work:
    """Error feedback after compressing, the new residual (``declared.residual``): a fresh zero
    vector, ``sub_`` of the message decompressed into a kept scratch buffer (``decompress``: the
    work of decompressing it), or ``index_add_`` of what was sent (the last of ``hits`` where
    that is what a call sent, else ``declared.sent`` · k)."""
    if declared.residual == "fresh":
        return Work().stream(n, 0, itemsize, full=True).allocate(n * itemsize)
    if declared.residual == "decompressed":
        return _merge(decompress, Work().stream(n, 2 * itemsize, itemsize, full=True))
    sent = float(hits[-1]) if hits and declared.sends_last_hits else declared.sent * target_count(density, n)
    return Work().gather(sent)


@functools.cache
def _keywords(declaration: Declaration) -> frozenset[str]:
    """The names of ``declaration``'s parameters: which of the data-dependent counts it takes."""
    return frozenset(inspect.signature(declaration).parameters)


def work(name: str, numel: int, density: float, *, stages: int | None = None, rounds: int | None = None,
         backend: str = "torch", error_feedback: bool = True, itemsize: int = 4, trim: bool = True,
         corrections: int = sidco.CORRECTIONS, adapt: str = "count",
         steps: int | None = None, pool: float | None = None, collects: int = 1,
         hits: Sequence[float] | None = None, deepened: int | None = None,
         pending: bool | None = None) -> CallWork:
    """The declared work of one compress and one decompress call of compressor ``name``.

    ``numel`` elements of ``itemsize`` bytes at target ``density``; ``backend``: ``torch`` (eager
    ops; exact Top-k as on a CPU), ``cuda`` (the same, but exact Top-k is one ``torch.topk``) or
    ``native`` (the fused CPU kernels: SIDCo's, and the selection of Top-k, DGC, Gaussian-k
    and RedSync; other compressors ignore it) or ``fused`` (the Triton kernels on a GPU:
    SIDCo's, and the selection of DGC, Gaussian-k and RedSync, :data:`FUSED`; the others as
    ``cuda``). Data-dependent counts:
    ``stages``: SIDCo's planned stage count (its ``planned`` after a call; default
    :data:`DEFAULT_STAGES`); ``deepened``: the stages SIDCo added within the call from its pool
    (its ``deepened``; adaptive stages only; default, when ``stages`` is not given either,
    :func:`compressors.work.sidco.default_deepened`; else 0: on the native path the stages a call
    used, with no ``deepened``, price the same as its planned and added ones); ``rounds``: the
    loop count of Gaussian-k, RedSync, DGC, Top-k and Random-k, and for SIDCo's native path its
    full passes (default: the count each declaration states, seen on gradient-like data);
    ``trim``: DGC ends with an exact top-k among its selection (it does when the selection exceeds
    1.3·k); ``pending``: DGC's fused path with error feedback found the call before's selection
    left pending in the residual (default: as a call that does not trim leaves it);
    ``corrections``: SIDCo's in-call correction steps (its torch path always runs all of them,
    masked); ``adapt``: SIDCo's ``adapt`` option (``"paper"``: fixed stage probabilities,
    no corrections); ``steps``: the correction steps SIDCo's native path took (it stops once
    within the band; default :data:`compressors.work.sidco.NATIVE_STEPS`); ``pool``: the elements
    each of its pool kernels read (default :data:`compressors.work.sidco.NATIVE_POOL` · k);
    ``collects``: its full passes that also collected a pool (default 1, the first); ``hits``:
    the elements each native selecting pass of Top-k, DGC, Gaussian-k and RedSync kept, in order
    (a selecting pass costs more the more it keeps, 0.15 to 0.5 ns per element on this testbed's
    CPU; defaults: the candidates Top-k expects, k for DGC and Gaussian-k, 2·k for each of
    RedSync's probes).
    """
    if name not in DECLARATIONS:
        raise ValueError(f"no work declared for compressor {name!r}; declared: {', '.join(DECLARATIONS)}")
    if backend not in ("torch", "cuda", "native", "fused"):
        raise ValueError(f"backend must be torch, cuda, native or fused, got {backend!r}")
    declared = DECLARATIONS[name]
    fused = backend == "fused" and fused_path(name, numel, density, pool)
    if backend == "fused" and not fused:  # no fused path of its own: what it runs on a GPU
        backend = "cuda"
    n = int(numel)
    folds = fused and error_feedback and not declared.eager_for(n, float(density))
    if deepened is None and stages is not None:
        deepened = 0  # a given stage count: a fixed one, or one a call reported (the stages it used)
    stages = DEFAULT_STAGES if stages is None else int(stages)
    rounds = None if rounds is None else int(rounds)
    counts = {"trim": trim, "hits": list(hits or ()), "corrections": corrections, "adapt": adapt, "steps": steps,
              "pool": pool, "collects": collects, "deepened": deepened, "error_feedback": folds, "pending": pending}
    taken = _keywords(declared.work)
    compress, decompress = declared.work(n, float(density), itemsize, stages, rounds, backend,
                                       **{key: value for key, value in counts.items() if key in taken})
    if not error_feedback:  # the compressor reads the caller's gradient, written long before the call
        _read_input_cold(compress, n)
    elif folds:
        compress = _fold_feedback(compress, n, itemsize)
    else:
        compress = _merge(_merge(_ef_in(n, itemsize), compress),
                          _ef_out(declared, n, density, itemsize, decompress, counts["hits"]))
    compress.working_set_bytes = (4.0 if error_feedback else 2.0) * n * itemsize
    decompress.working_set_bytes = 2.0 * n * itemsize
    return CallWork(compress, decompress)


def fused_path(name: str, numel: int, density: float, pool: float | None = None) -> bool:
    """Whether ``backend="fused"`` declares compressor ``name``'s fused path for ``numel``
    elements at ``density`` (its ``Declared.fused``: SIDCo, with its pool, default 5·k, within
    :data:`compressors.work.sidco.FUSED_SLOTS`; DGC, Gaussian-k and RedSync always) rather than
    what it runs on a GPU otherwise."""
    fused = DECLARATIONS[name].fused
    return fused is not None and fused(numel, density, pool)


def _fold_feedback(w: Work, n: int, itemsize: int) -> Work:
    """Error feedback folded into the fused path's first full read (its statistics kernel reads
    ``grad`` and ``residual``, the latter cold, and writes their sum): no pass of its own. The
    residual's update is left pending (:class:`compressors.memory.ErrorFeedback`: the message is
    exactly ``|x| > η``, and the next call's statistics kernel zeroes ``|r| > η`` as it reads the
    residual): no scatter either. A call the count guard sent elsewhere scatters as the eager path
    does; a steady call does not."""
    for i, (kind, elements, read, written, _) in enumerate(w.streams):
        if elements == n and read > 0:
            w.streams[i] = (kind, elements, read + n * itemsize, written + n * itemsize, True)
            w.bytes_read += n * itemsize
            w.bytes_written += n * itemsize
            return w
    return w


def _read_input_cold(w: Work, n: int) -> None:
    """Mark the first full-size read of ``w`` (the gradient handed to the call) as cold."""
    for i, (kind, elements, read, written, _) in enumerate(w.streams):
        if elements == n and read > 0:
            w.streams[i] = (kind, elements, read, written, True)
            return


def _merge(a: Work, b: Work) -> Work:
    return Work(
        a.passes + b.passes, a.bytes_read + b.bytes_read, a.bytes_written + b.bytes_written,
        a.launches + b.launches, a.syncs + b.syncs, a.streams + b.streams, a.topk + b.topk,
        a.sorts + b.sorts, a.gather_elements + b.gather_elements,
        a.compact_elements + b.compact_elements, a.compact_hits + b.compact_hits, a.allocations + b.allocations,
        a.flops + b.flops, host_bytes=a.host_bytes + b.host_bytes,
    )


def wire_bytes(name: str, numel: int, density: float, itemsize: int = 4) -> float:
    """Bytes one worker sends for an ``numel``-element gradient of ``itemsize``-byte elements at
    ``density``: its declaration's ``wire`` (dense for ``none``, half-width values for fp16/bf16,
    the two PowerSGD factors, else the sparse message of ``k`` values and their indices)."""
    return DECLARATIONS[name].wire(numel, density, itemsize)
