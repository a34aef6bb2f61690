"""DiLoCo's loss penalty from the store: every low-communication run of a configuration against its
synchronous run, per H and per outer compressor (:func:`convergence.penalty.loss_penalty`).

A configuration's *base* is what the two must share: workload, width, workers, per-worker batch,
inner optimizer and learning rate, data and held-out samples. Its synchronous run is the stored
per-step run (no ``sync_every`` in its configuration) with the ``none`` pair; its DiLoCo runs
are those with ``sync_every`` > 1, one *variant* per (H, outer compressor, outer density, outer
learning rate, outer momentum), each seed a stored run. ``sidco tta`` prints :func:`penalty_lines`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from convergence.penalty import loss_penalty
from pipeline.request import pair
from results.store import Store

BASE = ("workload", "width", "workers", "batch_size", "optimizer", "lr", "data", "eval_samples")
"""Configuration fields a DiLoCo run and its synchronous baseline share."""
VARIANT = ("sync_every", "outer_compressor", "outer_density", "outer_lr", "outer_momentum")
"""Configuration fields that tell a configuration's DiLoCo runs apart (besides the seed)."""


def tokens_per_iteration(config: Mapping[str, Any]) -> int:
    """Tokens one iteration trains over all workers (workers × batch × sequence length for the text
    workloads; samples for the image ones)."""
    from traces.workloads import SPECS  # torch: only when a penalty is asked for

    spec = SPECS[str(config["workload"])]
    per_sample = int(spec.options.get("seq_len", 1)) if spec.kind == "text" else 1
    return int(config["workers"]) * int(config["batch_size"]) * per_sample


def baseline_command(config: Mapping[str, Any]) -> str:
    """The ``sidco converge`` command that trains ``config``'s synchronous run."""
    optimizer = "adamw" if str(config["optimizer"]).startswith("AdamW") else "sgd"
    return (f"sidco converge --workload {config['workload']} --width {config['width']:g} --workers {config['workers']} "
            f"--batch-size {config['batch_size']} --optimizer {optimizer} --lr {config['lr']:g} --data {config['data']} "
            f"--eval-samples {config['eval_samples']} --iterations {config['iterations']} "
            f"--eval-every {config['eval_every']} --compressors none")


def _rows_by_seed(store: Store, runs: list[dict[str, Any]], compressor: str | None) -> dict[int, list[dict[str, Any]]]:
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        rows = [r for r in store.convergence_rows(run["id"]) if compressor is None or r["compressor"] == compressor]
        if rows:
            by_seed.setdefault(int(run["config"].get("seed", 0)), rows)
    return by_seed


def family(store: Store, run: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[tuple, list[dict[str, Any]]]]:
    """The stored runs of ``run``'s base configuration (:data:`BASE`; ``run``: a convergence row with
    its parsed ``config``), ``run`` among them, each with its parsed ``config``, newest first: the
    synchronous (per-step) runs, and the DiLoCo runs by variant (the :data:`VARIANT` values, in that
    order), every seed of a variant in its list, sorted by H, outer compressor, outer density, outer
    learning rate and momentum."""
    base = {key: run["config"].get(key) for key in BASE}
    sync, variants = [], {}
    for row in store.convergences():
        config = json.loads(row["config_json"])
        if {key: config.get(key) for key in BASE} != base:
            continue
        item = {**row, "config": config}
        if "sync_every" in config:
            variants.setdefault(tuple(config[key] for key in VARIANT), []).append(item)
        else:
            sync.append(item)
    ordered = sorted(variants.items(), key=lambda item: (item[0][0], str(item[0][1]), item[0][2] or 0, *item[0][3:]))
    return sync, dict(ordered)


