"""Emulate and validate: real gloo runs on shaped links, stored with the simulator's projections.

:func:`collectives` times all-reduce/all-gather for calibration; :func:`train` trains a built-in
workload under DDP per compressor and compares each measured iteration time with the
projection of the same scenario (:mod:`emulation.projection`) at every fidelity, uncalibrated
and calibrated; each row carries the projection's network share; :func:`summarize` gives the
median and worst |error| per fidelity and calibration, over all cells and network-heavy ones.
:func:`fsdp` runs real FSDP2 / HSDP (``fully_shard``) ranks for a shipped model scaled down and returns,
per cell, the measured iteration time and every collective of a step beside its closed form
(:mod:`emulation.fsdp`). :func:`sites` runs real gloo DiLoCo and per-step compressors between two
sites over a delayed WAN link and holds DiLoCo's measured inner step to its closed form and every
per-step run to its projection (:mod:`emulation.sites`). The compression costs of a projection come from the one policy: the run's own trace is
replayed into the store on one thread (as in the workers), then
:func:`pipeline.costs.compression_profile` reads them back.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import simulator
from emulation.collectives import measure_collectives
from emulation import fsdp_projection
from emulation.fsdp import run_fsdp
from emulation.fsdp_plan import check_mesh as check_fsdp_mesh, scaled as scaled_model  # the door checks by them
from traces.llm import check as check_model, names as model_names  # the door checks --model by them
from emulation.network import remove_stale, require_emulation
from emulation.projection import network_share, project
from emulation.plan import check_shaping  # the door checks a --bandwidth it shapes by it
from emulation.sites import SITES, check_wan, diloco_closed_form, project_per_step, run_sites, wan_delay
from emulation.training import check_request as check_training_request, run_training
from compressors import takes_density
from pipeline import replay
from pipeline.costs import compression_profile
from pipeline.project import calibration as load_calibration
from pipeline.request import parse_calibration, resolve_device
from results.store import Store
from simulator.limits import max_jobs  # the door's cap on worker processes

PROJECTED_KEYS = ("iteration_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "comm_s", "idle_s",
                  "jitter")
NETWORK_HEAVY = 0.30  # network share of the iteration above which a cell tests the network model
REPLAY_DEVICE = "cpu"  # the emulated workers run on CPU


def require_shaping() -> None:
    """Refuse in one line (:class:`emulation.network.EmulationUnavailable`) when this machine
    cannot build the namespaces and shaped links an emulation needs."""
    require_emulation()


def cleanup() -> list[str]:
    """Delete the namespaces a killed run left behind (needs what :func:`require_shaping` checks);
    returns their names."""
    require_emulation()
    return remove_stale()


@contextmanager
def _marked(store: Store, emulation_id: int) -> Iterator[None]:
    """Mark emulation ``emulation_id`` ``done`` when the block completes, ``failed`` when it
    raises (the rows it stored stay)."""
    status = "failed"
    try:
        yield
        status = "done"
    finally:
        store.set_status("emulations", emulation_id, status)


def collectives(store: Store, workers: Sequence[int], bandwidths: Sequence[float | None], ops: Sequence[str],
                sizes: Sequence[int], *, repeats: int = 3, compute_load_s: float = 0.0, shaping: bool = True,
                step: Callable[[], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Time ``ops`` at ``sizes`` (bytes) for every (workers, bandwidth) and store the measurements;
    returns ``(emulation_id, rows)``. ``step()`` after each network."""
    config = {"ops": list(ops), "bytes": list(sizes), "workers": list(workers), "bandwidths_bps": list(bandwidths),
              "repeats": repeats, "shaping": shaping, "compute_load_s": compute_load_s}
    emulation_id = store.start_emulation("collective", config, os.cpu_count() or 1)
    results: list[dict[str, Any]] = []
    with _marked(store, emulation_id):
        for p in workers:
            for bandwidth in bandwidths:
                rows = measure_collectives(p, bandwidth, ops, sizes, repeats=repeats, compute_load_s=compute_load_s)
                store.add_collective_measurements(emulation_id, [
                    {"op": r["op"], "workers": r["workers"], "nbytes": r["nbytes"],
                     "bandwidth_bps": r["bandwidth_bps"] or 0.0, "seconds": r["seconds"]} for r in rows])
                results += rows
                if step:
                    step()
    return emulation_id, results


