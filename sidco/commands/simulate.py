"""``sidco simulate``: project one iteration of a trace or layout on a cluster you don't have.

Also holds the argument helpers that ``sidco sweep`` shares (workload source, scenario
options, compression profile from the results store or measured, calibration).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import simulator
from sidco.commands import add_store_argument
from results.store import Store
from simulator.profile import density_key
from simulator.scenario import COMPRESS_ON, TOPOLOGIES
from simulator.units import format_bandwidth, format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_duration
from simulator.workload import BUCKET_MODES


def positive_int(text: str, name: str) -> int:
    """Parse an integer ≥ 1 given for option ``name``; ValueError otherwise."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return value


def add_source_args(parser: argparse.ArgumentParser) -> None:
    """--trace / --layout and the layout compute model."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="DIR", help="trace directory (compute times and gradients come from it)")
    source.add_argument("--layout", metavar="NAME",
                        help="full-size layout instead of a trace: resnet50, vgg19, bert-base, gpt2")
    parser.add_argument("--device-flops", default="100e12", metavar="FLOP/s",
                        help="layouts: device throughput in FLOP/s (default 100e12)")
    parser.add_argument("--batch-size", default="32",
                        help="layouts: samples per worker per iteration (default 32)")
    parser.add_argument("--profile-device", default="cpu",
                        help="device the compressors are timed on when no replay results exist (default cpu)")


def add_scenario_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by simulate and sweep (everything except the swept axes)."""
    parser.add_argument("--fidelity", choices=simulator.FIDELITIES,
                        help="analytic (closed forms) or des (SimPy + link-level messages)")
    parser.add_argument("--bucket-mode", choices=BUCKET_MODES, default="ddp",
                        help="ddp buckets (default), single (whole model, as the SIDCo paper), layer")
    parser.add_argument("--bucket-cap", default="25MiB", help="DDP bucket cap, a size (default 25MiB)")
    parser.add_argument("--first-bucket", default="1MiB", help="DDP first bucket cap, a size (default 1MiB)")
    parser.add_argument("--gpus-per-node", default="1",
                        help="GPUs per node (hierarchical topology; default 1)")
    parser.add_argument("--intra-bandwidth", default="2400Gbit",
                        help="intra-node link bandwidth per GPU and direction (default 2400Gbit)")
    parser.add_argument("--intra-latency", default="2us", help="intra-node per-message latency (default 2us)")
    parser.add_argument("--oversubscription", type=float, default=1.0,
                        help="switch oversubscription factor >= 1 (default 1, non-blocking)")
    parser.add_argument("--ps-servers", type=int, default=0,
                        help="ps topology: dedicated servers (default 0 = sharded over the workers)")
    parser.add_argument("--unpadded", action="store_true",
                        help="sparse all-gathers send each rank's own size (default: pad to the largest, as gloo)")
    parser.add_argument("--compress-on", choices=COMPRESS_ON, default="compute",
                        help="stream compression runs on (default compute: delays later backward layers)")
    parser.add_argument("--jitter", default="0",
                        help="coefficient of variation of each worker's compute time (lognormal), or 'trace' "
                             "for the variation measured in the trace (default 0)")
    parser.add_argument("--interference", type=float, default=0.0,
                        help="compute slowdown while the worker transfers: 0.1 = 10%% slower (default 0)")
    parser.add_argument("--stragglers", type=int, default=0, help="number of slow workers (default 0)")
    parser.add_argument("--straggler-slowdown", type=float, default=1.5,
                        help="compute-time factor of a straggler (default 1.5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of jitter and stragglers (default 0)")
    parser.add_argument("--calibration", action="store_true",
                        help="apply the latest calibration (α, efficiency) of the results store")
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")


def parse_jitter(text: str, workload: simulator.Workload) -> float:
    """``--jitter``: a coefficient of variation ≥ 0, or ``trace`` (the workload's measured one)."""
    if str(text).strip() == "trace":
        return workload.compute_cv
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid --jitter {text!r}: give a coefficient of variation >= 0 or 'trace'") from None
    if not value >= 0:
        raise ValueError(f"invalid --jitter {text!r}: must be >= 0")
    return value


