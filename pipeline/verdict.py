"""The verdict: whether to compress on this cluster, and with what, or that the projection cannot tell.

One function, :func:`judge`, is what ``sidco compare``, ``sidco sweep``, ``sidco simulate`` and
the dashboard's What-if page print. It runs four steps in one body:

1. **speed**: the rows are ranked by projected iteration time (``iteration_s``, seconds);
2. **quality gate**: only configurations the quality rule calls (:func:`pipeline.quality.called`)
   may win; faster ones it does not call are listed apart, and a dense baseline that sends little
   of the gradient (PowerSGD at a low rank) is flagged (:func:`pipeline.quality.sends_little`);
3. **time to accuracy**: where the store holds a convergence run of the trace, the rows are judged
   by time to target instead, by the rule of ``sidco tta`` (:func:`pipeline.tta.verdict`: the
   margin must exceed the seeds' spread and the projection's error band);
4. **what would settle it**: the unmeasured input whose band decides the order of the two
   contenders (:func:`pipeline.settle.settle`).

The *call* (``"winner"`` or ``"too close to call"``) is made among the rows the gate lets
through: the winner is called only when it is clearly ahead of the runner-up, its error band
(``iteration_s_low``/``iteration_s_high``) wholly below the runner-up's *and* the runner-up at
least :data:`TIE_MARGIN` (5 %) slower (no model of a cluster one has not measured is closer than
that; without bands the margin alone decides). The *decision* comes first in the text:
``compress`` when every configuration that cannot be told apart from the fastest compresses,
``don't compress`` when one of them sends every coordinate (``none``, fp16, bf16: the
*uncompressed* baselines, :func:`pipeline.quality.sends_everything`). Ratios are iteration times
(runner-up ÷ winner: 1.25 means the winner's iterations take 1/1.25 of the runner-up's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compressors.work import REGISTRY
from pipeline import quality
from results.store import Store
from units import Pair

if TYPE_CHECKING:
    from pipeline.project import Projection

BASELINES: tuple[str, ...] = tuple(c.name for c in REGISTRY if c.baseline)
"""Compressors that send every coordinate (no compression, the dense casts) or a low-rank
approximation (PowerSGD): the plain alternatives a sparsifier must beat (the cards marked
``baseline``)."""

TIE_MARGIN = 0.05
"""A winner less than this fraction faster than the runner-up is not called, whatever its band."""

DECISIONS: tuple[str, ...] = ("compress", "don't compress")
"""The verdict's first words."""


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


def names_text(labels: Sequence[str], most: int = 5) -> str:
    """``labels`` joined by commas and a last "and", the first ``most`` of them and how many more."""
    shown = list(labels[:most]) + ([f"{len(labels) - most} more"] if len(labels) > most else [])
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


NONE_FITS = "no configuration fits in one GPU's memory"
"""What a verdict says before its call when every configuration needs more than one GPU's memory."""


