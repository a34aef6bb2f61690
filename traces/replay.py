"""Replay a trace through compressors: threshold quality and overhead on real gradients.

:func:`replay` runs every (compressor, density) combination over every recorded
(iteration, worker) in order, per bucket, carrying error feedback across
iterations per (worker, bucket), and yields one row per compressor call whose
keys are exactly the ``replay_rows`` columns of the results store (minus
``replay_id``):

==========================  ===============================================================
``compressor``, ``density``  the combination (``density`` = target fraction of elements)
``error_feedback``           1 if the residual was carried, else 0
``iteration``, ``worker``    recorded iteration number and worker index
``bucket``                   bucket index (0 = first bucket, holding the last layers)
``numel``                    elements in the bucket
``selected``                 elements sent
``achieved_density``         ``selected / numel``
``achieved_over_target``     ``achieved_density / density``
``threshold``                magnitude threshold the compressor used (``None`` if it has none)
``stages``                   estimation stages (SIDCo) or ``None``
``compress_s``               seconds of the compress call (with error feedback: including the
                             residual update), device-synchronised
``decompress_s``             seconds of the decompress call, device-synchronised
``wire_bytes``               bytes on the wire (the message's ``wire_bytes()``: sparse values +
                             int32 indices, a dense cast, or PowerSGD's P, Q and rest)
``rel_error``                ‖g − ĝ‖ / ‖g‖, g the compressed input (gradient + residual), ĝ the
                             decompressed message (0 when ‖g‖ = 0)
``backend``                  what ran the call: ``native`` (fused C kernels), ``torch`` or ``cuda``
``call_index``               0-based index of the call among its compressor instance's calls
``energy``                   ‖ĝ‖² / ‖g‖²: the share of the input's squared norm the message sends
                             (1 when ‖g‖ = 0)
``topk_energy``              ‖Top-k(g)‖² / ‖g‖²: the share exact Top-k at the target density
                             (k = max(1, round(density · numel))) would send of the same input;
                             ``None`` for compressors that take no density (casts, PowerSGD, none)
==========================  ===============================================================

``energy`` / ``topk_energy`` is how much of the gradient a compressor sends next to exact Top-k
at the same density, on the very input it was given (error feedback included); both are computed
after the call's timings are taken.

Compressors are created once per combination and shared by every (worker, bucket), as the
``threshold`` compressors carry only adaptive state; a compressor whose state is per tensor
(PowerSGD's warm-started Q, ``message == "lowrank"``) gets one instance per (worker, bucket),
created with that bucket's layer ``shapes`` from the trace.

Buckets follow DistributedDataParallel (:func:`compressors.ddp.buckets.assign`): layers are
taken in reverse order (the order backward produces them) and a bucket is closed as soon as
it holds at least its cap in bytes of float32 gradient: ``first_bucket_bytes`` for the first,
``bucket_bytes`` for the others (a layer larger than that gets a bucket of its own). As in
``DistributedDataParallel(bucket_cap_mb=...)``, the first cap defaults to the others. Without
``bucket_bytes`` the whole model is one bucket.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

import compressors as compressor_lib
from compressors.ddp.buckets import assign
from compressors.rules import target_count
from compressors.numerics.selection import Workspace, exact_topk
from machine.device import resolve as resolve_device
from machine.timing import no_sync, timed
from traces.reader import Trace, open_trace
from units import check_density

COLUMNS = (
    "compressor",
    "density",
    "error_feedback",
    "iteration",
    "worker",
    "bucket",
    "numel",
    "selected",
    "achieved_density",
    "achieved_over_target",
    "threshold",
    "stages",
    "compress_s",
    "decompress_s",
    "wire_bytes",
    "rel_error",
    "backend",
    "call_index",
    "energy",
    "topk_energy",
    "fallback",
)


def bucket_shapes(trace: Trace, parts: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Layer shapes, in order, of a bucket given as ``(offset, numel)`` slices (as :func:`buckets`
    returns them: one layer each, or the whole model); a slice that does not cover whole layers
    counts as one 1-D tensor."""
    layers = [(offset, numel, tuple(shape))
              for (_, offset, numel), (_, shape) in zip(trace.layer_slices(), trace.layers) if numel > 0]
    result: list[tuple[int, ...]] = []
    for start, length in parts:
        inside = [(o, n, shape) for o, n, shape in layers if start <= o and o + n <= start + length]
        if inside and inside[0][0] == start and sum(n for _, n, _ in inside) == length:
            result.extend(shape for _, _, shape in inside)
        else:
            result.append((length,))
    return result


