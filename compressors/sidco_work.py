"""The declared work of SIDCo-E, -P and -GP (:mod:`compressors.sidco`), torch-free for the cost
model (:mod:`compressors.declare`); tests/test_compressors_work.py holds it to the code.

Two code paths: the torch path (any device) and the native path (the fused C kernels on CPU
float32). Work that depends on the data is a function of counts the call reveals: the planned
stage count, the pool, and on the native path its full passes and correction ``steps``
(:data:`NATIVE_STEPS`).
"""

from __future__ import annotations

from collections.abc import Sequence

from compressors.declare import Declaration, Work
from compressors.declare import sparse_decompress as _sparse_decompress
from compressors.rules import stage_probabilities, target_count

NATIVE_STEPS = 5
"""Correction steps SIDCo's native path takes by default (seen on gradient-like data at
δ = 0.01 and 0.001: 4 to 6)."""


NATIVE_POOL = 5
"""Elements in SIDCo's native pool per selected element by default (the pool holds ``|g|`` above
0.9 × the previous call's threshold: about 5·k seen on gradient-like data at δ = 0.01, more
while error feedback's residual is still growing)."""


POOL_ROOM = 2
"""SIDCo's torch path: its pool's slots are ``2 × max(previous pool, k) + 1024`` (as
:data:`compressors.sidco.POOL_ROOM`)."""


def _sidco(name):
    def declare(n, density, itemsize, stages, rounds, backend, corrections=8, adapt="count", steps=None, pool=None,
                collects=1):
        planned = len(stage_probabilities(density, stages, 0.25))
        k = target_count(density, n)
        pool = min(n, NATIVE_POOL * k) if pool is None else pool
        if backend == "native":
            steps = (NATIVE_STEPS if steps is None else steps) if corrections and adapt == "count" else 0
            full = min(planned, 2) if rounds is None else rounds
            return (_sidco_native(name, n, itemsize, planned, k, pool, full, steps, collects),
                    _sparse_decompress(n, k, itemsize))
        return _sidco_torch(name, n, k, itemsize, planned, pool), _sparse_decompress(n, k, itemsize)

    return declare


def _sidco_pool(w: Work, n: int, capacity: int, itemsize: int) -> None:
    """SIDCo's pool on the torch path: ``|g| > pool_at`` into the kept mask, ``nonzero_static``
    into ``capacity`` slots (a pass over the mask), the magnitudes gathered."""
    w.stream(n, itemsize, 1, "compare", full=True).stream(n, 1, 8 * capacity / n, full=True).gather(capacity)


def _sidco_fetch(w: Work, n: int, parts: Sequence[float]) -> None:
    """One read of a stage's results on the host: the parts (bytes) concatenated on the device
    as bytes when there are several, one device→host transfer."""
    total = sum(parts)
    if len(parts) > 1:
        w.stream(total, 1, 1, full=total >= n)
    w.to_host(total)


def _sidco_torch(name: str, n: int, k: int, itemsize: int, planned: int, pool: float) -> Work:
    """SIDCo's torch path (any device; :class:`compressors.sidco._TorchOps`), a call after one of
    the same size (its pool guess held: every try inside the pool or known to select too many):
    ``|g|`` into a kept buffer; stage 1's reductions (Σ|g|; Σ|g|² for SIDCo-P; for SIDCo-GP the
    clamped logarithms, their sum and the count of non-zeros), read to the host with the pool
    when there is one stage; stage 2's kept magnitudes (``threshold``), their count, sum (and norm
    but for SIDCo-E), read to the host with the pool (later stages' statistics come from the pool
    on the host); the selection is a
    ``nonzero_static`` over the pool sized by the count the host already has, two gathers.
    ``min(M, 2)`` transfers, no 0-d arithmetic on the device."""
    capacity = min(n, POOL_ROOM * max(pool, k) + 1024)
    c = Work().stream(n, itemsize, itemsize, full=True)
    parts = [8.0]
    c.stream(n, itemsize, 0, "reduce", full=True)
    if name == "sidco-p":
        c.stream(n, itemsize, 0, "reduce", full=True)
        parts.append(8.0)
    if name == "sidco-gp":
        c.stream(n, itemsize, 4, full=True).stream(n, 4, 4, "log", full=True).stream(n, 4, 0, "reduce", full=True)
        c.stream(n, itemsize, 0, "count", full=True)
        parts += [8.0, 8.0]
    for m in range(1, min(planned, 2) + 1):
        if m > 1:
            c.stream(n, itemsize, itemsize, full=True).stream(n, itemsize, 0, "count", full=True)
            c.stream(n, itemsize, 0, "reduce", full=True)
            parts = [8.0, 8.0]
            if name != "sidco-e":
                c.stream(n, itemsize, 0, "reduce", full=True)
                parts.append(8.0)
        if m == min(planned, 2):
            _sidco_pool(c, n, capacity, itemsize)
            parts.append(capacity * itemsize)
        _sidco_fetch(c, n, parts)
    whole = capacity >= n
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
    selected element). Its kernels: stage 1's statistics, one tail per later stage, the count at
    the last stage's threshold, one per correction step the pool answered or that fell below a
    small pool (``steps``: how many, between 0 and ``corrections``; a try below a pool of more
    than (1 + band)·k elements takes no kernel), and the final selection. ``full_passes`` of them
    read the whole vector (by default stage 1's and stage 2's, one of which, ``collects``, also
    collects the pool of ``pool`` candidates above a guess from the previous call; then any try
    that fell below the pool); the others (later stages' statistics too) read only the pool. Host floats throughout: no 0-d operations,
    no synchronisations; each kernel's host time is :data:`NATIVE_HOST_LAUNCHES` launches more."""
    kernels = stages + 2 + steps
    c = Work()
    for i in range(kernels):
        last = i == kernels - 1
        if i < full_passes:
            selecting = i < collects or last
            kind = "native_log" if i == 0 and name == "sidco-gp" else "native_select" if selecting else "native"
            c.stream(n, itemsize, 8 * (k if last else pool if selecting else 0) / n, kind, full=True)
        else:
            c.stream(pool, 8, 8 * k / max(pool, 1) if last else 0, "native_select" if last else "native")
    return c.scalars(NATIVE_HOST_LAUNCHES * kernels).stream(k, 4, 8).gather(k)


DECLARES: dict[str, Declaration] = {name: _sidco(name) for name in ("sidco-e", "sidco-p", "sidco-gp")}
"""Each SIDCo variant by name."""
