"""Emulated FSDP2 / HSDP training: real ``fully_shard`` ranks on gloo, one per namespace, on shaped links.

:func:`run_fsdp` builds the network for ``workers`` ranks at ``bandwidth_bps`` (or loopback), runs
:mod:`emulation.fsdp_worker` on it and returns the measured iteration time (mean over the timed
steps of each rank, averaged over ranks, s) and its median over the timed steps, the per-phase
means, every rank's compute-only, one-rank FSDP2 (host) and memory-copy passes, the collectives of
one step as the flight recorder logged them (the same on every timed step and rank, else
:class:`CollectivesDiffer`) and the closed form of :func:`emulation.fsdp_plan.collectives` beside
them; :func:`matches` says whether the two agree exactly.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from emulation.fsdp_plan import annotate, check_mesh, collectives, scaled, shard_numel, totals, units
from emulation.launch import run_workers
from emulation.network import shaped_links
from units import check_count

SECONDS_PER_STEP_GUESS = 2.0  # generous per-step compute bound on a busy 2-core machine (s)
KEYS = ("op", "group", "phase", "input_bytes", "output_bytes")


class CollectivesDiffer(RuntimeError):
    """Two timed steps (or two ranks) issued different collectives."""


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in KEYS)


def matches(measured: Sequence[dict[str, Any]], expected: Sequence[dict[str, Any]]) -> bool:
    """Whether ``measured`` (flight-recorder rows of one step) holds exactly the collectives of
    ``expected`` (the closed form): the same operations, groups, phases and buffer bytes, as often."""
    return Counter(map(_key, measured)) == Counter(map(_key, expected))


def one_step(per_rank: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The collectives of one step, checked to be the same multiset on every timed step of every rank."""
    first = per_rank[0]["steps"][0]["collectives"]
    for rank in per_rank:
        for index, step in enumerate(rank["steps"]):
            if Counter(map(_key, step["collectives"])) != Counter(map(_key, first)):
                raise CollectivesDiffer(f"rank {rank['rank']} step {index} issued other collectives than rank 0's "
                                        "first timed step")
    return [{k: r[k] for k in KEYS} for r in first]


def _timeout_s(workers: int, bandwidth_bps: float | None, steps: int, model_bytes: int) -> float:
    contention = max(1.0, workers / (os.cpu_count() or 1))
    comm = 0.0 if bandwidth_bps is None else 6.0 * model_bytes * 8.0 / bandwidth_bps
    return 120.0 + steps * (SECONDS_PER_STEP_GUESS * contention + 3.0 * comm)


def run_fsdp(workers: int, bandwidth_bps: float | None, model: str, parallel: str, *, shard_size: int | None = None,
             layers: int = 2, hidden: int = 64, vocab: int = 512, tokens: int = 32, batch_size: int = 2,
             iterations: int = 4, warmup: int = 2, seed: int = 0) -> dict[str, Any]:
    """Train ``model`` scaled down (:func:`emulation.fsdp_plan.scaled`) under ``parallel`` (``fsdp``
    or ``hsdp``) on ``workers`` ranks over links of ``bandwidth_bps`` bits/s (``None``: loopback).

    Returns the request (``model``, ``parallel``, ``workers``, ``bandwidth_bps``, the sizes),
    ``measured_s`` (s), ``median_s`` (the median over the timed steps of the step averaged over
    ranks, s), ``phases_s``, ``per_rank_iteration_s``, ``compute_passes``, ``host_passes`` and
    ``copy_passes`` (per rank, :mod:`emulation.fsdp_worker`), ``tx_bytes`` (per rank, the mean
    bytes its interface sent per step; ``None`` on loopback),
    ``collectives`` (one step, measured, :func:`emulation.fsdp_plan.annotate`d), ``expected`` (one
    step, closed form), ``match``, ``totals`` (of the measured step), ``mesh``
    (replicas, shard), ``parameters`` and ``units`` (name, elements of one shard).
    """
    replicas, shard = check_mesh(parallel, workers, shard_size)
    config = scaled(model, layers, hidden, vocab, tokens)
    check_count(iterations, "iterations")
    check_count(batch_size, "batch size")
    if warmup < 0:
        raise ValueError(f"warm-up must be >= 0, got {warmup}")
    expected = collectives(config, parallel, workers, shard_size)
    model_bytes = sum(max(r["input_bytes"], r["output_bytes"]) for r in expected)
    args = ["--model", model, "--parallel", parallel, "--layers", str(layers), "--hidden", str(hidden),
            "--vocab", str(vocab), "--tokens", str(tokens), "--batch-size", str(batch_size),
            "--iterations", str(iterations), "--warmup", str(warmup), "--seed", str(seed)]
    if shard_size is not None:
        args += ["--shard-size", str(shard_size)]
    timeout = _timeout_s(workers, bandwidth_bps, warmup + 2 * iterations, model_bytes)
    with shaped_links(workers, bandwidth_bps) as plan:
        per_rank = run_workers("emulation.fsdp_worker", args, workers, plan, timeout)
    measured = [annotate(r, replicas, shard) for r in one_step(per_rank)]
    means = {key: statistics.fmean(statistics.fmean(s[key] for s in rank["steps"]) for rank in per_rank)
             for key in ("iteration_s", "forward_s", "backward_s", "optimizer_s")}
    return {
        "model": model, "parallel": parallel, "workers": workers, "bandwidth_bps": bandwidth_bps,
        "layers": layers, "hidden": hidden, "vocab": vocab, "tokens": tokens, "batch_size": batch_size,
        "mesh": [replicas, shard], "measured_s": means["iteration_s"], "phases_s": means,
        "median_s": statistics.median(statistics.fmean(rank["steps"][i]["iteration_s"] for rank in per_rank)
                                      for i in range(iterations)),
        "per_rank_iteration_s": [statistics.fmean(s["iteration_s"] for s in rank["steps"]) for rank in per_rank],
        "compute_passes": [rank["compute_passes"] for rank in per_rank],
        "host_passes": [rank["host_passes"] for rank in per_rank],
        "copy_passes": [rank["copy_passes"] for rank in per_rank],
        "tx_bytes": None if bandwidth_bps is None else [
            statistics.fmean(s["tx_bytes"] for s in rank["steps"]) for rank in per_rank],
        "collectives": measured, "expected": expected, "match": matches(measured, expected),
        "totals": totals(measured),
        "parameters": per_rank[0]["parameters"],
        "units": [{"name": name, "shard_numel": shard_numel(shapes, shard)} for name, shapes in units(config)],
    }
