"""The loss penalty of a low-communication run against synchronous training at equal tokens.

Two stored curves of the same model, data and inner optimizer: a run (e.g. DiLoCo, H > 1 and an
outer compressor) and the synchronous baseline (every step exchanged, uncompressed). At every
number of training tokens both evaluated (tokens = iterations × tokens per iteration; for
images, samples), the penalty is the run's held-out loss minus the baseline's (nats; positive:
the run is behind). Seeds are paired (seed s of the run against seed s of the baseline: the
same initial model and data order), so the spread is the sample standard deviation of the
paired differences (:func:`convergence.tta.mean_spread`; ``None`` for one seed). Arithmetic on
stored rows: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convergence.tta import mean_spread
from units import check_count


def _evaluated(rows: Sequence[Mapping[str, Any]], tokens_per_iteration: int) -> dict[int, float]:
    """Held-out loss by tokens trained, of one seed's rows (evaluated rows only)."""
    return {int(r["iteration"]) * tokens_per_iteration: float(r["eval_loss"])
            for r in rows if r.get("eval_loss") is not None}


def loss_penalty(
    run: Mapping[int, Sequence[Mapping[str, Any]]],
    baseline: Mapping[int, Sequence[Mapping[str, Any]]],
    run_tokens: int,
    baseline_tokens: int,
) -> dict[str, Any]:
    """The penalty of ``run`` against ``baseline`` at equal tokens, with the seeds' spread.

    ``run`` / ``baseline``: per seed, the convergence rows of one (compressor, density) curve
    (``iteration``, ``eval_loss`` in nats, ``None`` where not evaluated). ``run_tokens`` /
    ``baseline_tokens``: tokens (or samples) each run trains per iteration, over all its workers.

    Returns ``seeds`` (the seeds both have, paired), ``points`` (one per token count that every
    paired seed of both evaluated, in order: ``tokens``, ``eval_loss`` and ``baseline_eval_loss``
    (means over the seeds), ``penalty`` (mean paired difference, nats), ``spread`` (its sample
    standard deviation; ``None`` for one seed), ``penalty_fraction`` (penalty ÷ the baseline's
    mean loss)) and ``final``: the last point (most tokens). ``ValueError`` when the two share no
    seed or no evaluated token count.
    """
    check_count(run_tokens, "run tokens per iteration")
    check_count(baseline_tokens, "baseline tokens per iteration")
    seeds = sorted(set(run) & set(baseline))
    if not seeds:
        raise ValueError(f"no seed in common (run: {sorted(run)}, baseline: {sorted(baseline)}); "
                         "train the baseline with the run's seeds")
    curves = [(_evaluated(run[s], run_tokens), _evaluated(baseline[s], baseline_tokens)) for s in seeds]
    shared = set.intersection(*(set(mine) & set(theirs) for mine, theirs in curves))
    if not shared:
        raise ValueError("the run and the baseline were never evaluated at the same number of tokens; "
                         "evaluate both at a common multiple (--eval-every)")
    points = []
    for tokens in sorted(shared):
        mine = [m[tokens] for m, _ in curves]
        theirs = [t[tokens] for _, t in curves]
        penalty, spread = mean_spread([a - b for a, b in zip(mine, theirs)])
        base = sum(theirs) / len(theirs)
        points.append({"tokens": tokens, "eval_loss": sum(mine) / len(mine), "baseline_eval_loss": base,
                       "penalty": penalty, "spread": spread, "penalty_fraction": penalty / base if base > 0 else None})
    return {"seeds": seeds, "points": points, "final": points[-1]}
