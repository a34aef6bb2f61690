"""The declared work of SIDCo-E, -P and -GP (:mod:`compressors.sidco`), torch-free for the cost
model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it to the code.

Three code paths: the torch path (any device), the native path (the fused C kernels on CPU
float32) and the fused path (the Triton kernels on a GPU). Work that depends on the data is a function of counts the call reveals: the planned
stage count, the pool, and on the native path its full passes and correction ``steps``
(:data:`NATIVE_STEPS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compressors.work.cards import Card
from compressors.work.declare import (FUSED_BLOCK, Declaration, Declared, Work, fused_blocks, sparse_decompress,
                                      sparse_wire)
from compressors.rules import stage_probabilities, target_count

NATIVE_STEPS = 5
"""Correction steps SIDCo's native path takes by default (seen on gradient-like data at
δ = 0.01 and 0.001: 4 to 6)."""


NATIVE_POOL = 5
"""Elements in SIDCo's native pool per selected element by default (the pool holds ``|g|`` above
0.9 × the previous call's threshold: about 5·k seen on gradient-like data at δ = 0.01, more
while error feedback's residual is still growing)."""


POOL_ROOM = 1.75
"""SIDCo's torch path: the pool's slots, ``⌊1.75 × max(previous pool, k)⌋ + 1024`` (a pool that
fills them is collected again at the same level into
:data:`compressors.numerics.tails.POOL_REGROW` times as many: one more transfer)."""

POOL_BINS = 256
"""Bins of SIDCo's torch-path pool histogram, the part of the pool read to the host: lattice steps
from the pool's level upward (two octaves; the last bin also holds everything above). A try
outside it is counted on the device."""

SHIP_SLOTS = 16384
"""SIDCo's torch path: a pool of at most this many slots travels to the host as its values (widened
to float64: at most 128 KiB, ≈ 8 µs over a 16 GB/s PCIe link) instead of as its histogram when the
previous call of the same size added a stage within itself; that stage's statistics and every
count are then read on the host, instead of the pool's ``hardshrink``, two or three reductions and
a transfer on the device (≥ 4 launches: ≈ 30 µs)."""

CORRECTIONS = 8
"""SIDCo's in-call correction steps by default (its ``corrections``)."""

DEEPEN_BELOW = 0.002
"""Below this density SIDCo-P with its default options adds one stage within the call (seen on
gradient-like, Gaussian and Laplace data, 2¹⁸ elements, error feedback: in 15–20 of 20 calls at
δ = 0.001 and 0.0001, in none at 0.003 and above; Student-t with 3 d.o.f. in 2 of 20 at 0.001):
its generalized Pareto fit has a bounded tail (ξ < 0) there, which no quantile of it brings down
to the density. SIDCo-E and SIDCo-GP were not seen to."""


def pool_slots(n: int, pool: float, k: int) -> int:
    """Slots of SIDCo's torch-path pool for an ``n``-element gradient whose previous call of the
    same size pooled ``pool`` elements, ``k`` to select (:data:`POOL_ROOM`)."""
    return min(n, int(POOL_ROOM * max(pool, k)) + 1024)


FETCH_ROOM = 1.25
"""SIDCo's fused path: of its pool's slots (:func:`pool_slots`) the host reads the first
``⌊1.25 × max(previous pool, k)⌋ + 1024`` (positions and values interleaved, 8 bytes a slot, so a
prefix holds them whole); a pool that outgrew them (the pool moved by up to about 15 % from call to
call on gradient-like data with error feedback) has the rest read after it: one more transfer."""


def pool_fetch(n: int, pool: float, k: int) -> int:
    """Pool slots SIDCo's fused path reads to the host in its one transfer (:data:`FETCH_ROOM`), for
    an ``n``-element gradient whose previous call of the same size pooled ``pool`` elements, ``k``
    to select."""
    return min(pool_slots(n, pool, k), int(FETCH_ROOM * max(pool, k)) + 1024)


def ships_values(deepened: bool, slots: int) -> bool:
    """Whether SIDCo's torch-path pool of ``slots`` slots travels as its values (:data:`SHIP_SLOTS`):
    after a call of the same size that added a stage within itself (``deepened``)."""
    return bool(deepened) and slots <= SHIP_SLOTS


def default_deepened(name: str, density: float, adapt: str = "count", corrections: int = CORRECTIONS) -> int:
    """Stages SIDCo variant ``name`` adds within a call with adaptive stages by default
    (:data:`DEEPEN_BELOW`); none without count corrections, which is where they are added."""
    return int(name == "sidco-p" and density < DEEPEN_BELOW and adapt == "count" and corrections > 0)