def buckets(
    trace: Trace, bucket_bytes: int | None = None, first_bucket_bytes: int | None = None
) -> list[list[tuple[int, int]]]:
    """DDP buckets of ``trace``: lists of ``(offset, numel)`` layer slices (see module docstring).

    ``bucket_bytes``/``first_bucket_bytes``: caps in bytes (``first_bucket_bytes`` defaults to
    ``bucket_bytes``); ``bucket_bytes=None``: the whole model as one bucket.
    """
    slices = [(offset, numel) for _, offset, numel in trace.layer_slices() if numel > 0]
    if bucket_bytes is None:
        return [[(0, trace.numel)]]
    first = bucket_bytes if first_bucket_bytes is None else first_bucket_bytes
    if bucket_bytes < 1 or first < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {bucket_bytes} (first bucket {first})")
    return [[slices[i] for i in group] for group in assign([4 * n for _, n in slices], bucket_bytes, first)]


def calls_per_combination(trace: Trace, bucket_bytes: int | None = None, first_bucket_bytes: int | None = None) -> int:
    """Rows one (compressor, density) combination produces: iterations × workers × buckets."""
    return len(trace.iterations) * trace.workers * len(buckets(trace, bucket_bytes, first_bucket_bytes))


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return no_sync


def _gather(flat: torch.Tensor, parts: Sequence[tuple[int, int]]) -> torch.Tensor:
    if len(parts) == 1:
        offset, numel = parts[0]
        return flat[offset : offset + numel]
    return torch.cat([flat[offset : offset + numel] for offset, numel in parts])


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x, dtype=torch.float64))


def topk_energy(x: torch.Tensor, density: float, workspace: Workspace | None = None) -> float:
    """‖Top-k(x)‖², k = :func:`compressors.rules.target_count` (``density``, ``x.numel()``): the
    squared norm exact Top-k at ``density`` sends of ``x`` (float64 sum; 0 for an empty ``x``)."""
    k = target_count(density, x.numel())
    if k == 0:
        return 0.0
    top = exact_topk(x, k, workspace or Workspace())
    return _norm(top.magnitudes) ** 2


