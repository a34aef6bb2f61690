"""Emulate and validate: real gloo runs on shaped links, stored with the simulator's projections.

:func:`collectives` times all-reduce/all-gather for calibration; :func:`train` trains a built-in
workload under DDP per compressor and compares each measured iteration time with the
projection of the same scenario (:mod:`emulation.projection`), uncalibrated and calibrated.
The compression costs of a projection come from the one policy: the run's own trace is
replayed into the store on one thread (as in the workers), then
:func:`pipeline.costs.compression_profile` reads them back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import simulator
from emulation.collectives import measure_collectives
from emulation.projection import project
from emulation.training import run_training
from pipeline import replay
from pipeline.costs import compression_profile
from results.store import Store

PROJECTED_KEYS = ("iteration_s", "forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s", "jitter")
REPLAY_DEVICE = "cpu"  # the emulated workers run on CPU


def collectives(store: Store, workers: Sequence[int], bandwidths: Sequence[float | None], ops: Sequence[str],
                sizes: Sequence[int], *, repeats: int = 3, compute_load_s: float = 0.0, shaping: bool = True,
                step: Callable[[], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Time ``ops`` at ``sizes`` (bytes) for every (workers, bandwidth) and store the measurements;
    returns ``(emulation_id, rows)``. ``step()`` after each network."""
    config = {"ops": list(ops), "bytes": list(sizes), "workers": list(workers), "bandwidths_bps": list(bandwidths),
              "repeats": repeats, "shaping": shaping, "compute_load_s": compute_load_s}
    emulation_id = store.start_emulation("collective", config, os.cpu_count() or 1)
    results: list[dict[str, Any]] = []
    status = "failed"
    try:
        for p in workers:
            for bandwidth in bandwidths:
                rows = measure_collectives(p, bandwidth, ops, sizes, repeats=repeats, compute_load_s=compute_load_s)
                store.add_collective_measurements(emulation_id, [
                    {"op": r["op"], "workers": r["workers"], "nbytes": r["nbytes"],
                     "bandwidth_bps": r["bandwidth_bps"] or 0.0, "seconds": r["seconds"]} for r in rows])
                results += rows
                if step:
                    step()
        status = "done"
    finally:
        store.set_status("emulations", emulation_id, status)
    return emulation_id, results


def resolve_calibration(store: Store, choice: str | int) -> tuple[int | None, simulator.Calibration | None]:
    """``choice`` ('latest', 'none' or a calibration id) as ``(id, Calibration)`` or ``(None, None)``."""
    if choice == "none":
        return None, None
    if choice == "latest":
        row = store.latest_calibration()
    else:
        row = store.calibration(int(choice))
        if row is None:
            raise ValueError(f"no calibration with id {choice} in {store.path}")
    if row is None:
        return None, None
    return int(row["id"]), simulator.Calibration(row["alpha_s"], row["beta_s_per_byte"], row["efficiency"])


def _profile(store: Store, trace_path: str, name: str, density: float) -> simulator.CompressionProfile | None:
    if name == "none":
        return None
    run = replay.run(store, trace_path, [name], [density], device=REPLAY_DEVICE, threads=1)
    trace_id = store.register_trace(run.trace.path, run.trace.manifest)
    return compression_profile(store, trace_id=trace_id, device=REPLAY_DEVICE, pairs=[(name, density)])


def validation_rows(store: Store, emulation_id: int, workload: str, workers: int, bandwidth: float | None,
                    density: float, measured: Sequence[dict[str, Any]],
                    calibration: tuple[int | None, simulator.Calibration | None]) -> list[dict[str, Any]]:
    """Project every measured run from its own trace, uncalibrated and (if any) calibrated."""
    if bandwidth is None:
        return []
    profiles = {m["compressor"]: _profile(store, m["trace"], m["compressor"], density) for m in measured}
    variants = [(0, None)] + ([(1, calibration[1])] if calibration[1] is not None else [])
    rows = []
    for calibrated, constants in variants:
        for m in measured:
            name = m["compressor"]
            p = project(m["trace"], workers, bandwidth, [name], density, profile=profiles[name],
                        calibration=constants, rank_passes=m.get("compute_passes"))[name]
            rows.append({
                "emulation_id": emulation_id, "workload": workload, "compressor": name,
                "density": None if name == "none" else density, "workers": workers,
                "bandwidth_bps": bandwidth, "measured_s": m["measured_s"], "projected_s": p["iteration_s"],
                "error_pct": (p["iteration_s"] - m["measured_s"]) / m["measured_s"] * 100.0,
                "calibrated": calibrated,
                "detail_json": json.dumps({
                    "cores": os.cpu_count(), "trace": m["trace"],
                    "calibration_id": calibration[0] if calibrated else None,
                    "cost_source": None if profiles[name] is None else profiles[name].source,
                    "measured": m, "projected": {k: p.get(k) for k in PROJECTED_KEYS},
                }, sort_keys=True),
            })
    return rows


def train(store: Store, workers: Sequence[int], bandwidths: Sequence[float | None], workload: str,
          names: Sequence[str], density: float, *, iterations: int, warmup: int, batch_size: int,
          shaping: bool, calibration: tuple[int | None, simulator.Calibration | None] = (None, None),
          trace_root: str | Path | None = None, step: Callable[[], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Train ``workload`` per compressor on every (workers, bandwidth), store measured vs
    projected iteration times; returns ``(emulation_id, results)``. ``calibration``: ``(id,
    constants)`` of the calibration for the second projection (:func:`resolve_calibration`)."""
    config = {"workload": workload, "compressors": list(names), "density": density, "workers": list(workers),
              "bandwidths_bps": list(bandwidths), "iterations": iterations, "warmup": warmup,
              "batch_size": batch_size, "shaping": shaping, "threads_per_worker": 1}
    emulation_id = store.start_emulation("train", config, os.cpu_count() or 1)
    root = Path(trace_root) if trace_root else store.path.parent / "emulation-traces"
    out: list[dict[str, Any]] = []
    status = "failed"
    try:
        for p in workers:
            for bandwidth in bandwidths:
                label = f"{int(bandwidth / 1e6)}mbit" if bandwidth else "loopback"
                measured = run_training(p, bandwidth, workload, names, density, iterations=iterations,
                                        warmup=warmup, batch_size=batch_size,
                                        trace_dir=root / f"{emulation_id}-{workload}-w{p}-{label}")
                for m in measured:
                    store.register_trace(m["trace"], json.loads((Path(m["trace"]) / "manifest.json").read_text()))
                rows = validation_rows(store, emulation_id, workload, p, bandwidth, density, measured, calibration)
                store.add_validation(rows)
                if rows:
                    out += [{**{k: v for k, v in r.items() if k != "detail_json"}, "detail": json.loads(r["detail_json"])}
                            for r in rows]
                else:
                    out += [{"workers": p, "bandwidth_bps": None, "compressor": m["compressor"],
                             "measured_s": m["measured_s"], "detail": {"measured": m}} for m in measured]
                if step:
                    step()
        status = "done"
    finally:
        store.set_status("emulations", emulation_id, status)
    return emulation_id, out