FUSED_SLOTS = 1 << 18
"""The most pool slots SIDCo's fused path takes: its pool travels to the host (8 bytes a slot:
2 MiB here, ≈ 0.1 ms over PCIe), where the eager path sends a 2 KiB histogram, so above this
(e.g. 2²⁴ elements at δ = 0.01: 1.5 M slots) ``backend="auto"`` runs the eager path."""


def fused_fits(n: int, pool: float, k: int) -> bool:
    """Whether SIDCo's fused path takes an ``n``-element gradient whose previous call of the same
    size pooled ``pool`` elements, ``k`` to select (:data:`FUSED_SLOTS`)."""
    return pool_slots(n, pool, k) <= FUSED_SLOTS


def fused_runs(n: int, density: float, pool: float | None = None) -> bool:
    """Whether SIDCo's fused path takes an ``n``-element call at target ``density`` after one that
    pooled ``pool`` elements (default :data:`NATIVE_POOL` · k): :func:`fused_fits`."""
    k = target_count(density, n)
    return fused_fits(n, NATIVE_POOL * k if pool is None else pool, k)


def _sidco_fused(name: str, n: int, k: int, itemsize: int, planned: int, pool: float) -> Work:
    """SIDCo's fused path (:mod:`compressors.kernels.sidco_fused`), a call after one of the same size
    (its pool guess held). Stage 1: the statistics kernel over ``g`` (error feedback folds
    ``+ residual`` into it: :func:`compressors.work.work`), for SIDCo-GP with each block's
    ``Σ ln max(|g|, floor)`` too (a logarithm an element). With one stage the same kernel compacts
    the pool at the guess (positions and values interleaved in the slots of :func:`pool_slots`):
    the gradient is read once, and one transfer brings back the partials and the first
    :func:`pool_fetch` slots, 8 bytes each. With more stages, stage 2's read: a
    tail's compaction over ``g`` and the pool's (the counters they add to were zeroed by the call
    before: no launch), one transfer; every later stage, count and correction on the host from the
    pool. The selected positions, sorted on the host, and their values (from the pool, in ``g``'s
    dtype) packed into one host→device copy (no sync, no gather)."""
    fetched = pool_fetch(n, pool, k)
    blocks = fused_blocks(n)
    logs = name == "sidco-gp"
    pooled = planned == 1
    c = Work()
    c.stream(n, itemsize, (16 + 4 * logs) / FUSED_BLOCK + 8 * pool / n * pooled, "log" if logs else "reduce",
             full=True)
    sent = 16.0 + (16.0 + 4 * logs) * blocks
    if not pooled:
        c.to_host(sent)
        c.stream(n, itemsize, 12 / FUSED_BLOCK, "compare", full=True)
        c.stream(n, itemsize, 8 * pool / n, "compare", full=True)
        sent = 16.0 + 12.0 * blocks
    c.to_host(sent + 8.0 * fetched)
    return c.stream(k, 8 + itemsize, 8 + itemsize)


def _sidco(name: str) -> Declaration:
    def declare(n, density, itemsize, stages, rounds, backend, corrections=CORRECTIONS, adapt="count", steps=None,
                pool=None, collects=1, deepened=None):
        planned = len(stage_probabilities(density, stages, 0.25))
        k = target_count(density, n)
        pool = min(n, NATIVE_POOL * k) if pool is None else pool
        deepened = default_deepened(name, density, adapt, corrections) if deepened is None else deepened
        if backend == "fused":
            return _sidco_fused(name, n, k, itemsize, planned, pool), sparse_decompress(n, k, itemsize)
        if backend == "native":
            steps = (NATIVE_STEPS if steps is None else steps) if corrections and adapt == "count" else 0
            full = min(planned, 2) if rounds is None else rounds
            return (_sidco_native(name, n, itemsize, planned + deepened, k, pool, full, steps, collects),
                    sparse_decompress(n, k, itemsize))
        return (_sidco_torch(name, n, k, itemsize, planned, pool, exact=bool(corrections) and adapt == "count",
                             deepened=deepened),
                sparse_decompress(n, k, itemsize))

    return declare


