"""Time to target: iterations a run needs to reach a target × the projected time of one iteration.

A run reaches the target at the first *evaluated* iteration whose held-out accuracy is at
least ``target_accuracy`` (or whose held-out loss is at most ``target_loss``); the
resolution is therefore the run's evaluation interval. ``time_to_target_s =
iterations_to_target × iteration_s``. A run that never reaches the target, or that has no
projected iteration time, gets ``None`` and a ``reason``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
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


def time_to_target(
    rows: Iterable[Mapping[str, Any]],
    iteration_s: Mapping[tuple[str, float], float | None],
    *,
    target_accuracy: float | None = None,
    target_loss: float | None = None,
) -> dict[str, Any]:
    """The time-to-target table of a convergence run.

    ``rows``: convergence rows (``compressor``, ``density``, ``iteration``, ``eval_loss``,
    ``accuracy``) of any number of (compressor, density) runs. ``iteration_s``: projected
    seconds per iteration per ``(compressor, density)``.

    Returns ``{"rows": [{compressor, density, iterations_to_target, iteration_s,
    time_to_target_s, reason}], "winner": row or None, "runner_up": row or None,
    "margin_s": seconds or None, "margin_ratio": runner-up time / winner time or None,
    "reason": why there is no winner or None}``, rows sorted by time (unreached last).
    """
    check_target(target_accuracy, target_loss)
    runs: dict[tuple[str, float], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        runs[(str(row["compressor"]), float(row["density"]))].append(row)
    table = []
    for (compressor, density), items in runs.items():
        iterations, reason = iterations_to_target(items, target_accuracy=target_accuracy, target_loss=target_loss)
        seconds = iteration_s.get((compressor, density))
        if seconds is None and reason is None:
            reason = "no projected iteration time for this (compressor, density)"
        total = iterations * seconds if iterations is not None and seconds is not None else None
        table.append({"compressor": compressor, "density": density, "iterations_to_target": iterations,
                      "iteration_s": seconds, "time_to_target_s": total, "reason": reason})
    table.sort(key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0, r["compressor"], r["density"]))
    reached = [r for r in table if r["time_to_target_s"] is not None]
    winner = reached[0] if reached else None
    runner_up = reached[1] if len(reached) > 1 else None
    result: dict[str, Any] = {"rows": table, "winner": winner, "runner_up": runner_up, "margin_s": None,
                              "margin_ratio": None, "reason": None}
    if winner is None:
        result["reason"] = f"no run reached {target_text(target_accuracy, target_loss)}" if table else "no runs"
    elif runner_up is not None:
        result["margin_s"] = runner_up["time_to_target_s"] - winner["time_to_target_s"]
        result["margin_ratio"] = (runner_up["time_to_target_s"] / winner["time_to_target_s"]
                                  if winner["time_to_target_s"] > 0 else None)
    else:
        result["reason"] = "only one run reached the target: no margin"
    return result
