"""Fill a results store for the dashboard tests with the real pipeline.

synthetic trace of gamma(0.5)-distributed |g| (traces.synthetic) -> replay through real compressors
(traces.replay) -> small analytic sweep (dashboard.sweep_runner -> simulator). A device profile
for "cpu" (every compressor replayed on a synthetic Laplace vector, per-call means) gives layouts
and the compressors the trace's replay lacks their costs. A tiny real convergence run
(pipeline.converge: ResNet-20 at width 0.25, 2 workers, none and topk) with its trace and replay.
Validation rows and a calibration, which need root and minutes of emulated
training, are inserted directly with the store's exact schema.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

import compressors
import traces
from traces.replay import replay

from convergence import RunConfig
from dashboard import sweep_runner
from pipeline import converge
from results.store import Store

COMPRESSORS = ("topk", "dgc", "sidco-e")
DENSITIES = (0.1, 0.01)
CONVERGENCE = RunConfig("resnet20", workers=2, iterations=8, eval_every=2, width=0.25, batch_size=8, eval_samples=32)
LAYERS = [("fc2.bias", (10,)), ("fc2.weight", (10, 400)), ("fc1.bias", (400,)), ("fc1.weight", (400, 40))]


PROFILE_DENSITIES = (0.05, 0.01, 0.002, 0.001)


def measured_device_profile(store: Store, root: Path) -> int:
    """Replay every compressor on a 65,536-element Laplace vector and store the per-call means
    (seconds, bytes) per (compressor, density) as a device profile of "cpu"."""
    trace = traces.synthetic(root / "laplace", "laplace", 1 << 16, workers=1, iterations=2, seed=0)
    names = [n for n in compressors.names() if n != "none"]
    groups = defaultdict(list)
    for row in replay(trace, names, list(PROFILE_DENSITIES)):
        groups[(row["compressor"], row["density"], row["numel"])].append(row)
    rows = [{"compressor": c, "density": d, "numel": n,
             "compress_s": statistics.fmean(r["compress_s"] for r in calls),
             "decompress_s": statistics.fmean(r["decompress_s"] for r in calls),
             "wire_bytes": round(statistics.fmean(r["wire_bytes"] for r in calls))}
            for (c, d, n), calls in groups.items()]
    return store.add_device_profile("cpu", {"test": "populate"}, "replayed on a Laplace vector", rows)


def populate(path: Path, trace_dir: Path) -> dict[str, int]:
    """Write the trace, replay, sweep, calibration and validation rows; return ids."""
    numel = sum(math.prod(shape) for _, shape in LAYERS)
    trace = traces.synthetic(
        trace_dir, "gamma", numel, workers=2, iterations=4, seed=3, layers=LAYERS,
        timings={"forward_s": 0.004, "backward_s": [0.0005, 0.002, 0.0005, 0.003], "optimizer_s": 0.001,
                 "batch_size": 32, "measured": True},
    )
    store = Store(path)
    try:
        trace_id = store.register_trace(trace_dir, trace.manifest)
        config = {"trace": str(trace_dir), "compressors": list(COMPRESSORS), "densities": list(DENSITIES)}
        replay_id, _ = store.get_or_create("replays", config, trace_id=trace_id, device="cpu")
        store.add_replay_rows(replay_id, replay(trace, list(COMPRESSORS), list(DENSITIES), bucket_bytes=8000))
        store.set_status("replays", replay_id, "done")
        measured_device_profile(store, trace_dir.parent)
        store.add_calibration(6e-5, 8.9e-8, 0.9, {"test": True})
        emulation_id = store.start_emulation("train", {}, 2)
        store.set_status("emulations", emulation_id, "done")
        validation = []
        for i, (compressor, workers, measured, projected) in enumerate((
            ("none", 2, 0.210, 0.198), ("sidco-e", 2, 0.120, 0.131), ("topk", 2, 0.160, 0.149),
            ("none", 4, 0.330, 0.352), ("sidco-e", 4, 0.150, 0.142), ("topk", 4, 0.190, 0.204),
        )):
            validation.append({
                "emulation_id": emulation_id, "workload": "resnet20", "compressor": compressor,
                "density": None if compressor == "none" else 0.01, "workers": workers, "bandwidth_bps": 1e8,
                "measured_s": measured, "projected_s": projected,
                "error_pct": (projected - measured) / measured * 100, "calibrated": i % 2, "detail_json": "{}",
                "fidelity": "analytic" if i < 3 else "des", "network_share": 0.7 if compressor == "none" else 0.2,
            })
        store.add_validation(validation)
    finally:
        store.close()
    spec = sweep_runner.parse_spec(f"trace:{trace_id}", ["topk", "sidco-e"], "0.1,0.01", "2,4,8,16",
                                   "1Gbit,10Gbit,100Gbit", "50us", "ring")
    sweep_id = sweep_runner.run(path, spec)
    with Store(path) as store:
        convergence_id = converge.run(store, CONVERGENCE, [("none", None), ("topk", 0.1)]).convergence_id
    return {"trace": trace_id, "replay": replay_id, "sweep": sweep_id, "convergence": convergence_id}
