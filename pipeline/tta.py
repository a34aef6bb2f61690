"""Time to accuracy on a cluster: a convergence run's iterations × projected iteration time.

The convergence run (``sidco converge``) says how many iterations each (compressor,
density) needs to reach the target; its trace gives the per-worker compute and its replay
the compression costs, from which the simulator projects one iteration on the chosen
cluster. Both the ``sidco tta`` command and the dashboard's Time-to-accuracy page call
:func:`time_to_accuracy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convergence.tta import time_to_target
from pipeline import project
from results.store import Store


def resolve(store: Store, convergence: int | str | None) -> dict[str, Any]:
    """The convergence row (an id, ``"latest"`` or ``None`` = latest) with its parsed config;
    ``ValueError`` naming the command that fills the gap when there is none."""
    import json

    ref = "latest" if convergence in (None, "latest") else convergence
    if ref != "latest":
        try:
            ref = int(ref)
        except (TypeError, ValueError):
            raise ValueError(f"invalid convergence {convergence!r}: an id or 'latest'") from None
    row = store.convergence(ref)
    if row is None:
        what = "no convergence run" if ref == "latest" else f"no convergence run #{ref}"
        raise ValueError(f"the results store has {what}; run: sidco converge --workload resnet20 --workers 4 "
                         "--iterations 300 --eval-every 50")
    result = dict(row)
    result["config"] = json.loads(row["config_json"])
    return result


def trace_path(store: Store, run: Mapping[str, Any]) -> str:
    """Path of the run's trace; ``ValueError`` when the run has none yet."""
    if run["trace_id"] is None:
        raise ValueError(f"convergence #{run['id']} has no trace yet (its first pair did not finish); "
                         "rerun the same sidco converge command")
    return store.trace(int(run["trace_id"]))["path"]


def iteration_times(
    store: Store,
    trace_id: int,
    pairs: Sequence[tuple[str, float]],
    cluster: project.Cluster,
    *,
    device: str = "cpu",
    calibration_choice: str | int = "none",
    precision: str = project.DEFAULT_PRECISION,
    bands: dict[tuple[str, float], tuple[float, float]] | None = None,
) -> tuple[dict[tuple[str, float], float], dict[tuple[str, float], str | None]]:
    """Projected seconds per iteration of each (compressor, density) of ``pairs`` on ``cluster``
    (:func:`pipeline.project.project`: compute from the trace, projected onto ``device`` in
    ``precision`` when it was captured on another, compression costs on ``device`` by the one
    cost policy), and where each pair's costs came from (``None`` for ``none``). ``bands``, when
    given, receives each pair's ``(iteration_s_low, iteration_s_high)``."""
    source = project.trace_source(store, trace_id=trace_id, device=device, precision=precision)
    times: dict[tuple[str, float], float] = {}
    sources: dict[tuple[str, float], str | None] = {}
    densities = list(dict.fromkeys(d for c, d in pairs if c != "none"))
    groups = [(["none"], None)] if any(c == "none" for c, _ in pairs) else []
    groups += [([c for c, d in pairs if c != "none" and d == density], density) for density in densities]
    for names, density in groups:
        for result in project.project(store, source, cluster, names, density, device=device,
                                      calibration_choice=calibration_choice):
            key = (result["compressor"], 1.0 if density is None else float(density))
            times[key] = float(result["iteration_s"])
            sources[key] = result["cost_source"]
            if bands is not None:
                bands[key] = (float(result["iteration_s_low"]), float(result["iteration_s_high"]))
    return times, sources


