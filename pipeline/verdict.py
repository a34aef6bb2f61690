"""The verdict on a set of projected rows: which configuration wins, by how much, or that
the projection cannot tell.

One home for the rule that ``sidco compare`` prints and the dashboard's What-if page shows:

- the rows are ranked by projected iteration time (``iteration_s``, seconds);
- the *dense baselines* are the compressors that do not sparsify (:data:`BASELINES`: no
  compression, the fp16/bf16 casts, PowerSGD): a sparsifier is worth its trouble only when it
  beats the best of them;
- the winner is called only when it is clearly ahead of the runner-up: when the rows carry an
  error band (``iteration_s_low`` / ``iteration_s_high``, seconds) the winner's band must lie
  wholly below the runner-up's; without a band the runner-up must be at least
  :data:`TIE_MARGIN` (5 %) slower. Otherwise the verdict is "too close to call", naming every
  row that cannot be told apart from the fastest.

Margins are ratios of iteration times (runner-up ÷ winner: 1.25 means the winner's iterations
are 1.25× as fast, i.e. 25 % shorter time-per-iteration of the runner-up over the winner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compressors.work import REGISTRY
from units import Pair

BASELINES: tuple[str, ...] = tuple(c.name for c in REGISTRY if c.baseline)
"""Compressors that send every coordinate (no compression, the dense casts) or a low-rank
approximation (PowerSGD): the plain alternatives a sparsifier must beat (the cards marked
``baseline``)."""

TIE_MARGIN = 0.05
"""Without an error band, a winner less than this fraction faster than the runner-up is not called."""


def iteration_band(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """A row's error band on ``iteration_s`` (``iteration_s_low``, ``iteration_s_high``, seconds),
    or ``None`` when the projection gave none."""
    low, high = row.get("iteration_s_low"), row.get("iteration_s_high")
    if low is None or high is None:
        return None
    return float(low), float(high)


def has_band(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every row carries an error band (``iteration_s_low`` and ``iteration_s_high``)."""
    return bool(rows) and all(iteration_band(r) is not None for r in rows)


def _indistinguishable(winner: Mapping[str, Any], other: Mapping[str, Any], banded: bool) -> bool:
    """Whether ``other`` cannot be told apart from ``winner`` (the fastest row)."""
    if banded:
        return iteration_band(other)[0] <= iteration_band(winner)[1]  # the bands overlap
    return float(other["iteration_s"]) < float(winner["iteration_s"]) * (1.0 + TIE_MARGIN)