def _sidco_pool(w: Work, n: int, capacity: int, itemsize: int, ship: bool = False) -> float:
    """SIDCo's pool on the torch path: ``hardshrink`` of ``g`` at ``pool_at`` into the kept
    buffer, ``nonzero_static`` of it into ``capacity`` slots (a pass over it), the values gathered
    and made magnitudes in place; then its histogram (their float32 bits capped and widened to
    float64 by one ``minimum``, ``histc``), or when its values travel (float64 data, ``ship``)
    nothing more. Returns the bytes of what travels to the host (the histogram, or the pool's
    values as float64)."""
    whole = capacity >= n
    w.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 8 * capacity / n, full=True)
    w.gather(capacity).stream(capacity, itemsize, itemsize, full=whole)
    if itemsize == 8 or ship:
        return capacity * 8.0
    if itemsize != 4:
        w.stream(capacity, itemsize, 4, full=whole)
    w.stream(capacity, 4, 8, full=whole).stream(capacity, 8, 8 * POOL_BINS / capacity, "count", full=whole)
    return 8.0 * POOL_BINS


def _tail_reductions(c: Work, name: str, size: int, n: int, itemsize: int) -> int:
    """A later stage's statistics on the torch path: the ``hardshrink`` of ``size`` elements (``g``
    or the pool) at the stage's shift, its ``‖·‖₀``, ``‖·‖₁`` and, but for SIDCo-E, ``‖·‖₂``.
    Returns how many statistics it writes."""
    whole = size >= n
    c.stream(size, itemsize, itemsize, full=whole)
    c.stream(size, itemsize, 0, "count", full=whole).stream(size, itemsize, 0, "reduce", full=whole)
    if name == "sidco-e":
        return 2
    c.stream(size, itemsize, 0, "reduce", full=whole)
    return 3


def _sidco_torch(name: str, n: int, k: int, itemsize: int, planned: int, pool: float, exact: bool = True,
                 deepened: int = 0) -> Work:
    """SIDCo's torch path (any device; :class:`compressors.sidco._TorchOps`), a call after one of
    the same size (its pool guess held: every try inside the pool's histogram or known to select
    too many). No ``|g|`` is materialised, and every statistic is a float64 reduction written
    (``out=``) into one buffer that travels to the host with the pool's histogram (one transfer
    per stage read, nothing concatenated). Stage 1's reductions of ``g`` (``‖g‖₁``; ``‖g‖₂`` for
    SIDCo-P; for SIDCo-GP ``|g|`` into a float32 scratch, clamped and its logarithms taken in
    place, their sum, and ``‖g‖₀``), read with the pool's histogram when there is one stage; with
    more, stage 2's ``hardshrink`` of ``g`` at ``η₁`` and its ``‖·‖₀``, ``‖·‖₁`` (and ``‖·‖₂``
    but for SIDCo-E), read with the pool's histogram; each later stage the same reductions of the
    pool's ``hardshrink`` (one transfer each); without count corrections (``exact`` false:
    ``adapt="paper"`` or ``corrections=0``) the count at the final threshold, the pool's
    ``hardshrink`` and its ``‖·‖₀`` (one transfer); each stage added within the call
    (``deepened``) the same reductions of the pool's ``hardshrink`` (one transfer), its tries
    answered by the pool's histogram, unless the pool has at most :data:`SHIP_SLOTS` slots: then
    (the call before it having added one too) the pool's values travel with the statistics,
    concatenated, and the added stages are read on the host; the selection is a ``nonzero_static`` over the pool sized by
    the count the host already has, two gathers. No 0-d arithmetic on the device."""
    capacity = pool_slots(n, pool, k)
    whole = capacity >= n
    ship = ships_values(deepened > 0, capacity)
    c = Work()
    stats = 1
    c.stream(n, itemsize, 0, "reduce", full=True)
    if name == "sidco-p":
        c.stream(n, itemsize, 0, "reduce", full=True)
        stats += 1
    if name == "sidco-gp":
        c.stream(n, itemsize, 4, full=True).stream(n, 4, 4, full=True).stream(n, 4, 4, "log", full=True)
        c.stream(n, 4, 0, "reduce", full=True).stream(n, itemsize, 0, "count", full=True)
        stats += 2
    for m in range(1, planned + 1):
        if m > 1:
            stats = _tail_reductions(c, name, capacity if m > 2 else n, n, itemsize)
        sent = 8.0 * stats
        if m == min(planned, 2):
            pool_bytes = _sidco_pool(c, n, capacity, itemsize, ship)
            if itemsize == 8 or ship:  # the statistics and the pool's values concatenated, as float64
                c.stream(stats + capacity, itemsize, 8, full=stats + capacity >= n)
            sent += pool_bytes
        c.to_host(sent)
    for _ in range(0 if ship else deepened):
        c.to_host(8.0 * _tail_reductions(c, name, capacity, n, itemsize))
    if not exact:
        c.stream(capacity, itemsize, itemsize, full=whole).stream(capacity, itemsize, 0, "count", full=whole).to_host(8)
    c.stream(capacity, itemsize, 1, "compare", full=whole).stream(capacity, 1, 8 * k / capacity, full=whole).gather(k)
    return c.gather(k)