def memory_gate(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The memory gate of every verdict (``compare``, ``simulate``, ``sweep``, ``tta``): the rows it may
    call and those it never calls, each in ``rows``' order. A row whose ``fits`` is false needs more
    than one GPU's memory (:func:`pipeline.memory.memory_of`) and is never called; ``fits`` ``None``
    (unknown) does not stop a row. When no row fits, every row may be called and the verdict says so
    (:data:`NONE_FITS`)."""
    unfit = [r for r in rows if r.get("fits") is False]
    return [r for r in rows if r.get("fits") is not False] or list(rows), unfit


def fit_note(labels: Sequence[str]) -> str:
    """The verdict's note on the configurations (``labels``) that do not fit in one GPU's memory."""
    return f"does not fit in one GPU's memory: {names_text(labels)}"


def _speed(ranked: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The call among ``ranked`` rows (fastest first) by iteration time: the winner, the runner-up,
    the margin (runner-up ÷ winner) and every row that cannot be told apart from the fastest."""
    banded = has_band(ranked)
    winner = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None

    def close(other: Mapping[str, Any]) -> bool:
        if float(other["iteration_s"]) < float(winner["iteration_s"]) * (1.0 + TIE_MARGIN):
            return True
        return banded and iteration_band(other)[0] <= iteration_band(winner)[1]  # the bands overlap

    tied = [r["label"] for r in ranked[1:] if close(r)]
    return {"call": "too close to call" if tied else "winner", "winner": winner["label"],
            "compressor": winner["compressor"], "density": winner.get("density"),
            "iteration_s": float(winner["iteration_s"]),
            "runner_up": None if runner is None else runner["label"],
            "margin_over_runner_up": None if runner is None else float(runner["iteration_s"]) / float(winner["iteration_s"]),
            "tied": [winner["label"], *tied],
            "basis": "error band" if banded else f"{TIE_MARGIN:.0%} margin"}


def _by_time_to_accuracy(ranked: Sequence[Mapping[str, Any]], tta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The call by time to target among the ``ranked`` rows (those the memory gate lets through;
    :func:`pipeline.tta.verdict` over their part of ``tta``'s table: the seeds' spread and the error
    band count), or ``None`` when none of them has a time."""
    from pipeline.tta import verdict as tta_verdict

    compared = {r["label"] for r in ranked}
    labelled = ((Pair(t["compressor"], t["density"]).label, t) for t in tta["table"])
    timed = {label: t for label, t in labelled if t["time_to_target_s"] is not None and label in compared}
    if not timed:
        return None
    called = tta_verdict(list(timed.values()))
    leader, runner = (None if r is None else Pair(r["compressor"], r["density"]).label
                      for r in (called["leader"], called["runner_up"]))
    winner = next(r for r in ranked if r["label"] == leader)
    return {"call": "winner" if called["winner"] is not None else "too close to call", "winner": leader,
            "compressor": winner["compressor"], "density": winner.get("density"),
            "iteration_s": float(winner["iteration_s"]), "time_to_target_s": timed[leader]["time_to_target_s"],
            "runner_up": runner, "margin_over_runner_up": called["margin_ratio"],
            "tied": [leader] if called["winner"] is not None else [leader, runner],
            "basis": "seed spread and error band", "reason": called["reason"], "caveat": called["caveat"],
            "time_to_accuracy": dict(tta), "untimed": [r["label"] for r in ranked if r["label"] not in timed]}


def judge(rows: Sequence[Mapping[str, Any]], store: Store | None = None,
          projected: Projection | None = None) -> dict[str, Any]:
    """The verdict on ``rows`` (projections of one scenario, one per configuration: keys
    ``compressor``, ``density`` (``None`` for compressors that take none), ``iteration_s``, the
    band when the projection has one, and the quality columns, :func:`pipeline.quality.attach`;
    rows without them are judged on speed alone, said so). With ``store`` and ``projected`` (the
    projection the rows came from) it also judges by time to accuracy where the store holds a
    convergence run of the trace, and names what would settle it.

    Returns ``decision`` (:data:`DECISIONS`), ``call`` (``"winner"`` or ``"too close to call"``),
    ``winner`` (label), ``compressor``, ``density``, ``iteration_s``, ``runner_up``,
    ``margin_over_runner_up``, ``tied`` (labels that cannot be told apart from the winner, it
    first), ``basis``, ``best_baseline`` / ``margin_over_baseline`` (the fastest dense baseline,
    :data:`BASELINES`, and its iteration time ÷ the winner's; ``None`` without one),
    ``best_uncompressed`` / ``margin_over_uncompressed`` (the fastest row that sends every coordinate
    and its time, iteration or to target, ÷ the winner's: the decision's ratio), ``quality_rule``,
    ``fails_quality``, ``faster_but_less``, ``unmeasured``, ``does_not_fit`` (rows whose ``fits`` is
    false: never called), ``sends_little`` (called baselines that
    send little of the gradient), ``basis_quantity`` (``"iteration time"`` or ``"time to
    accuracy"``), ``settle`` (:func:`pipeline.settle.settle`'s finding or ``None``), ``headline``
    (the decision in one sentence) and ``text``: the headline first, then the details.
    """
    from pipeline import settle, tta  # both build on this module's ranking

    if not rows:
        raise ValueError("no projected rows to judge")

    # 1. speed: every row, fastest first
    ranked = rank(rows)

    # 2. memory gate: a configuration that does not fit in one GPU's memory is never called (all of them
    #    failing it, the verdict is by speed alone and says so)
    fitting, unfitting = memory_gate(ranked)
    unfit = [r["label"] for r in unfitting]

    # 3. quality gate: the rule calls a row, fails it, or cannot tell (unmeasured: judged on speed alone)
    calls = {r["label"]: quality.called(r) for r in ranked}
    failing = [r for r in fitting if calls[r["label"]] is False]
    eligible = [r for r in fitting if calls[r["label"]] is not False] or fitting
    result = _speed(eligible)
    by_speed_alone = _speed(ranked)["tied"]
    faster = [r for r in failing if float(r["iteration_s"]) < result["iteration_s"] or r["label"] in by_speed_alone]
    result.update({"quality_rule": quality.CALL_RULE, "fails_quality": [r["label"] for r in failing],
                   "faster_but_less": [r["label"] for r in faster],
                   "unmeasured": [r["label"] for r in fitting if calls[r["label"]] is None],
                   "does_not_fit": unfit, "basis_quantity": "iteration time"})

    # 4. time to accuracy: where a convergence run of the trace is stored, it judges instead (what each sends
    #    is then weighed by the measured convergence)
    if store is not None and projected is not None and projected.source.kind == "trace":
        table = tta.for_rows(store, projected.source.trace_id, ranked)
        by_time = None if table is None else _by_time_to_accuracy(fitting, table)
        if by_time is not None:
            result.update(by_time, fails_quality=[], faster_but_less=[], unmeasured=[],
                          basis_quantity="time to accuracy")

    # the decision: compress only when nothing that sends every coordinate is among the fastest
    quantity = "time_to_target_s" if result["basis_quantity"] == "time to accuracy" else "iteration_s"
    times = {r["label"]: (float(r["iteration_s"]) if quantity == "iteration_s" else
                          _time_to_target(result, r["label"])) for r in ranked}
    whole = [r for r in fitting if quality.sends_everything(r["compressor"]) and times[r["label"]] is not None]
    best = min(whole, key=lambda r: times[r["label"]], default=None)
    kept = {r["label"]: r for r in ranked}
    compressing = not any(quality.sends_everything(kept[label]["compressor"]) for label in result["tied"])
    dense = min((r for r in fitting if r["compressor"] in BASELINES and times[r["label"]] is not None),
                key=lambda r: times[r["label"]], default=None)
    result.update({"decision": DECISIONS[0] if compressing else DECISIONS[1],
                   "best_baseline": None if dense is None else dense["label"],
                   "margin_over_baseline": None if dense is None else times[dense["label"]] / times[result["winner"]],
                   "best_uncompressed": None if best is None else best["label"],
                   "margin_over_uncompressed": None if best is None else
                   times[best["label"]] / times[result["winner"]],
                   "sends_little": [r["label"] for r in eligible if r["label"] in result["tied"]
                                    and quality.sends_little(r)]})

    # 5. what would settle it: the input that decides the two contenders (uncompressed baselines count as one:
    #    which of fp16 and bf16 is faster never decides whether to compress)
    result["settle"] = None
    if store is not None and projected is not None and result["basis_quantity"] == "iteration time":
        uncompressed = next((r for r in eligible if quality.sends_everything(r["compressor"])), None)
        contenders = [r for r in eligible if r is uncompressed or not quality.sends_everything(r["compressor"])]
        result["settle"] = settle.settle(store, projected, contenders) if len(contenders) > 1 else None

    result["headline"] = _decision(result, times)
    result["text"] = _text(result, kept)
    return result


def _time_to_target(result: Mapping[str, Any], label: str) -> float | None:
    """The time to target (seconds) of row ``label`` in the verdict's time-to-accuracy table, or ``None``."""
    for t in result["time_to_accuracy"]["table"]:
        if Pair(t["compressor"], t["density"]).label == label:
            return t["time_to_target_s"]
    return None


def _decision(v: Mapping[str, Any], times: Mapping[str, float | None]) -> str:
    """The verdict's first sentence: whether to compress and with what."""
    base = v["best_uncompressed"]
    if v["decision"] == DECISIONS[1]:
        beyond = "the seed spread and the error band" if v["basis_quantity"] == "time to accuracy" else (
            "the error band" if v["basis"] == "error band" else f"the {TIE_MARGIN:.0%} margin")
        return f"don't compress: nothing beats {base} beyond {beyond}"
    over = ""
    if base is not None:
        ratios = sorted(times[base] / times[label] for label in v["tied"] if times.get(label))
        span = f"{ratios[0]:.1f}x" if f"{ratios[0]:.1f}" == f"{ratios[-1]:.1f}" else f"{ratios[0]:.1f}-{ratios[-1]:.1f}x"
        over = f" ({'about ' if len(ratios) == 1 else ''}{span} over sending the whole gradient, {base})"
    else:
        over = " (no uncompressed baseline compared)"
    if v["call"] == "winner":
        return f"compress with {v['winner']}{over}"
    return f"compress: {names_text(v['tied'])} are too close to call{over}"


def _why_close(v: Mapping[str, Any]) -> str:
    """Why the fastest rows cannot be told apart by iteration time."""
    if v["basis"] == "error band":
        return f"their error bands overlap or they are within {TIE_MARGIN:.0%} of the fastest"
    return f"within {TIE_MARGIN:.0%} of the fastest; the projection has no error band"


def _call_text(v: Mapping[str, Any]) -> str:
    """The call in words: the winner and its margin, or who cannot be told apart and why."""
    if v["basis_quantity"] == "time to accuracy":
        tta = v["time_to_accuracy"]
        how = (f"by time to accuracy (held-out accuracy >= {tta['target_accuracy']:.3g}, convergence "
               f"#{tta['convergence_id']}; iterations to target x iteration time, not iteration time alone): ")
        if v["call"] != "winner":
            text = how + f"{v['winner']} leads {v['runner_up']}, {v['reason']}"
        else:
            text = how + f"{v['winner']} reaches it first" + (
                "" if v["runner_up"] is None else f", {v['margin_over_runner_up']:.2f}x ahead of {v['runner_up']}")
            text += "" if not v["caveat"] else f" ({v['caveat']})"
        return text + ("" if not v["untimed"] else f"; no time to accuracy for {names_text(v['untimed'])}")
    if v["call"] == "too close to call":
        why = _why_close(v)
        if v["decision"] == DECISIONS[0]:  # the headline named them
            return why
        return f"too close to call: {names_text(v['tied'])} ({why})"
    text = f"{v['winner']} wins"
    if v["runner_up"] is not None:
        text += f", {v['margin_over_runner_up']:.2f}x over the runner-up {v['runner_up']}"
    if v["basis"] != "error band":
        text += f" (called on a margin of at least {TIE_MARGIN:.0%}: the projection has no error band)"
    return text


def _text(v: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]) -> str:
    """The decision, then the call, the quality notes and what would settle it."""
    parts = [_call_text(v)]
    if v["fails_quality"] and not set(v["tied"]) - set(v["fails_quality"]):
        parts[0] = f"no configuration passes the quality rule; by speed alone: {parts[0]}"
    if v["does_not_fit"]:
        if set(v["tied"]) <= set(v["does_not_fit"]):
            parts[0] = f"{NONE_FITS}; by speed alone: {parts[0]}"
        parts.append(fit_note(v["does_not_fit"]))
    if v["sends_little"]:
        parts.append(f"caution: {quality.little_text([rows[label] for label in v['sends_little']])}")
    if v["faster_but_less"]:
        parts.append("faster but sends much less of the gradient: "
                     f"{names_text([quality.why(rows[label]) for label in v['faster_but_less']], 3)}")
    if v["unmeasured"]:
        parts.append(f"quality unmeasured (judged on speed alone): {names_text(v['unmeasured'])}")
    text = "; ".join([v["headline"], *parts])
    if v["settle"] is not None:
        text += f". {'What could change it' if v['call'] == 'winner' else 'To settle it'}: {settle_text(v['settle'])}"
    return text


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