def resolve_calibration(store: Store, choice: str | int) -> tuple[int | None, simulator.Calibration | None]:
    """``choice`` ('latest', 'none' or a calibration id) as ``(id, Calibration)`` or ``(None, None)``;
    the calibration carries its per-operation fits (:meth:`simulator.Calibration.from_rows`)."""
    calibration = load_calibration(store, choice)
    return (None, None) if calibration is None else (calibration.calibration_id, calibration)


def cells(workers: Sequence[int], bandwidths: Sequence[float | None], names: Sequence[str],
          densities: Sequence[float]) -> list[tuple[int, float | None, float, list[str]]]:
    """The emulated networks of a grid: ``(workers, bandwidth, density, compressors)``; the
    compressors that ignore the density run with the first density only."""
    out = [(p, b, d, [n for n in names if takes_density(n) or i == 0])
           for p in workers for b in bandwidths for i, d in enumerate(densities)]
    return [c for c in out if c[3]]


def _profile(store: Store, trace_path: str, name: str, density: float) -> simulator.CompressionProfile | None:
    if name == "none":
        return None
    run = replay.run(store, trace_path, [name], [density], device=REPLAY_DEVICE, threads=1)
    trace_id = store.register_trace(run.trace.path, run.trace.manifest)
    return compression_profile(store, trace_id=trace_id, device=resolve_device(REPLAY_DEVICE, layout=False),
                               pairs=[(name, density)])


def validation_rows(store: Store, emulation_id: int, workload: str, workers: int, bandwidth: float | None,
                    density: float, measured: Sequence[dict[str, Any]],
                    calibration: tuple[int | None, simulator.Calibration | None],
                    fidelities: Sequence[str] = ("analytic",)) -> list[dict[str, Any]]:
    """Project every measured run from its own trace with every fidelity, uncalibrated and (if
    any) calibrated; each row carries the ``fidelity`` and the projection's ``network_share``."""
    if bandwidth is None:
        return []
    profiles = {m["compressor"]: _profile(store, m["trace"], m["compressor"], density) for m in measured}
    variants = [(0, None)] + ([(1, calibration[1])] if calibration[1] is not None else [])
    rows = []
    for fidelity in fidelities:
        for calibrated, constants in variants:
            for m in measured:
                name = m["compressor"]
                p = project(m["trace"], workers, bandwidth, [name], density, profile=profiles[name],
                            calibration=constants, fidelity=fidelity, rank_passes=m.get("compute_passes"))[name]
                rows.append({
                    "emulation_id": emulation_id, "workload": workload, "compressor": name,
                    "density": density if takes_density(name) else None, "workers": workers,
                    "bandwidth_bps": bandwidth, "measured_s": m["measured_s"], "projected_s": p["iteration_s"],
                    "error_pct": (p["iteration_s"] - m["measured_s"]) / m["measured_s"] * 100.0,
                    "calibrated": calibrated, "fidelity": fidelity, "network_share": network_share(p),
                    "detail_json": json.dumps({
                        "cores": os.cpu_count(), "trace": m["trace"],
                        "calibration_id": calibration[0] if calibrated else None,
                        "cost_source": None if profiles[name] is None else profiles[name].source,
                        "measured": m, "projected": {k: p.get(k) for k in PROJECTED_KEYS},
                    }, sort_keys=True),
                })
    return rows


