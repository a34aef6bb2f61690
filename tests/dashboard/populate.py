"""Fill a results store for the dashboard tests with the real pipeline.

synthetic trace of gamma(0.5)-distributed |g| (traces.synthetic) -> replay through real compressors
(traces.replay) -> small analytic sweep (dashboard.sweep_runner -> simulator).
Validation rows and a calibration, which need root and minutes of emulated
training, are inserted directly with the store's exact schema.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import traces
from traces.replay import replay

from dashboard import sweep_runner
from results.store import Store

COMPRESSORS = ("topk", "dgc", "sidco-e")
DENSITIES = (0.1, 0.01)
LAYERS = [("fc2.bias", (10,)), ("fc2.weight", (10, 400)), ("fc1.bias", (400,)), ("fc1.weight", (400, 40))]


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
        rows = [{"replay_id": replay_id, **row}
                for row in replay(trace, list(COMPRESSORS), list(DENSITIES), bucket_bytes=8000)]
        store.insert_many("replay_rows", rows)
        store.set_status("replays", replay_id, "done")
        with store.transaction() as cur:
            cur.execute("INSERT INTO calibrations(created, alpha_s, beta_s_per_byte, efficiency, source_json)"
                        " VALUES(?, ?, ?, ?, ?)", (time.time(), 6e-5, 8.9e-8, 0.9, json.dumps({"test": True})))
            emulation_id = cur.execute(
                "INSERT INTO emulations(created, kind, config_json, cores, status) VALUES(?, 'train', '{}', 2, 'done')",
                (time.time(),)).lastrowid
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
        store.insert_many("validation", validation)
    finally:
        store.close()
    spec = sweep_runner.parse_spec(f"trace:{trace_id}", ["topk", "sidco-e"], "0.1,0.01", "2,4,8,16",
                                   "1Gbit,10Gbit,100Gbit", "50us", "ring")
    sweep_id = sweep_runner.run(path, spec)
    return {"trace": trace_id, "replay": replay_id, "sweep": sweep_id}