def scenario_options(args: argparse.Namespace, workload: simulator.Workload) -> dict[str, Any]:
    """Scenario keyword arguments from the shared options (units parsed strictly)."""
    return {
        "bucket_mode": args.bucket_mode,
        "bucket_cap_bytes": parse_bytes(args.bucket_cap),
        "first_bucket_bytes": parse_bytes(args.first_bucket),
        "gpus_per_node": positive_int(args.gpus_per_node, "--gpus-per-node"),
        "intra_bandwidth_bps": parse_bandwidth(args.intra_bandwidth),
        "intra_latency_s": parse_duration(args.intra_latency),
        "oversubscription": args.oversubscription,
        "ps_servers": args.ps_servers,
        "padded": not args.unpadded,
        "compress_on": args.compress_on,
        "jitter": parse_jitter(args.jitter, workload),
        "interference": args.interference,
        "stragglers": args.stragglers,
        "straggler_slowdown": args.straggler_slowdown,
        "seed": args.seed,
    }


def load_source(args: argparse.Namespace) -> tuple[simulator.Workload, Any, dict[str, Any]]:
    """The workload, the opened trace (or None) and a JSON description of the source."""
    if args.trace:
        import traces

        trace = traces.open(args.trace)
        return simulator.workload_from_trace(trace), trace, {"trace": str(Path(args.trace).resolve())}
    try:
        flops = float(args.device_flops)
    except ValueError:
        raise ValueError(f"invalid --device-flops {args.device_flops!r}: give FLOP/s, e.g. 100e12") from None
    batch = positive_int(args.batch_size, "--batch-size")
    workload = simulator.workload_from_layout(args.layout, device_flops_per_s=flops, batch_size=batch)
    return workload, None, {"layout": args.layout, "device_flops_per_s": flops, "batch_size": batch}


def stored_replay_rows(store: Store, trace: Any, pairs: list[tuple[str, float]]) -> list[Any]:
    """Replay rows of ``trace`` in the store for each of ``pairs`` (from the newest replay that has it)."""
    found = store.query("SELECT id FROM traces WHERE path=?", (str(Path(trace).resolve()),))
    if not found:
        return []
    wanted = {(c, density_key(d)) for c, d in pairs}
    rows: list[Any] = []
    for replay in store.query("SELECT id FROM replays WHERE trace_id=? ORDER BY created DESC, id DESC", (found[0]["id"],)):
        for row in store.query("SELECT * FROM replay_rows WHERE replay_id=?", (replay["id"],)):
            if (row["compressor"], density_key(row["density"])) in wanted:
                rows.append(row)
        wanted -= {(r["compressor"], density_key(r["density"])) for r in rows}
        if not wanted:
            break
    return rows


def build_profile(
    store: Store, trace: Any, pairs: list[tuple[str, float]], device: str
) -> simulator.CompressionProfile | None:
    """Compression costs for ``pairs``: the store's replay results of the trace where they
    exist, the rest measured now by running the compressors (on the trace, or on synthetic
    Laplace gradients for layouts)."""
    pairs = [(c, d) for c, d in pairs if c != "none"]
    if not pairs:
        return None
    costs: dict = {}
    sources = []
    if trace is not None:
        rows = stored_replay_rows(store, trace, pairs)
        if rows:
            costs.update(simulator.CompressionProfile.from_replay_rows(rows).costs)
            sources.append("results store replay")
    missing = [(c, d) for c, d in pairs if (c, density_key(d)) not in costs]
    if missing:
        names = sorted({c for c, _ in missing})
        densities = sorted({d for _, d in missing})
        where = "the trace" if trace is not None else "synthetic Laplace gradients"
        print(f"profiling {', '.join(names)} on {where} ({device}) ...", file=sys.stderr)
        if trace is not None:
            measured = simulator.CompressionProfile.from_trace(trace, names, densities, device=device)
        else:
            measured = simulator.CompressionProfile.synthetic(names, densities, device=device)
        costs.update({k: v for k, v in measured.costs.items() if k not in costs})
        sources.append(measured.source)
    return simulator.CompressionProfile(costs, "; ".join(sources))


