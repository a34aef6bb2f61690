"""Page-load benchmark: fill a temporary store with ~100,000 rows, time every page's requests.

    python -m benchmarks.dashboard_bench [--rows 100000] [--repeats 3] [--json]

The filler writes rows of the exact store schema through the :class:`Store` API
(``register_trace``, ``get_or_create``, ``add_replay_rows``, ``add_scenarios``,
``start_emulation``, ``add_validation``). Their values come
from the α–β ring cost model and seeded noise: they exercise the page queries
at scale, they are not measurements. Each page is then loaded the way a
browser does it, through Flask's test client: the routing request (layout) and
then every data callback of the page, one after another; the wall time of that
sequence is the page's load time (seconds). The first load of a page is
reported on its own: sweep queries are memoized until the sweep gains rows, so
later loads of a finished sweep are faster. Then the what-if page's live path
is timed: one update per node count (2-256) for resnet50's layout with six
compressors (analytic), whose compression costs come from a device profile the
filler stores (same cost model as its replay rows), after a first update; the
first updates at 512 and 1024 nodes (the simulator builds and caches
its collective plans per node count) and one detailed (des) run are reported
on their own. Exit code 1 if a page load took > 2 s or an analytic update > 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import traces
from results.store import Store, config_key

COMPRESSORS = ("topk", "dgc", "gaussiank", "redsync", "sidco-e", "sidco-p", "sidco-gp")
DENSITIES = (0.1, 0.01, 0.001)


def _ring_s(nbytes: float, nodes: int, bandwidth_bps: float, latency_s: float) -> float:
    return 2 * (nodes - 1) * latency_s + 2 * (nodes - 1) / nodes * nbytes * 8 / bandwidth_bps


def fill(store: Store, rows: int = 100_000, seed: int = 0, numel: int = 1_000_000) -> dict[str, int]:
    """Write about ``rows`` rows (60 % replay rows, 38 % scenarios, the rest validation) to ``store``.

    Returns the number of rows written per table.
    """
    rng = np.random.default_rng(seed)
    layers = [(f"layer{i}", (numel // 8,)) for i in range(8)]
    trace = traces.synthetic(
        Path(store.path).parent / "bench-trace", "laplace", numel // 8 * 8, workers=1, iterations=1, seed=seed,
        layers=layers, overwrite=True,
        timings={"forward_s": 0.017, "backward_s": [0.004] * 8, "optimizer_s": 0.002, "batch_size": 32},
    )
    trace_id = store.register_trace(trace.path, trace.manifest)
    written = {"replay_rows": 0, "scenarios": 0, "validation": 0}

    replay_target = int(rows * 0.6)
    replay_id, _ = store.get_or_create("replays", {"bench": seed}, trace_id=trace_id, device="cpu", status="done")
    workers, buckets = 4, 8
    per_iteration = len(COMPRESSORS) * len(DENSITIES) * workers * buckets
    iterations = max(1, math.ceil(replay_target / per_iteration))
    bucket_numel = numel // buckets
    batch = []
    for iteration in range(1, iterations + 1):
        for compressor in COMPRESSORS:
            for density in DENSITIES:
                for worker in range(workers):
                    for bucket in range(buckets):
                        ratio = float(np.exp(rng.normal(0.0, 0.05 if compressor != "topk" else 0.0)))
                        selected = max(1, round(density * bucket_numel * ratio))
                        batch.append({
                            "compressor": compressor, "density": density,
                            "error_feedback": 1, "iteration": iteration, "worker": worker, "bucket": bucket,
                            "numel": bucket_numel, "selected": selected,
                            "achieved_density": selected / bucket_numel,
                            "achieved_over_target": selected / bucket_numel / density,
                            "threshold": float(-np.log(density) * 1e-3 * ratio), "stages": 1 + int(density < 0.01),
                            "compress_s": float(bucket_numel * 2e-9 * (1 + rng.random())),
                            "decompress_s": float(bucket_numel * 5e-10), "wire_bytes": 8 * selected,
                            "rel_error": float(np.sqrt(1 - density)),
                        })
        if len(batch) >= 20_000:
            written["replay_rows"] += store.add_replay_rows(replay_id, batch)
            batch = []
    written["replay_rows"] += store.add_replay_rows(replay_id, batch)
    store.add_device_profile("cpu", {"bench": seed}, "bench filler (modelled, not measured)", [
        {"compressor": compressor, "density": density, "numel": n, "compress_s": n * 3e-9, "decompress_s": n * 5e-10,
         "wire_bytes": 8 * max(1, round(density * n))}
        for compressor in COMPRESSORS for density in DENSITIES for n in (bucket_numel, 8 * bucket_numel)])

    scenario_target = int(rows * 0.38)
    nodes_axis = (2, 4, 8, 16, 32, 64, 128, 256)
    per_bandwidth = len(nodes_axis) * (1 + len(COMPRESSORS) * len(DENSITIES))
    bandwidths = np.logspace(8, 11, max(2, math.ceil(scenario_target / per_bandwidth))).tolist()
    config = {"bench": seed, "bandwidths": len(bandwidths)}
    sweep_id, _ = store.get_or_create("sweeps", config, trace_id=trace_id, total=per_bandwidth * len(bandwidths),
                                      status="done")
    compute_s, nbytes, latency = 0.05, 4 * numel, 5e-5
    batch = []
    for nodes in nodes_axis:
        for bandwidth in bandwidths:
            base = compute_s + _ring_s(nbytes, nodes, bandwidth, latency)
            for compressor, density in [("none", None)] + [(c, d) for c in COMPRESSORS for d in DENSITIES]:
                if density is None:
                    comm, compress = base - compute_s, 0.0
                else:
                    comm = (nodes - 1) * latency + (nodes - 1) * 8 * density * numel * 8 / bandwidth
                    compress = numel * 2e-9 * (1 + COMPRESSORS.index(compressor) / 3)
                iteration_s = compute_s + compress + comm
                params = {"compressor": compressor, "density": density, "nodes": nodes, "bandwidth_bps": bandwidth,
                          "latency_s": latency, "topology": "ring", "fidelity": "analytic"}
                batch.append({"scenario_key": config_key(params), **params,
                              "iteration_s": iteration_s, "samples_per_s": 32 * nodes / iteration_s,
                              "forward_s": compute_s / 3, "backward_s": 2 * compute_s / 3, "compress_s": compress,
                              "exposed_comm_s": comm, "idle_s": 0.0, "speedup": base / iteration_s,
                              "result_json": "{}"})
    for start in range(0, len(batch), 20_000):
        written["scenarios"] += store.add_scenarios(sweep_id, batch[start:start + 20_000])

    validation_target = max(1, rows - written["replay_rows"] - written["scenarios"])
    emulation_id = store.start_emulation("bench", {}, 2)
    store.set_status("emulations", emulation_id, "done")
    batch = []
    for i in range(validation_target):
        measured = float(0.05 + rng.random())
        projected = measured * float(1 + rng.normal(0, 0.08))
        batch.append({"emulation_id": emulation_id, "workload": "bench", "compressor": COMPRESSORS[i % 7],
                      "density": DENSITIES[i % 3], "workers": 2 + i % 3, "bandwidth_bps": 1e8,
                      "measured_s": measured, "projected_s": projected,
                      "error_pct": (projected - measured) / measured * 100, "calibrated": i % 2,
                      "detail_json": "{}"})
    written["validation"] = store.add_validation(batch)
    return written


def _callback_request(app, output: str, inputs: list[dict[str, Any]], state: list[dict[str, Any]],
                      changed: list[str]) -> dict[str, Any]:
    spec = app.callback_map[output]
    outputs = [{"id": o.component_id, "property": o.component_property}
               for o in (spec["output"] if isinstance(spec["output"], list) else [spec["output"]])]
    return {"output": output, "outputs": outputs if len(outputs) > 1 else outputs[0], "inputs": inputs,
            "state": state, "changedPropIds": changed}


def _component_values(layout: Any) -> dict[str, dict[str, Any]]:
    """Every component's id → its props, walking a JSON layout."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("props")
            if isinstance(props, dict):
                ident = props.get("id")
                if ident is not None:
                    key = json.dumps(ident, sort_keys=True, separators=(",", ":")) if isinstance(ident, dict) else ident
                    found[key] = props
                for value in props.values():
                    walk(value)
            else:
                for value in node.values():
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(layout)
    return found