def rank(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` fastest first, each with ``label``, ``rank`` (1 = fastest) and
    ``speedup_over_baseline`` (the best dense baseline's iteration time ÷ this row's;
    ``None`` when no baseline row is present) added; ``speedup`` (over ``none``) is kept."""
    ordered = sorted(rows, key=lambda r: (float(r["iteration_s"]), Pair(r["compressor"], r.get("density")).label))
    baselines = [r for r in ordered if r["compressor"] in BASELINES]
    best = float(baselines[0]["iteration_s"]) if baselines else None
    return [{**row, "label": Pair(row["compressor"], row.get("density")).label, "rank": i + 1,
             "speedup_over_baseline": None if best is None else best / float(row["iteration_s"])}
            for i, row in enumerate(ordered)]


def verdict(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The verdict on ``rows`` (projections of one scenario, one per configuration: keys
    ``compressor``, ``density`` (``None`` for compressors whose message ignores it), ``iteration_s`` and, when the
    projection has one, ``iteration_s_low``/``iteration_s_high``).

    Returns ``call`` (``"winner"`` or ``"too close to call"``), ``winner`` (label of the fastest
    row), ``runner_up`` (label or ``None``), ``margin_over_runner_up`` (runner-up's iteration
    time ÷ the winner's), ``best_baseline`` (label of the fastest dense baseline or ``None``),
    ``margin_over_baseline`` (its iteration time ÷ the winner's), ``tied`` (labels that cannot be
    told apart from the fastest, the fastest included), ``basis`` (``"error band"`` or
    ``"5 % margin"``) and ``text`` (the one line to print).
    """
    if not rows:
        raise ValueError("no projected rows to judge")
    ranked = rank(rows)
    banded = has_band(ranked)
    winner = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    baselines = [r for r in ranked if r["compressor"] in BASELINES]
    baseline = baselines[0] if baselines else None
    tied = [r["label"] for r in ranked[1:] if _indistinguishable(winner, r, banded)]
    call = "too close to call" if tied else "winner"
    margin_runner = None if runner is None else float(runner["iteration_s"]) / float(winner["iteration_s"])
    margin_base = None if baseline is None else float(baseline["iteration_s"]) / float(winner["iteration_s"])
    basis = "error band" if banded else f"{TIE_MARGIN:.0%} margin"
    result = {
        "call": call,
        "winner": winner["label"],
        "compressor": winner["compressor"],
        "density": winner.get("density"),
        "iteration_s": float(winner["iteration_s"]),
        "runner_up": None if runner is None else runner["label"],
        "margin_over_runner_up": margin_runner,
        "best_baseline": None if baseline is None else baseline["label"],
        "margin_over_baseline": margin_base,
        "tied": [winner["label"], *tied],
        "basis": basis,
    }
    result["text"] = _text(result, banded)
    return result


def names_text(labels: Sequence[str], most: int = 5) -> str:
    """``labels`` joined by commas, the first ``most`` of them and how many more."""
    shown = ", ".join(labels[:most])
    return shown if len(labels) <= most else f"{shown} and {len(labels) - most} more"


def _text(v: Mapping[str, Any], banded: bool) -> str:
    why = ("their error bands overlap" if banded
           else f"within {TIE_MARGIN:.0%} of the fastest; the projection has no error band")
    if v["call"] == "too close to call":
        names = names_text(v["tied"])
        base = ("" if v["best_baseline"] is None or v["best_baseline"] in v["tied"]
                else f"; the fastest is {v['margin_over_baseline']:.2f}x over the best dense baseline {v['best_baseline']}")
        return f"too close to call: {names} ({why}){base}"
    text = f"{v['winner']} wins"
    if v["runner_up"] is not None:
        text += f", {v['margin_over_runner_up']:.2f}x over the runner-up {v['runner_up']}"
    if v["best_baseline"] is not None and v["best_baseline"] != v["winner"]:
        text += f" and {v['margin_over_baseline']:.2f}x over the best dense baseline {v['best_baseline']}"
    elif v["best_baseline"] == v["winner"]:
        text += " (a dense baseline: no sparsifier pays here)"
    return text + ("" if banded else f" (called on a margin of at least {TIE_MARGIN:.0%}: the projection has no error band)")


def settle_text(found: Mapping[str, Any]) -> str:
    """The sentence that names what to measure (:func:`pipeline.settle.settle`'s result): the
    input that flips the winner and the runner-up and where, or the one that comes closest, and
    the command that measures it."""
    value = found["flips_at"]
    if found["input"] == "link efficiency":
        where = "" if value is None else f" at an efficiency of {value:.3g}"
    else:
        where = "" if value is None else f" at {value:.3g}x the modelled {found['name'].removeprefix('the ')}"
    if found.get("flips_at_samples_per_s"):
        where += f" (a single-GPU throughput of {found['flips_at_samples_per_s']:.4g} samples/s; projected " \
                 f"{found['projected_samples_per_s']:.4g})"
    low, high = found["band"]
    if found["flips"]:
        text = (f"{found['name']} decides it: {found['runner_up']} overtakes {found['winner']}{where}, inside its "
                f"band x{low:.2f}-{high:.2f}")
    else:
        text = (f"closest to flipping it: {found['name']}: at its x{found['end']:.2f} end {found['winner']} still leads "
                f"{found['runner_up']} by {found['ratio_at_end']:.2f}x")
    return f"{text}; measure it: {found['command']}"


def with_settle(result: Mapping[str, Any], found: Mapping[str, Any] | None) -> dict[str, Any]:
    """The verdict ``result`` with ``settle`` (what would settle it, or ``None``) and its sentence
    (:func:`settle_text`) after the verdict's ``text``."""
    out = {**result, "settle": None if found is None else dict(found)}
    if found is not None:
        out["text"] = f"{result['text']}. {'To settle it' if result['call'] != 'winner' else 'What could change it'}: " \
                      f"{settle_text(found)}"
    return out
