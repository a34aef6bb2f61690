"""Run (or resume) a convergence run into the results store: training, its trace, the trace's replay.

A convergence run is identified by its :class:`convergence.RunConfig` (``convergences``
table); each (compressor, density) trained is written to ``convergence_rows`` in one
transaction when its last iteration is done, so a run killed halfway loses only the
combination in flight, and a rerun trains only the combinations not stored (each
(compressor, density, iteration) lands exactly once). The first combination trained
while the run has no trace records every ``trace_every``-th iteration's per-worker
gradients and timings with :class:`traces.Recorder`; the trace is registered and linked
to the run, and then replayed through the run's compressors (:mod:`pipeline.replay`), so
projected compute and compression costs come from the same training.

A DiLoCo run (``config.sync_every`` H > 1, :func:`convergence.train_diloco`) trains one pair,
its outer compressor and density (:func:`outer_pair`), and records no trace: its sites exchange
nothing per step, and a per-step trace of the same model comes from the synchronous run.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import traces
from convergence import RunConfig, train, train_diloco
from convergence.curves import document as curves_document  # the door prints a run's curves by it
from convergence.optim import OPTIMIZERS, OUTER_LR, OUTER_MOMENTUM  # the door names the defaults by them
import pipeline.replay
from pipeline.request import check_compressors, pair, takes_density
from units import Pair, check_count, check_density
from results.store import Store

ProgressFn = Callable[[str, int, int], None]
"""``progress(label, done, total)``: ``label`` names the combination (or ``replay``)."""


@dataclass(frozen=True)
class ConvergeResult:
    """What :func:`run` did: the run's id, the pairs trained now and skipped, its trace and replay."""

    convergence_id: int
    trained: list[Pair]
    skipped: list[Pair]
    trace_id: int | None
    replay_id: int | None


def pairs(names: Sequence[str], densities: Sequence[float]) -> list[Pair]:
    """(compressor, density) combinations to train: ``none`` first and every compressor that
    ignores the density (the dense casts fp16/bf16 and low-rank PowerSGD:
    :func:`pipeline.request.takes_density`) once without one (``None``), the sparsifiers at every
    density. ``ValueError`` for an unknown compressor or a density outside (0, 1]."""
    check_compressors(names)
    if not names:
        raise ValueError("give at least one compressor")
    for density in densities:
        check_density(density, "invalid density:")
    result = [Pair("none")] if "none" in names else []
    others = [n for n in dict.fromkeys(names) if n != "none"]
    result += [Pair(n) for n in others if not takes_density(n)]
    sparse = [n for n in others if takes_density(n)]
    if sparse and not densities:
        raise ValueError("give at least one density")
    result += [Pair(n, float(d)) for n in sparse for d in dict.fromkeys(densities)]
    return result


def outer_pair(config: RunConfig) -> Pair:
    """The one pair a DiLoCo run (H > 1) trains and stores its rows under: its outer compressor
    and the density it sends (``None`` for one that takes none)."""
    return pair(config.outer_compressor, config.outer_density)


def trained(store: Store, convergence_id: int, iterations: int) -> set[Pair]:
    """The pairs convergence run ``convergence_id`` holds all ``iterations`` rows of (a store
    written by an older version, which recorded density 1.0 for the dense pairs, reads alike)."""
    return {pair(c, d) for c, d in store.convergence_done(convergence_id, iterations)}


def trace_dir(store: Store, convergence_id: int) -> Path:
    """Where a run's trace is written: ``traces/convergence-<id>`` beside the store file."""
    return store.path.resolve().parent / "traces" / f"convergence-{convergence_id}"