def train(store: Store, workers: Sequence[int], bandwidths: Sequence[float | None], workload: str,
          names: Sequence[str], densities: Sequence[float], *, iterations: int, warmup: int, batch_size: int,
          shaping: bool, calibration: tuple[int | None, simulator.Calibration | None] = (None, None),
          fidelities: Sequence[str] = ("analytic", "des"), trace_root: str | Path | None = None,
          step: Callable[[], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Train ``workload`` per compressor on every cell of :func:`cells` (workers × bandwidth ×
    density), store measured vs projected iteration times, one row per fidelity; returns
    ``(emulation_id, results)``. ``calibration``: ``(id, constants)`` of the calibration for the
    second projection (:func:`resolve_calibration`). ``step()`` after each network."""
    config = {"workload": workload, "compressors": list(names), "densities": list(densities),
              "workers": list(workers), "bandwidths_bps": list(bandwidths), "iterations": iterations,
              "warmup": warmup, "batch_size": batch_size, "shaping": shaping, "threads_per_worker": 1,
              "fidelities": list(fidelities)}
    emulation_id = store.start_emulation("train", config, os.cpu_count() or 1)
    root = Path(trace_root) if trace_root else store.path.parent / "emulation-traces"
    out: list[dict[str, Any]] = []
    with _marked(store, emulation_id):
        for p, bandwidth, density, run_names in cells(workers, bandwidths, names, densities):
            label = f"{int(bandwidth / 1e6)}mbit" if bandwidth else "loopback"
            measured = run_training(p, bandwidth, workload, run_names, density, iterations=iterations,
                                    warmup=warmup, batch_size=batch_size,
                                    trace_dir=root / f"{emulation_id}-{workload}-w{p}-{label}-d{density:g}")
            for m in measured:
                store.register_trace(m["trace"], json.loads((Path(m["trace"]) / "manifest.json").read_text()))
            rows = validation_rows(store, emulation_id, workload, p, bandwidth, density, measured, calibration,
                                   fidelities)
            store.add_validation(rows)
            if rows:
                out += [{**{k: v for k, v in r.items() if k != "detail_json"}, "detail": json.loads(r["detail_json"])}
                        for r in rows]
            else:
                out += [{"workers": p, "bandwidth_bps": None, "compressor": m["compressor"],
                         "density": density if takes_density(m["compressor"]) else None,
                         "measured_s": m["measured_s"], "detail": {"measured": m}} for m in measured]
            if step:
                step()
    return emulation_id, out


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median and worst |error| (%) of the projections per fidelity, uncalibrated and calibrated,
    over every cell and over the cells whose network share is at least :data:`NETWORK_HEAVY`."""
    summary = {}
    for fidelity in dict.fromkeys(r["fidelity"] for r in results if "fidelity" in r):
        for calibrated, label in ((0, "uncalibrated"), (1, "calibrated")):
            rows = [r for r in results if r.get("fidelity") == fidelity and r.get("calibrated") == calibrated]
            for scope, chosen in (("all cells", rows),
                                  (f"network share >= {NETWORK_HEAVY:.0%}",
                                   [r for r in rows if r["network_share"] >= NETWORK_HEAVY])):
                errors = [abs(r["error_pct"]) for r in chosen]
                if errors:
                    summary[f"{fidelity} {label}, {scope}: median |error|"] = statistics.median(errors)
                    summary[f"{fidelity} {label}, {scope}: worst |error|"] = max(errors)
    return summary


def fsdp_projections(result: dict[str, Any], calibration: tuple[int | None, simulator.Calibration | None],
                     fidelities: Sequence[str]) -> tuple[list[dict[str, Any]], bool]:
    """The sharded simulator's projections of one emulated FSDP2 run (:mod:`emulation.fsdp_projection`)
    per fidelity, uncalibrated and (if any) calibrated: ``fidelity``, ``calibrated``, ``projected_s``,
    ``error_pct`` (projected − measured, % of measured), ``serial_s`` and ``serial_error_pct`` (nothing
    overlapped, as FSDP2 runs on CPU ranks, FSDP2's host work included; the same for every
    fidelity), ``serial_median_error_pct`` (against the median step), ``host_s`` with its measured
    ``host_fixed_s`` and ``copy_bps`` (:class:`emulation.fsdp_projection.Host`), ``network_share`` (of the
    overlapped step) and ``serial_network_share`` (the collectives' time ÷ ``serial_s``),
    ``exposed_comm_s``; and whether the model's collective buffers of a step (per label) are the
    measured ones exactly."""
    if result["bandwidth_bps"] is None:
        return [], False
    replicas, shard = result["mesh"]
    config = scaled_model(result["model"], result["layers"], result["hidden"], result["vocab"], result["tokens"])
    wl = fsdp_projection.workload(config, result["tokens"], result["batch_size"], result["compute_passes"],
                                  result["phases_s"]["optimizer_s"], shard)
    variants = [(0, None)] + ([(1, calibration[1])] if calibration[1] is not None else [])
    rows = []
    for fidelity in fidelities:
        for calibrated, constants in variants:
            sc = fsdp_projection.scenario(wl, result["parallel"], result["workers"], shard, result["bandwidth_bps"],
                                          calibration=constants, fidelity=fidelity)
            costs = fsdp_projection.host(sc, result["compute_passes"], result["host_passes"], result["copy_passes"])
            p = fsdp_projection.project(sc, costs)
            measured, median = result["measured_s"], result["median_s"]
            rows.append({"fidelity": fidelity, "calibrated": calibrated, "projected_s": p["iteration_s"],
                         "error_pct": (p["iteration_s"] - measured) / measured * 100.0,
                         "serial_s": p["serial_s"], "serial_error_pct": (p["serial_s"] - measured) / measured * 100.0,
                         "serial_median_error_pct": (p["serial_s"] - median) / median * 100.0,
                         "host_s": p["host_s"], "host_fixed_s": costs.fixed_s, "copy_bps": costs.copy_bps,
                         "network_share": network_share(p), "serial_network_share": p["comm_s"] / p["serial_s"],
                         "exposed_comm_s": p["exposed_comm_s"]})
    model = fsdp_projection.collective_buffers(fsdp_projection.scenario(wl, result["parallel"], result["workers"],
                                                                        shard, result["bandwidth_bps"]))
    measured: dict[str, list[float]] = {}
    for r in result["collectives"]:
        measured.setdefault(r["collective"], []).append(float(max(r["input_bytes"], r["output_bytes"])))
    same = {k: sorted(v) for k, v in model.items()} == {k: sorted(v) for k, v in measured.items()}
    return rows, same


def fsdp(store: Store, workers: Sequence[int], bandwidths: Sequence[float | None], model: str, parallel: str, *,
         shard_size: int | None, layers: int, hidden: int, vocab: int, tokens: int, batch_size: int, iterations: int,
         warmup: int, calibration: tuple[int | None, simulator.Calibration | None] = (None, None),
         fidelities: Sequence[str] = ("analytic", "des"),
         step: Callable[[], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Train ``model`` scaled down (``layers`` blocks of width ``hidden``, ``vocab`` tokens, sequences
    of ``tokens``) under ``parallel`` (``fsdp``/``hsdp``) with real FSDP2 on every (workers,
    bandwidth) and record the emulation (kind ``fsdp``); returns ``(emulation_id, rows)``, each row
    :func:`emulation.fsdp.run_fsdp`'s result with ``projections`` and
    ``model_buffers_match`` (:func:`fsdp_projections`; shaped links only). ``step()`` after each network."""
    for p in workers:
        check_fsdp_mesh(parallel, p, shard_size)
    scaled_model(model, layers, hidden, vocab, tokens)
    config = {"model": model, "parallel": parallel, "shard_size": shard_size, "workers": list(workers),
              "bandwidths_bps": list(bandwidths), "layers": layers, "hidden": hidden, "vocab": vocab,
              "tokens": tokens, "batch_size": batch_size, "iterations": iterations, "warmup": warmup,
              "threads_per_worker": 1, "fidelities": list(fidelities), "calibration_id": calibration[0]}
    emulation_id = store.start_emulation("fsdp", config, os.cpu_count() or 1)
    rows: list[dict[str, Any]] = []
    with _marked(store, emulation_id):
        for p in workers:
            for bandwidth in bandwidths:
                result = run_fsdp(p, bandwidth, model, parallel, shard_size=shard_size, layers=layers, hidden=hidden,
                                  vocab=vocab, tokens=tokens, batch_size=batch_size, iterations=iterations,
                                  warmup=warmup)
                projections, same = fsdp_projections(result, calibration, fidelities)
                rows.append({**result, "projections": projections, "model_buffers_match": same})
                if step:
                    step()
    return emulation_id, rows


def check_sites(sites_: int, workers: int, wan_bandwidth_bps: float, wan_rtt_s: float, sync_every: int) -> int:
    """ValueError (one line) unless ``workers`` ranks split evenly into ``sites_`` sites joined by a
    WAN the emulation can shape (:func:`emulation.sites.check_wan`) and ``sync_every`` ≥ 1; returns
    the ranks per site. A round trip above 0 needs ``sch_netem`` or TUN/TAP (:func:`emulation.sites.wan_delay`,
    asked by :func:`sites` before the network is built)."""
    if sync_every < 1:
        raise ValueError(f"--sync-every {sync_every}: must be >= 1 inner step")
    if workers % sites_:
        raise ValueError(f"--workers {workers} does not split evenly into --sites {sites_}")
    check_wan(sites_, workers // sites_, wan_bandwidth_bps, wan_rtt_s)
    return workers // sites_


def per_step_row(store: Store, measured: dict[str, Any], density: float, wan_bandwidth_bps: float, wan_rtt_s: float,
                 calibration: tuple[int | None, simulator.Calibration | None] = (None, None)) -> dict[str, Any]:
    """The projection of one per-step run across two sites of one rank each (``measured``: a
    :func:`emulation.sites.run_sites` ``per_step`` entry) from its own trace, its compression costs
    replayed into ``store`` as :func:`validation_rows` takes them
    (:func:`emulation.sites.project_per_step`), nominal and with ``calibration``: ``projected_s``,
    ``error_pct``, ``calibrated_s``, ``calibrated_error_pct`` (``None`` without a calibration),
    ``wan_share`` (nominal), ``detail``."""
    name, measured_s = measured["compressor"], measured["measured_s"]
    profile = _profile(store, measured["trace"], name, density)

    def projected(constants: simulator.Calibration | None) -> dict[str, Any]:
        return project_per_step(measured["trace"], name, density, wan_bandwidth_bps, wan_rtt_s, profile=profile,
                                calibration=constants, rank_passes=measured["compute_passes"])

    def error(p: dict[str, Any] | None) -> float | None:
        return None if p is None else (p["iteration_s"] - measured_s) / measured_s * 100.0

    nominal = projected(None)
    calibrated = None if calibration[1] is None else projected(calibration[1])
    keys = (*PROJECTED_KEYS, "wan_share")
    return {"projected_s": nominal["iteration_s"], "error_pct": error(nominal),
            "calibrated_s": calibrated["iteration_s"] if calibrated else None,
            "calibrated_error_pct": error(calibrated), "wan_share": nominal["wan_share"],
            "detail": {"measured": measured, "projected": {k: nominal[k] for k in keys},
                       "calibrated": {k: calibrated[k] for k in keys} if calibrated else None,
                       "calibration_id": calibration[0] if calibrated else None,
                       "cost_source": None if profile is None else profile.source}}


def sites(store: Store, workers: int, site_bandwidth_bps: float | None, wan_bandwidth_bps: float, wan_rtt_s: float,
          workload: str, names: Sequence[str], density: float, *, sync_every: int, iterations: int, warmup: int,
          batch_size: int, calibration: tuple[int | None, simulator.Calibration | None] = (None, None),
          trace_root: str | Path | None = None) -> list[dict[str, Any]]:
    """Run DiLoCo (every ``sync_every`` inner steps an outer all-reduce across the sites;
    ``iterations`` and ``warmup`` inner steps rounded up to whole rounds) and per-step DDP with each
    of ``names`` at ``density`` on ``workers`` ranks split over :data:`emulation.sites.SITES` sites
    (ranks' links at ``site_bandwidth_bps``, the WAN at ``wan_bandwidth_bps`` bits/s and
    ``wan_rtt_s`` s round trip, delayed as :func:`emulation.sites.wan_delay` picks: ValueError in one
    line where nothing here can); the per-step runs record their traces in a new folder under
    ``trace_root`` (default: ``emulation-traces/`` beside ``store``), and their compression costs
    are replayed into ``store``. Returns one row per run, each with ``wan_delay`` (how the WAN
    was delayed: ``netem``, ``userspace delay line`` or ``none``): ``strategy`` (``diloco`` or
    ``per-step``), ``compressor``, ``sync_every``, ``measured_s`` (wall time per inner step, s), and
    with one rank per site ``projected_s`` (DiLoCo: :func:`emulation.sites.diloco_closed_form`;
    per step: :func:`per_step_row`; nominal WAN), ``error_pct``, ``wan_share``, with ``calibration``
    (``(id, constants)``, :func:`resolve_calibration`) ``calibrated_s`` and ``calibrated_error_pct``,
    and the measured parts (``detail``)."""
    per_site = check_sites(SITES, workers, wan_bandwidth_bps, wan_rtt_s, sync_every)
    check_training_request(workload, names or ["none"], density, iterations, warmup, batch_size)
    delay = wan_delay(wan_bandwidth_bps, wan_rtt_s)
    rounds = -(-iterations // sync_every)
    root = Path(trace_root) if trace_root else store.path.parent / "emulation-traces"
    root.mkdir(parents=True, exist_ok=True)
    trace_dir = tempfile.mkdtemp(prefix=f"sites-{workload}-w{workers}-", dir=root)
    got = run_sites(per_site, site_bandwidth_bps, wan_bandwidth_bps, wan_rtt_s, workload, sync_every=sync_every,
                    rounds=rounds, warmup_rounds=max(1, -(-warmup // sync_every)), batch_size=batch_size,
                    compressors=names, density=density, iterations=iterations, warmup=warmup, trace_dir=trace_dir,
                    delay=delay)
    d = got["diloco"]
    projected = calibrated = None
    if per_site == 1:  # the closed form has no inner all-reduce: project only where a site is one rank
        projected = diloco_closed_form(d["inner_s"], d["outer_local_s"], d["model_bytes"], sync_every,
                                       wan_bandwidth_bps, wan_rtt_s)
        if calibration[1] is not None:
            calibrated = diloco_closed_form(d["inner_s"], d["outer_local_s"], d["model_bytes"], sync_every,
                                            wan_bandwidth_bps, wan_rtt_s, calibration=calibration[1])

    def error(p: dict[str, float] | None) -> float | None:
        return None if p is None else (p["iteration_s"] - d["measured_s"]) / d["measured_s"] * 100.0

    common = {"workers": workers, "sites": SITES, "wan_bandwidth_bps": wan_bandwidth_bps, "wan_rtt_s": wan_rtt_s,
              "wan_delay": got["wan_delay"]}
    rows = [{**common, "strategy": "diloco", "compressor": "none", "density": None, "sync_every": sync_every,
             "measured_s": d["measured_s"],
             "projected_s": projected["iteration_s"] if projected else None, "error_pct": error(projected),
             "calibrated_s": calibrated["iteration_s"] if calibrated else None,
             "calibrated_error_pct": error(calibrated), "wan_share": projected["wan_share"] if projected else None,
             "detail": {"measured": d, "projected": projected, "calibrated": calibrated,
                        "calibration_id": calibration[0] if calibrated else None}}]
    unprojected = {"projected_s": None, "error_pct": None, "calibrated_s": None, "calibrated_error_pct": None,
                   "wan_share": None}
    rows += [{**common, "strategy": "per-step", "compressor": r["compressor"],
              "density": density if takes_density(r["compressor"]) else None, "sync_every": 1,
              "measured_s": r["measured_s"],
              **(per_step_row(store, r, density, wan_bandwidth_bps, wan_rtt_s, calibration) if per_site == 1
                 else {**unprojected, "detail": {"measured": r}})} for r in got["per_step"]]
    return rows