NATIVE_HOST_LAUNCHES = 3
"""Host time of one of SIDCo's native kernels beyond the kernel, in eager operations: its ctypes
call and the stage loop's float algebra around it (measured: SIDCo-E, -P and -GP at one stage on
4,096 gradient-like elements, 8–10 kernels and 2 torch operations per call, 103–143 µs of process
CPU time per call against 3.9 µs per operation of Gaussian-k's compress, 2026-12-02, loaded
machine: 3.0–3.4 operations per kernel)."""


def _sidco_native(name, n, itemsize, stages, k, pool, full_passes, steps, collects=1):
    """SIDCo's native path (``native.scan``: one read pass per kernel, 8 bytes written per
    selected element). Its kernels: stage 1's statistics, one tail per later stage, any full pass
    a try below the pool took, and the final selection. ``full_passes`` of them read the whole
    vector (by default stage 1's and stage 2's, one of which, ``collects``, also collects the pool
    of ``pool`` candidates above a guess from the previous call; then any try that fell below the
    pool); the others (later stages' statistics too) read only the pool. Its counts take no
    kernel: the count at the last stage's threshold and one per correction step (``steps``: how
    many, between 0 and ``corrections``; a try below a pool of more than (1 + band)·k elements is
    not counted) are numpy passes over the pool's magnitudes on the host
    (:func:`compressors.kernels.native.count_above`), each one launch of host time with the correction's
    float algebra around it. Host floats throughout: no 0-d operations, no synchronisations; each
    kernel's host time is :data:`NATIVE_HOST_LAUNCHES` launches more."""
    kernels = stages + 1 + max(0, full_passes - min(stages, 2))
    c = Work()
    for i in range(kernels):
        last = i == kernels - 1
        if i < full_passes:
            selecting = i < collects or last
            kind = "native_log" if i == 0 and name == "sidco-gp" else "native_select" if selecting else "native"
            c.stream(n, itemsize, 8 * (k if last else pool if selecting else 0) / n, kind, full=True)
        else:
            c.stream(pool, 8, 8 * k / max(pool, 1) if last else 0, "native_select" if last else "native")
    for _ in range(1 + steps):
        c.stream(pool, 4, 0, "count")
    return c.scalars(NATIVE_HOST_LAUNCHES * kernels).stream(k, 4, 8).gather(k)


def loops(ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """SIDCo's native path's counts read from one call's operations: its full passes
    (``rounds``), its ``pool`` (the mean size of what its pool kernels and host counts read), the
    full passes that collected a pool (``collects``) and, given the ``stages`` it planned, its
    correction ``steps`` (its host counts but the one at the last stage's threshold); nothing for a
    call that ran no native kernel (its torch path's work follows its planned and added stages)."""
    pools = [int(op.rsplit(":", 1)[1]) for op in ops if op.startswith("native.scan:pool:")]
    host_counts = [int(op.rsplit(":", 1)[1]) for op in ops if op.startswith("native.count:")]
    if not ops.count("native.scan:full") + len(pools):
        return {}
    read = pools + host_counts
    counts: dict[str, Any] = {"rounds": ops.count("native.scan:full"), "pool": sum(read) / len(read) if read else 0,
                              "collects": ops.count("native.scan:collect")}
    if stages is not None:
        counts["steps"] = max(0, len(host_counts) - 1)
    return counts


def _card(name: str, cls: str) -> Card:
    """The card of SIDCo variant ``name`` implemented by ``cls``: each has a fused path of its own
    (:func:`fused_runs`) and native kernels on a CPU."""
    return Card(name, f"compressors.sidco:{cls}", "sparse", Declared(_sidco(name), sparse_wire, fused=fused_runs),
                native_on_cpu=True, loops=loops)


SIDCO_E = _card("sidco-e", "SIDCoE")
"""SIDCo-E: the exponential fit."""

SIDCO_P = _card("sidco-p", "SIDCoP")
"""SIDCo-P: the generalised Pareto fit."""

SIDCO_GP = _card("sidco-gp", "SIDCoGP")
"""SIDCo-GP: a gamma fit in stage 1, generalised Pareto in later stages."""

DECLARES: dict[str, Declared] = {card.name: card.declared for card in (SIDCO_E, SIDCO_P, SIDCO_GP)}
"""Each variant's declaration by name, as :mod:`compressors.sidco` binds it (from the cards)."""