def time_to_accuracy(
    store: Store,
    convergence: int | str | None,
    *,
    target_accuracy: float | None = None,
    target_loss: float | None = None,
    cluster: project.Cluster,
    device: str = "cpu",
    calibration_choice: str | int = "none",
    precision: str = project.DEFAULT_PRECISION,
) -> dict[str, Any]:
    """The time-to-target table of a convergence run on a cluster.

    Returns the fields of :func:`convergence.tta.time_to_target` plus ``convergence_id``,
    ``trace_id``, ``workers_trained``, ``cluster`` (nodes, bandwidth_bps, latency_s,
    topology, fidelity), ``device``, ``target`` and ``cost_sources`` (per pair label, where its
    compression costs came from); and ``curves``: per (compressor,
    density) the evaluated points ``{iteration, time_s, accuracy, eval_loss}`` (time_s =
    iteration × projected iteration_s).
    """
    run = resolve(store, convergence)
    rows = [dict(r) for r in store.convergence_rows(run["id"])]
    if not rows:
        raise ValueError(f"convergence #{run['id']} has no finished (compressor, density) yet; "
                         "rerun its sidco converge command")
    pairs = list(dict.fromkeys((r["compressor"], float(r["density"])) for r in rows))
    trace_path(store, run)
    bands: dict[tuple[str, float], tuple[float, float]] = {}
    times, sources = iteration_times(store, int(run["trace_id"]), pairs, cluster, device=device,
                                     calibration_choice=calibration_choice, precision=precision, bands=bands)
    result = time_to_target(rows, times, target_accuracy=target_accuracy, target_loss=target_loss)
    for row in result["rows"]:
        low, high = bands[(row["compressor"], float(row["density"]))]
        reached = row["iterations_to_target"]
        row.update(iteration_s_low=low, iteration_s_high=high,
                   time_to_target_s_low=None if reached is None else reached * low,
                   time_to_target_s_high=None if reached is None else reached * high)
    runner = result["runner_up"]
    result["within_error"] = bool(runner is not None and result["winner"] is not None
                                  and result["winner"]["time_to_target_s_high"] >= runner["time_to_target_s_low"])
    curves: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["accuracy"] is None and r["eval_loss"] is None:
            continue
        key = (r["compressor"], float(r["density"]))
        curves.setdefault(label(*key), []).append({
            "compressor": key[0], "density": key[1], "iteration": r["iteration"],
            "time_s": r["iteration"] * times[key], "accuracy": r["accuracy"], "eval_loss": r["eval_loss"]})
    result.update({
        "convergence_id": run["id"], "trace_id": run["trace_id"], "workers_trained": run["config"]["workers"],
        "workload": run["config"]["workload"],
        "cluster": {"nodes": cluster.nodes, "bandwidth_bps": cluster.bandwidth_bps, "latency_s": cluster.latency_s,
                    "topology": cluster.topology, "fidelity": cluster.fidelity},
        "device": device, "target": {"accuracy": target_accuracy, "loss": target_loss},
        "cost_sources": {label(*key): value for key, value in sources.items() if value is not None}, "curves": curves,
    })
    return result


def label(compressor: str, density: float) -> str:
    """``none`` or ``topk@0.01``: how a (compressor, density) pair is named in tables and legends."""
    return compressor if compressor == "none" else f"{compressor}@{density:g}"


SWEEP_COLUMNS = ("nodes", "bandwidth_bps", "latency_s", "topology", "compressor", "density", "iteration_s")


def sweep_time_to_target(
    store: Store,
    sweep_id: int,
    convergence: int | str | None,
    *,
    target_accuracy: float | None = None,
    target_loss: float | None = None,
) -> dict[str, Any]:
    """Time to target of every scenario of a sweep, with the iterations of a convergence run.

    Returns ``{"convergence_id", "target", "rows": [{nodes, bandwidth_bps,
    latency_s, topology, compressor, density, iteration_s, iterations_to_target,
    time_to_target_s, reason}], "winners": [{nodes, bandwidth_bps, latency_s, topology,
    compressor, density, time_to_target_s, margin_ratio}]}`` (each row also carries the error
    band its sweep stored: ``iteration_s_low``/``high``, ``time_to_target_s_low``/``high``); a scenario whose (compressor,
    density) the run did not train, or that never reached the target, gets ``None`` and a reason.
    """
    from convergence.tta import iterations_to_target

    run = resolve(store, convergence)
    per_pair: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in store.convergence_rows(run["id"]):
        per_pair.setdefault((r["compressor"], float(r["density"])), []).append(dict(r))
    reached = {pair: iterations_to_target(items, target_accuracy=target_accuracy, target_loss=target_loss)
               for pair, items in per_pair.items()}
    rows = []
    for s in store.scenarios(int(sweep_id)):
        pair = (s["compressor"], 1.0 if s["compressor"] == "none" else float(s["density"]))
        iterations, reason = reached.get(pair, (None, f"convergence #{run['id']} did not train this "
                                                      "(compressor, density)"))
        low = s["iteration_s"] if s["iteration_s_low"] is None else s["iteration_s_low"]  # swept before bands
        high = s["iteration_s"] if s["iteration_s_high"] is None else s["iteration_s_high"]
        rows.append({**{k: s[k] for k in SWEEP_COLUMNS}, "iterations_to_target": iterations,
                     "time_to_target_s": None if iterations is None else iterations * s["iteration_s"],
                     "iteration_s_low": low, "iteration_s_high": high,
                     "time_to_target_s_low": None if iterations is None else iterations * low,
                     "time_to_target_s_high": None if iterations is None else iterations * high,
                     "reason": reason})
    clusters: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row["time_to_target_s"] is not None:
            clusters.setdefault((row["nodes"], row["bandwidth_bps"], row["latency_s"], row["topology"]), []).append(row)
    winners = []
    for (nodes, bandwidth, latency, topology), items in sorted(clusters.items()):
        items.sort(key=lambda r: r["time_to_target_s"])
        best = items[0]
        margin = (items[1]["time_to_target_s"] / best["time_to_target_s"]
                  if len(items) > 1 and best["time_to_target_s"] > 0 else None)
        winners.append({"nodes": nodes, "bandwidth_bps": bandwidth, "latency_s": latency, "topology": topology,
                        "compressor": best["compressor"], "density": best["density"],
                        "time_to_target_s": best["time_to_target_s"], "margin_ratio": margin})
    return {"convergence_id": run["id"], "target": {"accuracy": target_accuracy, "loss": target_loss},
            "rows": rows, "winners": winners}
