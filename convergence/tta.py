"""Time to target: iterations a run needs to reach a target × the projected time of one iteration.

A run reaches the target at the first *evaluated* iteration whose held-out accuracy is at
least ``target_accuracy`` (or whose held-out loss is at most ``target_loss``); the
resolution is therefore the run's evaluation interval. ``time_to_target_s =
iterations_to_target × iteration_s``. A run that never reaches the target, or that has no
projected iteration time, gets ``None`` and a ``reason``. A pair trained with several seeds
gets the mean and spread of its iterations to target over the seeds (:func:`time_to_target`);
which pair wins, and whether the margin is worth naming, is :func:`pipeline.tta.verdict`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def check_target(target_accuracy: float | None, target_loss: float | None) -> None:
    """Exactly one target: an accuracy in (0, 1] or a loss > 0; ``ValueError`` otherwise."""
    if (target_accuracy is None) == (target_loss is None):
        raise ValueError("give exactly one of --target-accuracy and --target-loss")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"invalid target accuracy {target_accuracy}: a fraction in (0, 1], e.g. 0.6")
    if target_loss is not None and not target_loss > 0:
        raise ValueError(f"invalid target loss {target_loss}: must be > 0")


def target_text(target_accuracy: float | None, target_loss: float | None) -> str:
    """``held-out accuracy >= 0.6`` or ``held-out loss <= 1.2``."""
    if target_accuracy is not None:
        return f"held-out accuracy >= {target_accuracy:g}"
    return f"held-out loss <= {target_loss:g}"


def iterations_to_target(
    rows: Iterable[Mapping[str, Any]], *, target_accuracy: float | None = None, target_loss: float | None = None
) -> tuple[int | None, str | None]:
    """``(iteration, None)`` for the first evaluated iteration of ``rows`` (one run) meeting the
    target, or ``(None, reason)``."""
    check_target(target_accuracy, target_loss)
    evaluated = sorted((r for r in rows if r.get("accuracy") is not None or r.get("eval_loss") is not None),
                       key=lambda r: int(r["iteration"]))
    for row in evaluated:
        if target_accuracy is not None and row.get("accuracy") is not None and row["accuracy"] >= target_accuracy:
            return int(row["iteration"]), None
        if target_loss is not None and row.get("eval_loss") is not None and row["eval_loss"] <= target_loss:
            return int(row["iteration"]), None
    if not evaluated:
        return None, "never evaluated"
    last = evaluated[-1]
    if target_accuracy is not None:
        best = max(float(r["accuracy"]) for r in evaluated if r.get("accuracy") is not None)
        return None, (f"never reached accuracy {target_accuracy:g} in {int(last['iteration'])} iterations "
                      f"(best {best:.4f})")
    best = min(float(r["eval_loss"]) for r in evaluated if r.get("eval_loss") is not None)
    return None, f"never reached held-out loss {target_loss:g} in {int(last['iteration'])} iterations (best {best:.4f})"


def mean_spread(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and spread of ``values``: the sample standard deviation (n - 1 in the denominator);
    ``None`` for a single value (one seed measures no spread)."""
    n = len(values)
    if n < 2:
        return values[0], None
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def time_to_target(
    rows: Iterable[Mapping[str, Any]],
    iteration_s: Mapping[tuple[str, float | None], float | None],
    *,
    target_accuracy: float | None = None,
    target_loss: float | None = None,
    bands: Mapping[tuple[str, float | None], tuple[float, float]] | None = None,
) -> list[dict[str, Any]]:
    """The time-to-target table of a convergence run trained with one or more seeds.

    ``rows``: convergence rows (``compressor``, ``density``: ``None`` for a compressor that takes
    none, ``iteration``, ``eval_loss``, ``accuracy``, optionally ``seed``: rows of different seeds
    are separate runs of the same pair) of any number of (compressor, density) runs.
    ``iteration_s``: projected seconds per iteration per ``(compressor, density)``; ``bands``: its ``(low, high)`` error band (seconds)
    where the projection has one.

    Returns one row per pair, sorted by time (unreached last): ``compressor``, ``density``,
    ``seeds`` (how many), ``iterations_to_target`` (mean over the seeds) and
    ``iterations_spread`` (their sample standard deviation; ``None`` for one seed),
    ``iteration_s``, ``iteration_s_low`` / ``iteration_s_high`` (``None`` without a band),
    ``time_to_target_s`` (mean iterations × iteration_s) and its band ``time_to_target_s_low`` /
    ``time_to_target_s_high`` (mean iterations × the band's ends), ``time_spread_s`` (spread ×
    iteration_s) and ``reason`` (why a pair has no time: a seed never reached the target, or no
    projected time).
    """
    check_target(target_accuracy, target_loss)
    runs: dict[tuple[str, float | None], dict[int, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        density = None if row["density"] is None else float(row["density"])
        runs[(str(row["compressor"]), density)][int(row.get("seed") or 0)].append(row)
    table = []
    for (compressor, density), by_seed in runs.items():
        reached, reasons = [], []
        for seed in sorted(by_seed):
            iterations, why = iterations_to_target(by_seed[seed], target_accuracy=target_accuracy,
                                                   target_loss=target_loss)
            if iterations is None:
                reasons.append(why if len(by_seed) == 1 else f"seed {seed}: {why}")
            else:
                reached.append(iterations)
        mean, spread = mean_spread(reached) if reached and not reasons else (None, None)
        reason = "; ".join(reasons) or None
        seconds = iteration_s.get((compressor, density))
        if seconds is None and reason is None:
            reason = "no projected iteration time for this (compressor, density)"
        low, high = (bands or {}).get((compressor, density), (None, None))
        total = mean * seconds if mean is not None and seconds is not None else None
        table.append({"compressor": compressor, "density": density, "seeds": len(by_seed),
                      "iterations_to_target": mean, "iterations_spread": spread, "iteration_s": seconds,
                      "iteration_s_low": low, "iteration_s_high": high, "time_to_target_s": total,
                      "time_to_target_s_low": None if mean is None or low is None else mean * low,
                      "time_to_target_s_high": None if mean is None or high is None else mean * high,
                      "time_spread_s": None if total is None or spread is None else spread * seconds,
                      "reason": reason})
    return ranked(table)


def ranked(table: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Time-to-target rows (:func:`time_to_target`'s, of one table or several) fastest first,
    those without a time last; ties by ``label`` (where a row has one, e.g. ``diloco H=10``, else
    its compressor) and density."""
    return sorted((dict(r) for r in table), key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0,
                                                            str(r.get("label") or r["compressor"]), r["density"] or 0.0))