@contextmanager
def _one_at_a_time(store: Store, convergence_id: int) -> Iterator[None]:
    """Hold the run's lock (``flock`` on ``.<store>.convergence-<id>.lock`` beside the store) for
    the body: a second launch of the same run waits here for the first to finish, then finds its
    combinations stored and trains nothing (it joins the first). The kernel drops the lock when
    its holder dies, so a killed run never blocks the next; where no lock file can be made (a
    read-only folder) runs are not serialised."""
    path = store.path.resolve().parent / f".{store.path.name}.convergence-{convergence_id}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def default_trace_every(iterations: int) -> int:
    """Record about five iterations of a run (every ``iterations // 5``-th, at least every one)."""
    return max(1, iterations // 5)


def open_run(store: Store, config: RunConfig) -> int:
    """Find or create the ``convergences`` row of ``config``; return its id."""
    config.check()
    columns = ({"sync_every": config.sync_every, "outer_compressor": config.outer_compressor,
                "outer_density": config.as_dict()["outer_density"]} if config.diloco else {})
    convergence_id, _ = store.get_or_create("convergences", config.as_dict(), **columns)
    return convergence_id


def run(
    store: Store,
    config: RunConfig,
    combinations: Sequence[Pair],
    *,
    trace_every: int | None = None,
    replay: bool = True,
    record: bool = True,
    progress: ProgressFn | None = None,
    started: Callable[[int], None] | None = None,
) -> ConvergeResult:
    """Train every combination of ``combinations`` not yet stored; return what was done.

    ``started(convergence_id)`` is called once the run's row exists. ``trace_every``:
    record every N-th iteration into the run's trace (default :func:`default_trace_every`).
    ``replay``: replay the trace through the run's compressors (costs for projections).
    ``record``: record a trace at all (the further seeds of :func:`run_seeds` do not).
    A second launch of the same run while one trains waits for it and trains nothing it stored.
    Each combination is read by :func:`pipeline.request.pair` (a dense one's 1.0 is ``None``).
    A DiLoCo configuration (H > 1) trains exactly its :func:`outer_pair` (``ValueError`` for any
    other combinations) and records no trace.
    """
    combinations = list(dict.fromkeys(pair(c, d) for c, d in combinations))
    if config.diloco and combinations != [outer_pair(config)]:
        raise ValueError(f"a DiLoCo run (sync every {config.sync_every}) trains its outer compressor "
                         f"{outer_pair(config).label}, not {', '.join(p.label for p in combinations) or 'nothing'}")
    convergence_id = open_run(store, config)
    if started is not None:
        started(convergence_id)
    every = default_trace_every(config.iterations) if trace_every is None else int(trace_every)
    if not 1 <= every <= config.iterations:
        raise ValueError(f"trace-every must be between 1 and iterations ({config.iterations}), got {every}")
    with _one_at_a_time(store, convergence_id):
        return _run_locked(store, config, convergence_id, combinations, every, replay, record, progress)


def _run_locked(store: Store, config: RunConfig, convergence_id: int, combinations: Sequence[Pair],
                every: int, replay: bool, record: bool, progress: ProgressFn | None) -> ConvergeResult:
    done = trained(store, convergence_id, config.iterations)
    todo = [p for p in combinations if p not in done]
    skipped = [p for p in combinations if p in done]
    store.set_status("convergences", convergence_id, "running")
    for compressor, density in todo:
        row = store.convergence(convergence_id)
        recording = record and not config.diloco and row is not None and row["trace_id"] is None
        recorder_factory = _recorder_factory(store, convergence_id, config, every) if recording else None
        def step(iteration: int, loss: float, label: str = Pair(compressor, density).label) -> None:
            if progress is not None:
                progress(label, iteration, config.iterations)

        if config.diloco:
            rows = list(train_diloco(config, progress=step))
        else:
            rows = list(train(config, compressor, density, recorder_factory=recorder_factory, progress=step))
        if recording:
            trace = traces.open(trace_dir(store, convergence_id))
            store.set_convergence_trace(convergence_id, store.register_trace(trace.path, trace.manifest))
        store.write_convergence(convergence_id, rows)
    final = store.convergence(convergence_id)
    trace_id = final["trace_id"] if final is not None else None
    replay_id = None
    if replay and trace_id is not None:
        replay_id = replay_run(store, convergence_id, combinations, progress=progress)
    store.set_status("convergences", convergence_id, "done")
    return ConvergeResult(convergence_id, todo, skipped, trace_id, replay_id)


def replay_run(store: Store, convergence_id: int, combinations: Sequence[Pair],
               progress: ProgressFn | None = None) -> int | None:
    """Replay the run's trace through its compressors (whole model, error feedback, CPU); the replay id."""
    row = store.convergence(convergence_id)
    if row is None or row["trace_id"] is None:
        return None
    path = store.trace(int(row["trace_id"]))["path"]
    compressed = [Pair(c, d) for c, d in combinations if c != "none"]
    if not compressed:
        return None

    def step(done: int, total: int) -> None:
        if progress is not None:
            progress("replay", done, total)

    replay_id = None
    for density in dict.fromkeys(p.stored_density for p in compressed):  # one replay; each density its compressors
        names = [p.compressor for p in compressed if p.stored_density == density]
        replay_id = pipeline.replay.run(store, path, names, [density], progress=step).replay_id
    return replay_id


def run_seeds(store: Store, config: RunConfig, combinations: Sequence[Pair], seeds: int,
              **options: Any) -> list[ConvergeResult]:
    """:func:`run` for ``seeds`` runs of ``config`` with seeds ``config.seed``, ``config.seed + 1``, …
    (model and data drawn from each); the first records the trace and replays it, the others only
    train (``sidco tta`` projects every seed's iterations with the first one's trace).
    ``options``: :func:`run`'s keywords."""
    check_count(seeds, "seeds")
    results = [run(store, config, combinations, **options)]
    for offset in range(1, seeds):
        results.append(run(store, replace(config, seed=config.seed + offset), combinations,
                           **{**options, "record": False, "replay": False}))
    return results


def _recorder_factory(store: Store, convergence_id: int, config: RunConfig, every: int) -> Callable[[Any, int], traces.Recorder]:
    def factory(model: Any, batch_size: int) -> traces.Recorder:
        return traces.Recorder(
            model, trace_dir(store, convergence_id), every=every, workers=config.workers, batch_size=batch_size,
            workload=config.workload, overwrite=True,
            extra={"capture": {**config.as_dict(), "convergence_id": convergence_id,
                               "parallelism": "simulated data parallel (one process, compressed gradients averaged)"}},
        )

    return factory