def time_page(app, client, path: str) -> dict[str, Any]:
    """Load ``path`` like the browser: routing request, then the page's data callbacks in order.

    Each data callback's inputs are read from the layout (or from the outputs of
    an earlier callback of the same load). Returns seconds per request and total.
    """
    timings: list[tuple[str, float]] = []
    started = time.perf_counter()
    t0 = time.perf_counter()
    response = client.post("/_dash-update-component", json={
        "output": "..page.children...nav.children..",
        "outputs": [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"}],
        "inputs": [{"id": "url", "property": "pathname", "value": path}],
        "changedPropIds": ["url.pathname"], "state": [{"id": "url", "property": "search", "value": ""}],
    })
    _check(response, "layout")
    timings.append(("layout", time.perf_counter() - t0))
    errors = []
    values = _component_values(response.get_json()["response"]["page"]["children"])
    initial = {c["output"] for c in app._callback_list if not c.get("prevent_initial_call")}
    pending = [key for key in app.callback_map
               if key in initial and "MATCH" not in key and key != "..page.children...nav.children.."]
    done: set[str] = set()
    progressed = True
    while progressed:
        progressed = False
        for key in pending:
            if key in done:
                continue
            spec = app.callback_map[key]
            ids = [i["id"] for i in spec["inputs"] + spec["state"]]
            if not all(i in values for i in ids):
                continue
            inputs = [{**i, "value": values[i["id"]].get(i["property"])} for i in spec["inputs"]]
            state = [{**s, "value": values[s["id"]].get(s["property"])} for s in spec["state"]]
            t0 = time.perf_counter()
            body = client.post("/_dash-update-component", json=_callback_request(
                app, key, [_decode(i) for i in inputs], [_decode(s) for s in state],
                [f"{spec['inputs'][0]['id']}.{spec['inputs'][0]['property']}"]))
            _check(body, key)
            timings.append((key, time.perf_counter() - t0))
            done.add(key)
            progressed = True
            if body.status_code == 200 and body.data:
                text = body.get_data(as_text=True)
                if "inline-error" in text:
                    errors.append(f"{key}: {text[text.index('inline-error') - 200:][:400]}")
                for ident, props in body.get_json()["response"].items():
                    values.setdefault(ident, {}).update(props)
    return {"page": path, "total_s": time.perf_counter() - started, "requests": len(timings), "errors": errors,
            "slowest": max(timings, key=lambda t: t[1])}


def _check(response, what: str) -> None:
    if response.status_code not in (200, 204):
        raise RuntimeError(f"{what}: HTTP {response.status_code}: {response.get_data(as_text=True)[:300]}")


def _decode(item: dict[str, Any]) -> dict[str, Any]:
    ident = item["id"]
    if isinstance(ident, str) and ident.startswith("{"):
        item = {**item, "id": json.loads(ident)}
    return item


def _whatif_values(client) -> dict[str, dict[str, Any]]:
    """The What-if page's components and their initial props, as its routing request returns them."""
    response = client.post("/_dash-update-component", json={
        "output": "..page.children...nav.children..",
        "outputs": [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"}],
        "inputs": [{"id": "url", "property": "pathname", "value": "/"}],
        "changedPropIds": ["url.pathname"], "state": [{"id": "url", "property": "search", "value": ""}],
    })
    _check(response, "what-if layout")
    return _component_values(response.get_json()["response"]["page"]["children"])


def time_whatif_updates(app, client, source: str, nodes: Sequence[int], fidelity_button: bool = False) -> list[float]:
    """Seconds per what-if update as the node count changes (the live control path): the page's
    own projection callback (found in the app's callback map), its inputs at the page's initial
    values but for the source, six compressors at δ = 0.01 and the node count."""
    key = next(k for k in app.callback_map if "whatif-breakdown" in k)
    spec = app.callback_map[key]
    values = _whatif_values(client)
    chosen = {"whatif-source": source, "whatif-compressors": ["none", "topk", "dgc", "sidco-e", "sidco-p", "sidco-gp"],
              "whatif-density": "0.01", "whatif-des": 1 if fidelity_button else None}
    seconds = []
    for n in nodes:
        chosen["whatif-nodes"] = str(n)

        def value(item: dict[str, Any]) -> dict[str, Any]:
            ident = item["id"]
            given = chosen.get(ident, values.get(ident, {}).get(item["property"]))
            return _decode({**item, "value": given})

        started = time.perf_counter()
        response = client.post("/_dash-update-component", json=_callback_request(
            app, key, [value(i) for i in spec["inputs"]], [value(s) for s in spec["state"]],
            ["whatif-des.n_clicks" if fidelity_button else "whatif-nodes.value"]))
        seconds.append(time.perf_counter() - started)
        _check(response, "what-if update")
        if "inline-error" in response.get_data(as_text=True):
            raise RuntimeError(f"what-if update at {n} nodes: {response.get_data(as_text=True)[-400:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Fill a temporary store and print page load times (seconds)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rows", type=int, default=100_000, help="rows to write across the tables")
    parser.add_argument("--repeats", type=int, default=3,
                        help="loads per page after the first (their median is reported beside the first load)")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")
    args = parser.parse_args(argv)
    from dashboard.app import PAGES, create_app

    with tempfile.TemporaryDirectory(prefix="sidco-dash-bench-") as tmp:
        store = Store(Path(tmp) / "results.sqlite")
        t0 = time.perf_counter()
        written = fill(store, rows=args.rows)
        fill_s = time.perf_counter() - t0
        store.close()
        app = create_app(Path(tmp) / "results.sqlite", cache_dir=Path(tmp) / "cache")
        client = app.server.test_client()
        client.get("/")
        results = []
        for page in PAGES:
            runs = [time_page(app, client, page.PATH) for _ in range(args.repeats + 1)]
            results.append({"page": page.TITLE, "path": page.PATH, "first_s": runs[0]["total_s"],
                            "median_s": statistics.median(r["total_s"] for r in runs[1:]),
                            "max_s": max(r["total_s"] for r in runs), "requests": runs[0]["requests"],
                            "slowest_request": runs[0]["slowest"][0], "slowest_request_s": runs[0]["slowest"][1],
                            "errors": runs[0]["errors"]})
        first = time_whatif_updates(app, client, "layout:resnet50", [8])[0]
        live = time_whatif_updates(app, client, "layout:resnet50", [2, 4, 16, 32, 64, 128, 256, 8])
        large = time_whatif_updates(app, client, "layout:resnet50", [512, 1024])
        des = time_whatif_updates(app, client, "layout:resnet50", [64], fidelity_button=True)[0]
    whatif = {"first_s": first, "median_s": statistics.median(live), "max_s": max(live), "des_64_nodes_s": des,
              "first_512_nodes_s": large[0], "first_1024_nodes_s": large[1]}
    report = {"rows": written, "total_rows": sum(written.values()), "fill_s": fill_s, "pages": results,
              "whatif_updates": whatif}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"store: {report['total_rows']:,} rows {written} (filled in {fill_s:.1f} s)")
        for r in results:
            print(f"{r['page']:<20} first load {r['first_s'] * 1e3:6.0f} ms, then median {r['median_s'] * 1e3:6.0f} ms,"
                  f" max {r['max_s'] * 1e3:6.0f} ms ({r['requests']} requests; slowest of the first load "
                  f"{r['slowest_request_s'] * 1e3:.0f} ms)")
        print(f"what-if, layout resnet50, 6 compressors: first update {first * 1e3:.0f} ms, then analytic updates "
              f"median {whatif['median_s'] * 1e3:.0f} ms, max {whatif['max_s'] * 1e3:.0f}"
              f" ms (2-256 nodes); first update at 512 / 1024 nodes {large[0] * 1e3:.0f} / {large[1] * 1e3:.0f} ms;"
              f" des at 64 nodes {des * 1e3:.0f} ms")
        for r in results:
            for message in r["errors"]:
                print(f"  {r['page']}: inline error in {message}", file=sys.stderr)
    ok = all(r["max_s"] <= 2.0 and not r["errors"] for r in results) and whatif["max_s"] <= 0.2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