def replay(
    trace: Trace | str | os.PathLike[str],
    compressors: Iterable[str],
    densities: Iterable[float],
    device: str | torch.device = "cpu",
    error_feedback: bool = True,
    bucket_bytes: int | None = None,
    first_bucket_bytes: int | None = None,
    skip: frozenset[tuple[str, float]] | set[tuple[str, float]] = frozenset(),
    options: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    """Return an iterator of one row per compressor call (module docstring), combination by combination.

    ``bucket_bytes``/``first_bucket_bytes``: DDP bucket caps in bytes (:func:`buckets`).
    ``skip`` holds ``(compressor, density)`` pairs not to run (already stored).
    ``options`` maps a compressor name to extra keyword options of
    :func:`compressors.create`. ``seed``: randomised compressors (dgc, randomk) are reseeded
    before every call from it and (compressor, density, iteration, worker, bucket)
    (:func:`call_seed`), so identical replays give identical rows. Rows of one combination are consecutive, in
    (iteration, worker, bucket) order. Arguments are checked before this returns
    (``ValueError``, :class:`traces.TraceError`); the work happens as the iterator is consumed.
    """
    if not isinstance(trace, Trace):
        trace = open_trace(trace)
    names = list(compressors)
    targets = [float(d) for d in densities]
    for density in targets:
        check_density(density)
    dev = resolve_device(device)
    layout = buckets(trace, bucket_bytes, first_bucket_bytes)
    options = options or {}
    combinations = [(n, d) for n in names for d in targets if (n, d) not in skip]
    for name, density in combinations:
        compressor_lib.create(name, density=density, **options.get(name, {}))
    return (
        row
        for name, density in combinations
        for row in _combination(trace, layout, name, density, dev, error_feedback, options.get(name, {}), seed)
    )


def call_seed(seed: int, compressor: str, density: float, iteration: int, worker: int, bucket: int) -> int:
    """The seed of one compressor call of a replay: a 63-bit hash of the replay's ``seed`` and
    (compressor, density, iteration, worker, bucket), the same in every identical replay."""
    key = f"{seed}|{compressor}|{density!r}|{iteration}|{worker}|{bucket}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def _combination(
    trace: Trace,
    layout: list[list[tuple[int, int]]],
    name: str,
    density: float,
    device: torch.device,
    error_feedback: bool,
    options: dict[str, Any],
    seed: int,
) -> Iterator[dict[str, Any]]:
    sync = _synchronizer(device)
    per_tensor = compressor_lib.message_kind(name) == "lowrank"
    sparsifier = compressor_lib.takes_density(name)
    workspace = Workspace()
    shapes = [bucket_shapes(trace, parts) for parts in layout]

    def make(index: int) -> compressor_lib.Compressor:
        extra = {"shapes": shapes[index]} if per_tensor and "shapes" not in options else {}
        return compressor_lib.create(name, density=density, **options, **extra)

    instances: dict[tuple[int, int], tuple[compressor_lib.Compressor, compressor_lib.ErrorFeedback | None]] = {}
    calls: dict[int, int] = {}

    def instance(worker: int, index: int) -> tuple[compressor_lib.Compressor, compressor_lib.ErrorFeedback | None]:
        key = (worker, index) if per_tensor else (0, 0)
        if key not in instances:
            c = make(index)
            instances[key] = (c, compressor_lib.ErrorFeedback(c) if error_feedback else None)
        return instances[key]

    warm = make(0)
    first = trace.gradient(trace.iterations[0], 0).to(device)
    warm.decompress(warm.compress(_gather(first, layout[0]).clone()))
    sync()
    for iteration in trace.iterations:
        for worker in range(trace.workers):
            flat = trace.gradient(iteration, worker).to(device)
            for index, parts in enumerate(layout):
                grad = _gather(flat, parts).contiguous()
                compressor, memory = instance(worker, index)
                call_index = calls.get(id(compressor), 0)
                calls[id(compressor)] = call_index + 1
                compressor.reseed(call_seed(seed, name, density, iteration, worker, index))
                compress_s, sparse = timed(lambda: compressor.compress(grad) if memory is None
                                           else memory.compress(grad, (worker, index)), time.perf_counter, sync)
                decompress_s, restored = timed(lambda: compressor.decompress(sparse), time.perf_counter, sync)
                if memory is not None:
                    residual = memory.residual((worker, index))
                    given = residual + restored
                    error = _norm(residual)
                else:
                    given = grad
                    error = _norm(grad - restored)
                total, sent = _norm(given), _norm(restored)
                numel = grad.numel()
                selected = sparse.selected
                achieved = selected / numel
                threshold = sparse.threshold
                yield {
                    "compressor": name,
                    "density": density,
                    "error_feedback": int(error_feedback),
                    "iteration": iteration,
                    "worker": worker,
                    "bucket": index,
                    "numel": numel,
                    "selected": selected,
                    "achieved_density": achieved,
                    "achieved_over_target": achieved / density,
                    "threshold": None if threshold is None or not math.isfinite(threshold) else threshold,
                    "stages": sparse.stages,
                    "compress_s": compress_s,
                    "decompress_s": decompress_s,
                    "wire_bytes": int(sparse.wire_bytes()),
                    "rel_error": error / total if total > 0 else 0.0,
                    "backend": compressor.backend,
                    "call_index": call_index,
                    "energy": (sent / total) ** 2 if total > 0 else 1.0,
                    "topk_energy": ((topk_energy(given, density, workspace) / total**2 if total > 0 else 1.0)
                                    if sparsifier else None),
                    "fallback": int(sparse.fallback),
                }


__all__ = ["COLUMNS", "bucket_shapes", "buckets", "call_seed", "calls_per_combination", "replay", "topk_energy"]
