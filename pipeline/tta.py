"""Time to accuracy on a cluster: a convergence run's iterations × projected iteration time.

The convergence run (``sidco converge``) says how many iterations each (compressor,
density) needs to reach the target; its trace gives the per-worker compute and its replay
the compression costs, from which the simulator projects one iteration on the chosen
cluster, as ``sidco simulate --trace … --device`` projects it. The runs of every seed of the
configuration (``sidco converge --seeds N``) give the mean and spread of the iterations;
:func:`verdict` says whether the leader's margin is worth naming. The DiLoCo runs of the same
base configuration (``sidco converge --sync-every H``, :func:`pipeline.penalty.family`) are
ranked with the per-step pairs: their inner steps to the target × the time per inner step that
``sidco compare`` projects for a DiLoCo strategy on the cluster's sites (:mod:`simulator.lowcomm`,
compute from the synchronous run's trace: a DiLoCo run records none). Both the ``sidco tta``
command and the dashboard's Time-to-accuracy page call :func:`projection_of` and
:func:`time_to_accuracy`; :func:`curves_time_to_accuracy` does the same for curves measured
elsewhere (``--curves``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from convergence.curves import load as load_curves  # a curves file the doors read
from convergence.tta import check_target, mean_spread, ranked, target_text, time_to_target  # check_target: the doors check a target by it
from pipeline import lowcomm, project
from pipeline.penalty import VARIANT, baseline_command, family, loss_penalties, synchronous_run
from pipeline.request import Cluster, Request, pair, paired_rows, sites_of
from pipeline.sweep import scenario_rows
from pipeline.memory import STRATEGY_UNMODELLED, memory_of, memory_setting, unmodelled
from pipeline.verdict import NONE_FITS, fit_note, iteration_band, memory_gate
from simulator.lowcomm import Strategy
from results.store import Store, row_id
from units import Pair, format_seconds


def convergence_run(store: Store, convergence: int | str | None) -> dict[str, Any]:
    """The convergence row (an id, ``"latest"`` or ``None`` = latest) with its parsed config;
    ``ValueError`` naming the command that fills the gap when there is none."""
    import json

    ref = "latest" if convergence in (None, "latest") else convergence
    if ref != "latest":
        try:
            ref = row_id(ref, "convergence run")
        except ValueError:
            raise ValueError(f"invalid convergence {convergence!r}: an id or 'latest'") from None
    row = store.convergence(ref)
    if row is None:
        what = "no convergence run" if ref == "latest" else f"no convergence run #{ref}"
        raise ValueError(f"the results store has {what}; run: sidco converge --workload resnet20 --workers 4 "
                         "--iterations 300 --eval-every 50")
    result = dict(row)
    result["config"] = json.loads(row["config_json"])
    return result


def per_step_run(run: Mapping[str, Any]) -> Mapping[str, Any]:
    """``run`` (a :func:`convergence_run` row), or ``ValueError`` (one line) when it is a DiLoCo run
    (its configuration has ``sync_every``): a sweep projects per-step pairs only."""
    if "sync_every" in run.get("config", {}):
        raise ValueError(f"convergence #{run['id']} is a DiLoCo run (sync every {run['config']['sync_every']} steps): "
                         f"a sweep projects per-step compressors only; rank it with sidco tta --convergence "
                         f"{run['id']} --sites 2 --wan-bandwidth B --wan-rtt T")
    return run


def trace_path(store: Store, run: Mapping[str, Any]) -> str:
    """Path of the run's trace, or of the trace another seed of its configuration recorded
    (``sidco converge --seeds N`` records one, with the first seed); ``ValueError`` when there is none yet."""
    if run["trace_id"] is None and "config" in run:
        run = next((r for r in seed_runs(store, run) if r["trace_id"] is not None), run)
    if run["trace_id"] is None:
        raise ValueError(f"convergence #{run['id']} has no trace yet (its first pair did not finish); "
                         "rerun the same sidco converge command")
    return store.trace(int(run["trace_id"]))["path"]


def seed_runs(store: Store, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The convergence runs of ``run``'s configuration with any seed (``sidco converge --seeds N``
    stores one run per seed), ``run`` first, the others by seed."""
    import json

    def without_seed(config: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in config.items() if k != "seed"}

    mine = without_seed(run["config"])
    others = []
    for row in store.convergences():
        if row["id"] == run["id"]:
            continue
        config = json.loads(row["config_json"])
        if without_seed(config) == mine:
            others.append({**row, "config": config})
    return [dict(run), *sorted(others, key=lambda r: r["config"].get("seed", 0))]