def synchronous_run(store: Store, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The synchronous run ``run`` stands beside: ``run`` itself when it is per-step; for a DiLoCo
    run (which records no trace) the newest synchronous run of its base configuration that
    recorded one (same model, per-worker batch and inner optimizer: its trace's compute is the
    DiLoCo run's inner step), else the newest synchronous one; ``None`` without any."""
    if "sync_every" not in run["config"]:
        return dict(run)
    sync, _ = family(store, run)
    return next((r for r in sync if r["trace_id"] is not None), sync[0] if sync else None)


def loss_penalties(store: Store, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The loss penalty of every DiLoCo variant of ``run``'s base configuration (``run``: a
    convergence row with its parsed ``config``, as :func:`pipeline.tta.convergence_run` gives)
    against the synchronous run, or ``None`` when ``run`` is per-step and its base has no DiLoCo run.

    Returns ``diloco_run`` (whether ``run`` itself is one), ``baseline`` (``convergence_ids`` of
    the synchronous run's seeds, ``tokens_per_iteration``, ``optimizer``; ``None`` when not stored)
    and ``variants``: per variant, sorted by H and outer compressor, its :data:`VARIANT` fields,
    ``convergence_ids``, ``tokens_per_iteration``, and the penalty (:func:`convergence.penalty.loss_penalty`:
    ``seeds``, ``points``, ``final``) or ``reason`` (why there is none: no baseline, no shared seed
    or evaluation; with the command that trains the baseline).
    """
    sync, variants = family(store, run)
    diloco_run = "sync_every" in run["config"]
    if not variants:
        return None
    baseline = _rows_by_seed(store, sync, "none")
    baseline_ids = sorted(r["id"] for r in sync if any(x["compressor"] == "none" for x in store.convergence_rows(r["id"])))
    sync_tokens = tokens_per_iteration(run["config"])
    result: dict[str, Any] = {
        "diloco_run": diloco_run,
        "baseline": ({"convergence_ids": baseline_ids, "tokens_per_iteration": sync_tokens,
                      "optimizer": run["config"]["optimizer"]} if baseline else None),
        "variants": [],
    }
    for key, runs in variants.items():
        entry: dict[str, Any] = {**dict(zip(VARIANT, key)), "convergence_ids": sorted(r["id"] for r in runs),
                                 "tokens_per_iteration": tokens_per_iteration(runs[0]["config"]), "reason": None}
        mine = _rows_by_seed(store, runs, None)
        if not baseline:
            entry["reason"] = f"no synchronous run of this configuration; train it: {baseline_command(runs[0]['config'])}"
        elif not mine:
            entry["reason"] = "no finished curve yet; rerun its sidco converge command"
        else:
            try:
                entry.update(loss_penalty(mine, baseline, entry["tokens_per_iteration"], sync_tokens))
            except ValueError as exc:
                entry["reason"] = str(exc)
        result["variants"].append(entry)
    return result


def penalty_lines(result: Mapping[str, Any]) -> list[str]:
    """:func:`loss_penalties` as text: a header, one line per variant at its last shared evaluation
    (held-out loss in nats, the penalty ± the seeds' spread and as a share of the baseline's loss)."""
    baseline = result["baseline"]
    what = (f"convergence {', '.join(str(i) for i in baseline['convergence_ids'])}, {baseline['optimizer']}"
            if baseline else "not stored")
    lines = [f"DiLoCo loss penalty against synchronous training at equal tokens (synchronous run: {what}); "
             "held-out loss in nats, mean over paired seeds ± their sample standard deviation",
             f"{'H':>4} {'outer':<14} {'outer lr':>8} {'momentum':>8} {'tokens':>10} {'loss':>8} {'sync loss':>9} "
             f"{'penalty':>26} {'seeds':>5}  runs"]
    for v in result["variants"]:
        head = (f"{v['sync_every']:>4} {pair(v['outer_compressor'], v['outer_density']).label:<14} {v['outer_lr']:>8g} {v['outer_momentum']:>8g}")
        runs = ",".join(str(i) for i in v["convergence_ids"])
        if v["reason"] is not None:
            lines.append(f"{head} {'-':>10} {'-':>8} {'-':>9} {'-':>26} {'-':>5}  {runs}: {v['reason']}")
            continue
        final = v["final"]
        penalty = f"{final['penalty']:+.4f}"
        if final["spread"] is not None:
            penalty += f" ± {final['spread']:.4f}"
        if final["penalty_fraction"] is not None:
            penalty += f" ({final['penalty_fraction']:+.1%})"
        lines.append(f"{head} {final['tokens']:>10} {final['eval_loss']:>8.4f} {final['baseline_eval_loss']:>9.4f} "
                     f"{penalty:>26} {len(v['seeds']):>5}  {runs}")
    return lines