def load_calibration(store: Store, wanted: bool) -> simulator.Calibration | None:
    """The latest calibration (pooled and per-operation fits) as a :class:`simulator.Calibration` (when ``wanted``)."""
    if not wanted:
        return None
    calibration = simulator.Calibration.latest(store.path)
    if calibration is None:
        raise ValueError("--calibration: the results store has no calibration (run sidco calibrate)")
    return calibration


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help="project one training iteration on a simulated cluster",
        description=(
            "Simulate one data-parallel iteration of a trace (or a full-size layout) on NODES machines "
            "with per-direction NIC links of BANDWIDTH (bits/s: 10Gbit, 1.25GB/s) and LATENCY (50us) "
            "behind a switch, with and without the compressor. Prints iteration time (s), samples/s, "
            "the breakdown forward/backward/compress/exposed communication/idle/optimizer (s) and "
            "the speed-up over no compression on the same cluster."
        ),
    )
    add_source_args(parser)
    parser.add_argument("--nodes", required=True, help="machines (an integer >= 1)")
    parser.add_argument("--bandwidth", required=True, help="NIC bandwidth per direction, e.g. 10Gbit or 1.25GB/s")
    parser.add_argument("--latency", default="50us", help="per-message latency, e.g. 50us (default 50us)")
    parser.add_argument("--compressor", default="none", help="compressor name (default none)")
    parser.add_argument("--density", type=float, help="target density in (0, 1], e.g. 0.001 (fp16, bf16 and "
                        "powersgd send what their dtype or rank sets; give 1)")
    parser.add_argument("--rank", default="1", help="PowerSGD's rank r, columns of P and Q per layer (default 1)")
    parser.add_argument("--topology", choices=TOPOLOGIES, default="ring",
                        help="ring (default), halving-doubling, tree, ps, hierarchical")
    parser.add_argument("--timeline", metavar="OUT.json",
                        help="write the iteration as Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    add_scenario_args(parser)
    parser.set_defaults(func=run, fidelity="des")


def _print_result(result: dict[str, Any], scenario: simulator.Scenario) -> None:
    print(f"{scenario.compressor}"
          + (f" @ density {scenario.density:g}" if scenario.density else "")
          + f" on {scenario.nodes} nodes ({scenario.workers} workers), {scenario.topology}, "
            f"{format_bandwidth(scenario.bandwidth_bps)}, {format_seconds(scenario.latency_s)} latency, "
            f"fidelity {scenario.fidelity}")
    print(f"  iteration      {format_seconds(result['iteration_s'])}")
    print(f"  throughput     {result['samples_per_s']:.1f} samples/s")
    print(f"  speed-up       {result['speedup']:.3f}x vs none ({format_seconds(result['baseline_iteration_s'])})")
    for key in ("forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s", "optimizer_s"):
        print(f"  {key[:-2]:<14} {format_seconds(result[key])}")
    print(f"  wire/worker    {format_bytes(result['wire_bytes'])} of {format_bytes(result['dense_bytes'])} dense, "
          f"{result['buckets']} buckets")


def run(args: argparse.Namespace) -> int:
    """Simulate one scenario and print it."""
    nodes = positive_int(args.nodes, "--nodes")
    bandwidth = parse_bandwidth(args.bandwidth)
    latency = parse_duration(args.latency)
    if args.compressor != "none" and args.density is None:
        raise ValueError(f"--density is needed with --compressor {args.compressor}")
    import compressors

    if args.compressor not in compressors.names():
        raise ValueError(f"unknown compressor {args.compressor!r}; choose from {', '.join(compressors.names())}")
    rank = positive_int(args.rank, "--rank")
    workload, trace, _ = load_source(args)
    options = scenario_options(args, workload)
    with Store(args.store) as store:
        calibration = load_calibration(store, args.calibration)
        profile = build_profile(store, trace, [(args.compressor, args.density)], args.profile_device)
    scenario = simulator.Scenario(
        workload, nodes, bandwidth, latency, args.compressor,
        args.density if args.compressor != "none" else None, topology=args.topology, fidelity=args.fidelity,
        profile=profile, calibration=calibration, timeline=bool(args.timeline),
        rank=rank, **options,
    )
    result = simulator.simulate(scenario)
    if args.timeline:
        meta = {"compressor": scenario.compressor, "nodes": scenario.nodes, "fidelity": scenario.fidelity}
        simulator.write_chrome_trace(args.timeline, result["timeline"], meta)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        _print_result(result, scenario)
        if args.timeline:
            print(f"  timeline       {args.timeline}")
    return 0