def projected(store: Store, projection: project.Projection, pairs: Sequence[Pair]) -> dict[Pair, dict[str, Any]]:
    """Each pair of ``pairs`` with its projection on ``projection``'s cluster by
    :func:`pipeline.project.project_pairs`, exactly as ``sidco simulate --trace … --device``
    projects it (compression costs on its device by the one cost policy, or its profile file)."""
    asked = tuple(dict.fromkeys(pair(c, d) for c, d in pairs))
    return {pair(c, d): result for (c, d), result in project.project_pairs(store, replace(projection, pairs=asked))}


def with_memory(projection: project.Projection, table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The per-step rows of ``table`` each with its memory per GPU on ``projection``'s cluster
    (:func:`pipeline.memory.memory_of`, GiB: as ``sidco compare --json`` gives the same configuration),
    which the verdict's memory gate reads."""
    held = memory_setting(projection)
    found: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(t["compressor"] for t in table):
        found[name] = memory_of(projection, name, held)
    return [{**t, **found[t["compressor"]]} for t in table]


def _label(row: Mapping[str, Any]) -> str:
    """A table row's label: its own (a DiLoCo variant's, or the pair's), else its pair's."""
    return row.get("label") or pair(row["compressor"], row["density"]).label


def iteration_times(results: Mapping[Pair, Mapping[str, Any]]) -> tuple[
        dict[Pair, float], dict[Pair, str | None], dict[Pair, tuple[float, float]]]:
    """Of the projections ``results`` (:func:`projected`): projected seconds per iteration of each
    pair, where each pair's costs came from (``None`` for ``none``), and the projection's error band
    ``(iteration_s_low, iteration_s_high)`` per pair where the projection gives one."""
    times = {key: float(r["iteration_s"]) for key, r in results.items()}
    sources = {key: r["cost_source"] for key, r in results.items()}
    bands = {key: (float(r["iteration_s_low"]), float(r["iteration_s_high"])) for key, r in results.items()
             if r.get("iteration_s_low") is not None and r.get("iteration_s_high") is not None}
    return times, sources, bands


def verdict(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which pair of a time-to-target table (:func:`convergence.tta.time_to_target`) reaches the
    target first, and whether that is worth naming.

    The leader is the pair with the shortest mean time to target; it is named ``winner`` only
    when its margin over the runner-up (seconds) exceeds both the seed spread (the sum of the
    two pairs' ``time_spread_s``: their mean ± spread intervals do not overlap) and the
    projection's error band (the leader at its ``iteration_s_high`` still ahead of the
    runner-up at its ``iteration_s_low``). Otherwise ``winner`` is ``None`` and ``reason``
    starts with ``too close to call`` and says which of the two the margin is within. With one
    seed the spread is not measured: the leader is named and ``caveat`` says so.

    A row whose ``fits`` is false (it needs more than one GPU's memory) is never the leader nor the
    runner-up: the memory gate of every verdict, :func:`pipeline.verdict.memory_gate` (when no row
    fits, all are judged and the text says so).

    Returns ``{"winner", "leader", "runner_up"`` (rows or ``None``), ``"margin_s"``,
    ``"margin_ratio"`` (runner-up time / leader time), ``"seed_spread_s"``, ``"band_s"``
    (how far the band can close the margin; ``None`` without a band), ``"within_error"`` (the
    margin is within the band: their time bands overlap), ``"reason"``, ``"caveat"``,
    ``"does_not_fit"`` (the labels of the rows the gate left out)``}``.
    """
    fitting, unfit = memory_gate(rows)
    reached = [r for r in fitting if r.get("time_to_target_s") is not None]
    reached.sort(key=lambda r: r["time_to_target_s"])
    leader = reached[0] if reached else None
    runner = reached[1] if len(reached) > 1 else None
    result: dict[str, Any] = {"winner": None, "leader": leader, "runner_up": runner, "margin_s": None,
                              "margin_ratio": None, "seed_spread_s": None, "band_s": None, "within_error": False,
                              "reason": None, "caveat": None, "does_not_fit": [_label(r) for r in unfit]}
    if leader is None:
        result["reason"] = "no configuration reached the target" if rows else "no configurations"
        return result
    if runner is None:
        result.update(winner=leader, reason="the only configuration that reached the target: no margin to judge")
        return result
    margin = runner["time_to_target_s"] - leader["time_to_target_s"]
    result["margin_s"] = margin
    result["margin_ratio"] = (runner["time_to_target_s"] / leader["time_to_target_s"]
                              if leader["time_to_target_s"] > 0 else None)
    spreads = [r.get("time_spread_s") for r in (leader, runner)]
    spread = None if None in spreads else spreads[0] + spreads[1]
    result["seed_spread_s"] = spread
    result["within_error"] = False
    banded = all(iteration_band(r) is not None for r in (leader, runner))
    if banded:
        result["band_s"] = (leader["iterations_to_target"] * leader["iteration_s_high"]
                            - runner["iterations_to_target"] * runner["iteration_s_low"]) + margin
    why = []
    if spread is not None and margin <= spread:
        why.append(f"the margin {margin:.4g} s is within the seed spread ({spread:.4g} s: the two mean ± spread "
                   "intervals overlap)")
    if result["band_s"] is not None and margin <= result["band_s"]:
        result["within_error"] = True
        why.append(f"the margin {margin:.4g} s is within the projection's error band ({result['band_s']:.4g} s)")
    if why:
        result["reason"] = "too close to call: " + "; ".join(why)
        return result
    result["winner"] = leader
    if spread is None:
        result["caveat"] = "one seed: the spread between seeds is not measured (sidco converge --seeds N)"
    return result


TARGET_SHARE = 0.95
"""A comparison judged by time to accuracy (:func:`for_rows`) targets this share of the best
held-out accuracy its convergence run's dense fp32 (``none``) pair reached (of any pair where
``none`` was not trained)."""


def for_rows(store: Store, trace_id: int | None, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Time to accuracy of compared ``rows`` (projected on one cluster: keys ``compressor``,
    ``density``, ``iteration_s`` and the band) where the store holds a convergence run whose trace
    is ``trace_id`` (the newest, with every seed of its configuration, :func:`seed_runs`): the
    target (:data:`TARGET_SHARE` of the best held-out accuracy of its ``none`` pair, else of any
    pair) and ``table``, :func:`convergence.tta.time_to_target` over the rows' iteration times
    (what :func:`verdict` judges). ``None`` without such a run, or one without held-out accuracy."""
    import json

    if trace_id is None:
        return None
    run = next((c for c in store.convergences() if c["trace_id"] == trace_id), None)
    if run is None:
        return None
    trained = seeded_rows(store, seed_runs(store, {**run, "config": json.loads(run["config_json"])}))
    accuracy = [r for r in trained if r.get("accuracy") is not None]
    if not accuracy:
        return None
    reference = [r for r in accuracy if r["compressor"] == "none"] or accuracy
    target = TARGET_SHARE * max(float(r["accuracy"]) for r in reference)
    times = {pair(r["compressor"], r.get("density")): float(r["iteration_s"]) for r in rows}
    bands = {pair(r["compressor"], r.get("density")): iteration_band(r) for r in rows if iteration_band(r) is not None}
    compared = set(times)
    table = [t for t in time_to_target(trained, times, target_accuracy=target, bands=bands)
             if pair(t["compressor"], t["density"]) in compared]
    return {"convergence_id": run["id"], "target_accuracy": target, "table": table}


def seeded_rows(store: Store, runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stored rows of convergence ``runs`` (the seeds of one configuration), each pair read by
    :func:`pipeline.request.paired_rows` and each row with its run's ``seed``."""
    rows = []
    for item in runs:
        seed = int(item["config"].get("seed", 0))
        rows += [{**r, "seed": seed} for r in paired_rows(store.convergence_rows(item["id"]))]
    return rows


def _points(rows: Sequence[Mapping[str, Any]], seconds: float | None) -> list[dict[str, Any]]:
    """The evaluated points of one curve (``rows`` of every seed) at ``seconds`` per iteration:
    ``{iteration, time_s, seeds, accuracy, accuracy_spread, eval_loss, eval_loss_spread}``."""
    by_iteration: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("accuracy") is not None or r.get("eval_loss") is not None:
            by_iteration.setdefault(int(r["iteration"]), []).append(r)
    points = []
    for iteration, items in sorted(by_iteration.items()):
        point: dict[str, Any] = {"iteration": iteration, "time_s": None if seconds is None else iteration * seconds,
                                 "seeds": len(items)}
        for metric in ("accuracy", "eval_loss"):
            values = [float(i[metric]) for i in items if i.get(metric) is not None]
            point[metric], point[f"{metric}_spread"] = mean_spread(values) if values else (None, None)
        points.append(point)
    return points


def _pair_curves(rows: Sequence[Mapping[str, Any]], times: Mapping[Pair, float]) -> dict[str, list[dict[str, Any]]]:
    """Per pair label the evaluated points of its rows (:func:`_points`, with ``compressor`` and ``density``)."""
    by_pair: dict[Pair, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_pair.setdefault(Pair(str(r["compressor"]), r["density"]), []).append(r)
    curves = {key.label: [{"compressor": key.compressor, "density": key.density, **point}
                          for point in _points(items, times.get(key))] for key, items in by_pair.items()}
    return {label: points for label, points in curves.items() if points}


def _judged(table: Sequence[Mapping[str, Any]], target_accuracy: float | None,
            target_loss: float | None) -> dict[str, Any]:
    """``table`` ranked (:func:`convergence.tta.ranked`) with its :func:`verdict`; where no row
    reached the target, the reason says so (and that the notes say why)."""
    rows = ranked(table)
    result: dict[str, Any] = {"rows": rows, **verdict(rows)}
    if result["leader"] is None and rows:
        seeds = max((t["seeds"] for t in rows), default=1)
        result["reason"] = (f"no configuration reached {target_text(target_accuracy, target_loss)}"
                            f"{' in every seed' if seeds > 1 else ''} (the notes say why)")
    return result


def _cluster_dict(cluster: project.Cluster) -> dict[str, Any]:
    sites = {"sites": sites_of(cluster)}
    if sites["sites"] > 1:
        sites.update(wan_bandwidth_bps=cluster.options["wan_bandwidth_bps"], wan_rtt_s=cluster.options["wan_rtt_s"])
    return {"nodes": cluster.nodes, "bandwidth_bps": cluster.bandwidth_bps, "latency_s": cluster.latency_s,
            "topology": cluster.topology, "fidelity": cluster.fidelity, **sites}


def base_run(store: Store, run: Mapping[str, Any]) -> dict[str, Any]:
    """The synchronous run whose trace times ``run`` and whose pairs are ranked beside its DiLoCo
    runs (:func:`pipeline.penalty.synchronous_run`: ``run`` itself when it is per-step);
    ``ValueError`` naming the command that trains it when a DiLoCo run has none."""
    found = synchronous_run(store, run)
    if found is None:
        raise ValueError(f"convergence #{run['id']} is a DiLoCo run and its configuration has no synchronous run, whose "
                         f"trace gives the compute of an inner step; train it: {baseline_command(run['config'])}")
    return found


def projection_of(store: Store, run: Mapping[str, Any], cluster: Cluster, **fields: Any) -> project.Projection:
    """What convergence ``run`` is timed on: the trace of its synchronous run (:func:`base_run`; a
    DiLoCo run records none, and its synchronous run shares its model, per-worker batch and inner
    optimizer) on ``cluster``, priced by the request's other workload ``fields`` (``device``,
    ``precision``, ``profile_file``, ``calibration``, …: :class:`pipeline.request.WorkloadRequest`'s)."""
    return project.resolve(Request(cluster, **{**fields, "trace": trace_path(store, base_run(store, run))}), store)


DILOCO_NO_SITES = ("no projected time per inner step: DiLoCo syncs across sites; give --sites 2 or more with "
                   "--wan-bandwidth and --wan-rtt")
"""Why a DiLoCo row that reached the target has no time on a cluster of one site."""
STEP_FIELDS = ("utilization", "wan_exposed_s", "inner_step_s", "outer_exchange_s", "hiding_sync_every",
               "outer_wire_bytes", "cost_source")
"""What a DiLoCo row takes of its strategy's projection (:func:`pipeline.lowcomm.strategy_rows`)."""
PER_STEP_FIELDS = ("sync_every", "fragments", "outer_compressor", "outer_density", "utilization", "wan_exposed_s")
"""What a per-step row takes of :func:`pipeline.lowcomm.per_step` beside DiLoCo rows or across sites."""


def _strategy(key: Sequence[Any]) -> Strategy:
    """The strategy of a DiLoCo variant (its :data:`pipeline.penalty.VARIANT` values)."""
    outer = pair(key[1] or "none", key[2])
    return Strategy("diloco", int(key[0]), 1, outer.compressor, outer.density)


def diloco_label(key: Sequence[Any], keys: Sequence[Sequence[Any]]) -> str:
    """A DiLoCo variant's row label, :func:`pipeline.lowcomm.label`'s (``diloco H=10 topk@0.01``),
    with its outer learning rate and momentum where another variant of ``keys`` shares its H and
    outer exchange."""
    text = lowcomm.label(_strategy(key))
    if any(tuple(k[:3]) == tuple(key[:3]) and tuple(k) != tuple(key) for k in keys):
        text += f" outer lr {key[3]:g} momentum {key[4]:g}"
    return text


def diloco_rows(store: Store, projection: project.Projection, variants: Mapping[tuple, Sequence[Mapping[str, Any]]],
                sync_id: int, penalty: Mapping[str, Any] | None, *, target_accuracy: float | None = None,
                target_loss: float | None = None) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """One time-to-target row per DiLoCo variant with a finished curve (``variants``:
    :func:`pipeline.penalty.family`'s, every seed a run) and its curve points.

    Its iterations are inner steps to the target (mean ± spread over the seeds, as the per-step
    rows'); its ``iteration_s`` the time per inner step ``sidco compare`` projects for the strategy
    ``diloco`` at its H and outer exchange on ``projection``'s cluster (:func:`pipeline.lowcomm.strategy_rows`:
    one site's step, compute from the trace of the synchronous run ``sync_id``, plus the outer
    exchange across the sites amortised over H; ``None`` and :data:`DILOCO_NO_SITES` on one site).
    The row is :func:`convergence.tta.time_to_target`'s with ``compressor`` ``diloco``, ``density``
    ``None``, ``label`` (:func:`diloco_label`), the :data:`pipeline.penalty.VARIANT` fields (the outer
    compressor and density as :func:`pipeline.request.pair` reads them), ``fragments`` 1,
    ``convergence_ids``, :data:`STEP_FIELDS` (``None`` unprojected), ``time_source`` (where its time
    per inner step comes from, in words), the memory keys unmodelled
    (:data:`pipeline.memory.STRATEGY_UNMODELLED`) and ``loss_penalty`` (its last shared evaluation against
    the synchronous run in ``penalty``, :func:`pipeline.penalty.loss_penalties`, with
    ``convergence_ids`` and ``seeds``; ``None`` where unmeasured)."""
    chosen = {key: _strategy(key) for key in variants}
    cluster = projection.cluster
    sites = sites_of(cluster)
    timed = dict(zip(chosen, lowcomm.strategy_rows(store, projection, list(chosen.values())))) if sites > 1 else {}
    measured = {tuple(v[k] for k in VARIANT): v for v in (penalty or {}).get("variants", [])}
    table, curves = [], {}
    for key, runs in variants.items():
        rows = seeded_rows(store, runs)
        if not rows:
            continue
        strategy, step = chosen[key], timed.get(key)
        outer = Pair(strategy.outer_compressor, strategy.outer_density)
        seconds = None if step is None else float(step["iteration_s"])
        row = time_to_target(rows, {} if seconds is None else {outer: seconds}, target_accuracy=target_accuracy,
                             target_loss=target_loss)[0]
        if seconds is None and row["iterations_to_target"] is not None:
            row["reason"] = DILOCO_NO_SITES
        label = diloco_label(key, list(variants))
        variant = measured.get(tuple(key))
        found = None if variant is None or variant.get("final") is None else {
            **variant["final"], "convergence_ids": variant["convergence_ids"], "seeds": variant["seeds"]}
        nodes = cluster.nodes // sites
        where = (f"one site's step ({nodes} node{'s' * (nodes != 1)}; compute from trace #{projection.source.trace_id} of "
                 f"synchronous convergence {sync_id}: same model, per-worker batch and inner optimizer, a DiLoCo run "
                 f"records no trace) + its outer exchange ({outer.label}) across {sites} sites / {strategy.sync_every}"
                 if sites > 1 else None)
        table.append({**row, "compressor": "diloco", "density": None, "label": label, **dict(zip(VARIANT, key)),
                      "outer_compressor": outer.compressor, "outer_density": outer.density, "fragments": 1,
                      "convergence_ids": sorted(r["id"] for r in runs),
                      **{k: None if step is None else step[k] for k in STEP_FIELDS},
                      "time_source": where, "loss_penalty": found, **unmodelled(STRATEGY_UNMODELLED)})
        curves[label] = [{"compressor": "diloco", "density": None, **point} for point in _points(rows, seconds)]
    return table, {label: points for label, points in curves.items() if points}


def time_to_accuracy(store: Store, projection: project.Projection, run: Mapping[str, Any], *,
                     target_accuracy: float | None = None, target_loss: float | None = None) -> dict[str, Any]:
    """The time-to-target table of convergence ``run`` (a row of :func:`convergence_run`) on
    ``projection`` (:func:`projection_of`: the trace of its synchronous run on the request's
    cluster and modelled device, ``None`` asked: the device the trace was captured on, in the
    request's precision): every pair of its synchronous run (:func:`base_run`, with every seed of
    its configuration) and every DiLoCo variant of its base configuration (:func:`diloco_rows`),
    ranked together by time to target.

    Returns ``rows`` (:func:`convergence.tta.time_to_target`'s, each with ``label`` and its memory
    per GPU on the cluster, :func:`with_memory`; beside DiLoCo
    rows or across sites a per-step row also has :data:`PER_STEP_FIELDS`, ``sync_every`` 1), the
    fields of :func:`verdict` (over all rows), ``convergence_id`` (``run``'s), ``synchronous_id``
    (the run whose pairs and trace are used), ``convergence_ids`` (its seeds' runs), ``seeds``,
    ``trace_id``, ``workers_trained``, ``workload``, ``cluster`` (nodes, bandwidth_bps, latency_s,
    topology, fidelity, sites, and across sites wan_bandwidth_bps and wan_rtt_s), ``device``,
    ``compute_source``, ``target``, ``cost_sources`` (per pair label, where its compression costs
    came from), ``loss_penalty`` (:func:`pipeline.penalty.loss_penalties`; only where the base has
    DiLoCo runs) and ``curves``: per row label the evaluated points ``{compressor, density,
    iteration, time_s, seeds, accuracy, accuracy_spread, eval_loss, eval_loss_spread}`` (means
    over the seeds; time_s = iteration × projected iteration_s).
    """
    sync = base_run(store, run)
    runs = seed_runs(store, sync)
    rows = seeded_rows(store, runs)
    if not rows:
        raise ValueError(f"convergence #{sync['id']} has no finished (compressor, density) yet; "
                         "rerun its sidco converge command")
    projection = project.registered(store, projection)
    cluster = projection.cluster
    if "powersgd_rank" in sync["config"] and "rank" not in cluster.options:  # project PowerSGD at the rank trained
        cluster = replace(cluster, options={**cluster.options, "rank": int(sync["config"]["powersgd_rank"])})
        projection = replace(projection, request=replace(projection.request, cluster=cluster))
    results = projected(store, projection, [Pair(r["compressor"], r["density"]) for r in rows])
    times, sources, bands = iteration_times(results)
    table = with_memory(projection, [
        {**t, "label": pair(t["compressor"], t["density"]).label}
        for t in time_to_target(rows, times, target_accuracy=target_accuracy, target_loss=target_loss, bands=bands)])
    _, variants = family(store, sync)
    penalty = loss_penalties(store, run)
    diloco, diloco_curves = diloco_rows(store, projection, variants, sync["id"], penalty,
                                        target_accuracy=target_accuracy, target_loss=target_loss)
    if diloco or sites_of(cluster) > 1:
        steps = {pair(r["compressor"], r["density"]): r for r in lowcomm.per_step(
            store, projection, [{**r, "density": key.density} for key, r in results.items()])}
        table = [{**t, **{k: steps[pair(t["compressor"], t["density"])][k] for k in PER_STEP_FIELDS}} for t in table]
    result = _judged([*table, *diloco], target_accuracy, target_loss)
    result["curves"] = {**_pair_curves(rows, times), **diloco_curves}
    source = projection.source
    result.update({
        "convergence_id": run["id"], "synchronous_id": sync["id"], "convergence_ids": [r["id"] for r in runs],
        "seeds": len(runs), "trace_id": source.trace_id, "workers_trained": sync["config"]["workers"],
        "workload": sync["config"]["workload"], "cluster": _cluster_dict(cluster), "device": source.device.name,
        "precision": source.precision, "compute_source": source.compute, "target": {"accuracy": target_accuracy, "loss": target_loss},
        "cost_sources": {key.label: value for key, value in sources.items() if value is not None},
    })
    if penalty is not None:
        result["loss_penalty"] = penalty
    return result


def curves_time_to_accuracy(store: Store, projection: project.Projection, curves: Mapping[str, Any], *,
                            target_accuracy: float | None = None,
                            target_loss: float | None = None) -> dict[str, Any]:
    """The time-to-target table of curves measured elsewhere (:func:`convergence.curves.load`:
    ``{"source", "rows"}``) with iteration times projected from ``projection`` (a trace or
    layout on its modelled device and cluster). Same fields as :func:`time_to_accuracy` except
    the convergence run's: ``curves_source`` (the file's ``source``), ``workload`` (the trace or
    layout), ``seeds`` (most seeds of a pair)."""
    rows = paired_rows(curves["rows"])
    pairs = list(dict.fromkeys(Pair(r["compressor"], r["density"]) for r in rows))
    times, sources, bands = iteration_times(projected(store, projection, pairs))
    table = with_memory(projection, [
        {**t, "label": pair(t["compressor"], t["density"]).label}
        for t in time_to_target(rows, times, target_accuracy=target_accuracy, target_loss=target_loss, bands=bands)])
    result = _judged(table, target_accuracy, target_loss)
    result["curves"] = _pair_curves(rows, times)
    source = projection.source
    result.update({
        "curves_source": curves["source"], "workload": source.ref if source.kind == "layout" else f"trace {source.ref}",
        "seeds": max((r["seeds"] for r in result["rows"]), default=0), "cluster": _cluster_dict(projection.cluster),
        "device": source.device.name, "precision": source.precision, "compute_source": source.compute,
        "target": {"accuracy": target_accuracy, "loss": target_loss},
        "cost_sources": {key.label: value for key, value in sources.items() if value is not None},
    })
    return result


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def _named(row: Mapping[str, Any]) -> str:
    """A row as the verdict names it: its ``label`` (a DiLoCo variant's, or the pair's), ``none``
    "no compression"."""
    label = row.get("label") or pair(row["compressor"], row["density"]).label
    return "no compression (none)" if row["compressor"] == "none" else label


def verdict_text(result: Mapping[str, Any]) -> str:
    """The verdict of a time-to-target table (:func:`time_to_accuracy`) in one line, as both doors
    print it: the winner, the target, its time and its margin over the runner-up (seconds and ×),
    beyond the seed spread and the projection's error band where they are measured; or why none
    is named (``too close to call`` with the leader and the runner-up); the caveat; then the
    configurations that do not fit in one GPU's memory, never named (:func:`verdict`)."""
    text = _called_text(result)
    unfit = result["does_not_fit"]
    if not unfit:
        return text
    leader = result["leader"]
    if leader is not None and _label(leader) in unfit:  # nothing fits: judged as if it did
        text = f"{NONE_FITS}; by time to target alone: {text}"
    return f"{text}; {fit_note(unfit)}"


def _called_text(result: Mapping[str, Any]) -> str:
    """The call of :func:`verdict_text`: the winner and its margin, or why none is named; the caveat last."""
    target = target_text(result["target"]["accuracy"], result["target"]["loss"])
    winner, leader, runner = result["winner"], result["leader"], result["runner_up"]
    if winner is None:
        if leader is None:
            return f"winner: not named, {result['reason']}"
        return (f"winner: not named, {result['reason']} (leader {_named(leader)} "
                f"{_seconds(leader['time_to_target_s'])}, runner-up {_named(runner)} "
                f"{_seconds(runner['time_to_target_s'])})")
    text = f"winner: {_named(winner)} reaches {target} in {_seconds(winner['time_to_target_s'])}"
    if runner is None:
        text += f" ({result['reason']})"
    else:
        text += f", {_seconds(result['margin_s'])} ({result['margin_ratio']:.2f}x) ahead of {_named(runner)}"
        beyond = [f"{what} ({_seconds(result[key])})" for what, key in
                  (("the seed spread", "seed_spread_s"), ("the projection's error band", "band_s"))
                  if result[key] is not None]
        if beyond:
            text += ", beyond " + " and ".join(beyond)
    return text if not result["caveat"] else f"{text}; caveat: {result['caveat']}"


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
    band its sweep stored: ``iteration_s_low``/``high``, ``time_to_target_s_low``/``high``, and
    its memory per GPU, ``memory_gib`` and ``fits``, :func:`pipeline.sweep.scenario_rows`); a scenario whose (compressor,
    density) the run did not train, or that never reached the target, gets ``None`` and a reason.
    A cluster's winner is its fastest to the target among the rows that fit in one GPU's memory
    (:func:`pipeline.verdict.memory_gate`).
    """
    from convergence.tta import iterations_to_target

    run = per_step_run(convergence_run(store, convergence))
    per_pair: dict[Pair, list[dict[str, Any]]] = {}
    for r in paired_rows(store.convergence_rows(run["id"])):
        per_pair.setdefault(Pair(r["compressor"], r["density"]), []).append(r)
    reached = {trained: iterations_to_target(items, target_accuracy=target_accuracy, target_loss=target_loss)
               for trained, items in per_pair.items()}
    rows = []
    for s in scenario_rows(store, int(sweep_id)):
        iterations, reason = reached.get(pair(s["compressor"], s["density"]), (None, f"convergence #{run['id']} did not train this "
                                                      "(compressor, density)"))
        low = s["iteration_s"] if s["iteration_s_low"] is None else s["iteration_s_low"]  # swept before bands
        high = s["iteration_s"] if s["iteration_s_high"] is None else s["iteration_s_high"]
        rows.append({**{k: s[k] for k in SWEEP_COLUMNS}, "iterations_to_target": iterations,
                     "time_to_target_s": None if iterations is None else iterations * s["iteration_s"],
                     "iteration_s_low": low, "iteration_s_high": high,
                     "time_to_target_s_low": None if iterations is None else iterations * low,
                     "time_to_target_s_high": None if iterations is None else iterations * high,
                     "memory_gib": s["memory_gib"], "fits": s["fits"], "reason": reason})
    clusters: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row["time_to_target_s"] is not None:
            clusters.setdefault((row["nodes"], row["bandwidth_bps"], row["latency_s"], row["topology"]), []).append(row)
    winners = []
    for (nodes, bandwidth, latency, topology), reached_rows in sorted(clusters.items()):
        items = sorted(memory_gate(reached_rows)[0], key=lambda r: r["time_to_target_s"])
        best = items[0]
        margin = (items[1]["time_to_target_s"] / best["time_to_target_s"]
                  if len(items) > 1 and best["time_to_target_s"] > 0 else None)
        winners.append({"nodes": nodes, "bandwidth_bps": bandwidth, "latency_s": latency, "topology": topology,
                        "compressor": best["compressor"], "density": best["density"],
                        "time_to_target_s": best["time_to_target_s"], "margin_ratio": margin})
    return {"convergence_id": run["id"], "target": {"accuracy": target_accuracy, "loss": target_loss},
            "rows": rows, "winners": winners}
