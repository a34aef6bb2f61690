"""``sidco simulate``: project one iteration of a trace or layout on a cluster you don't have.

Maps the arguments to one :class:`pipeline.request.Request` (which checks them) and calls
:func:`pipeline.project.project` of the resolved request. Also holds the argument helpers that ``compare``,
``sweep`` and ``tta`` share (workload and device, scenario options, cluster).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from pipeline import project as projection
from pipeline import quality
from pipeline.catalog import BUCKET_MODES, COMPRESS_ON, DEFAULT_PRECISION, FIDELITIES, PRECISIONS, TOPOLOGIES, model_names
from pipeline.project import check_output_path, write_chrome_trace
from pipeline.costs import KERNEL_BAND_NOTE
from pipeline.memory import memory_of, memory_text
from pipeline.request import (DEVICE_RULE, DTYPE_CHOICES, LATENCY_HELP, PARALLEL_CHOICES, PARAM_DTYPE, REDUCE_DTYPE,
                              RTT_HELP, Cluster, Request, modelled_devices, one_way_latencies, parallel_options,
                              sites_options, sites_text, takes_density)
from pipeline.verdict import judge
from results.store import Store
from sidco.commands import COMMANDS, add_calibration_argument, add_store_argument, dump_json
from units import (Pair, format_bandwidth, format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_count,
                   parse_duration)


def add_source_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--trace / --layout / --model and the layout compute model (``required``: one of them must be given)."""
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument("--trace", metavar="DIR", help="trace directory (compute times and gradients come from it)")
    source.add_argument("--layout", metavar="NAME",
                        help="full-size layout instead of a trace: resnet50, vgg16, vgg19, bert-base, bert-large, gpt2")
    source.add_argument("--model", metavar="NAME|FILE",
                        help="a decoder-only transformer from its Hugging Face config.json, computed like a layout: "
                             + ", ".join(model_names()) + ", or the path of a config.json (GPT-2, LLaMA, Mistral, "
                             "Qwen2, Mixtral); "
                             "--tokens sets its sequence length (default 4096, at most its max_position_embeddings)")
    parser.add_argument("--device", metavar="NAME",
                        help="the modelled device each worker has: " + ", ".join(modelled_devices()) + f" ({DEVICE_RULE}). "
                             "Layouts compute "
                             "by the rule fitted to published GPU training throughput (docs/devices.md); a trace "
                             "captured on another device is projected onto it. Compression costs: --profile, else "
                             "this trace's replays on it, else its measured profile, else the cost model. The torch "
                             "device code runs on is --run-on (replay, profile, bench, capture, converge)")
    add_precision_arg(parser)
    parser.add_argument("--profile", metavar="FILE",
                        help="compression costs measured elsewhere: JSON {device, source, rows: [{compressor, "
                             "density, numel, compress_s, decompress_s[, wire_bytes]}]} (sidco profile --out)")
    parser.add_argument("--device-flops", default=None, metavar="FLOP/s",
                        help="layouts: compute throughput in FLOP/s, overriding --device's")
    parser.add_argument("--batch-size", default="32",
                        help="layouts: samples per worker per iteration (default 32)")
    parser.add_argument("--samples-per-s", default=None, metavar="N",
                        help="layouts: single-GPU training throughput you measured at --batch-size (samples/s); "
                             "compute then comes from it instead of the rule fitted to published throughput, and "
                             "its band shrinks to the measurement's noise (±5%%)")
    parser.add_argument("--step-profile", default=None, metavar="FILE",
                        help="models: a training step measured by sidco profile --model --out FILE; compute then "
                             "comes from its throughput, as with --samples-per-s (band: the spread of its steps, at "
                             "least ±5%%); its device and --tokens are taken unless given, and --batch-size and "
                             "--precision must be those it was measured at")
    parser.add_argument("--tokens", default=None, metavar="N",
                        help="transformer layouts and models: tokens per sample (sequence length; default 128 for "
                             "bert-base and bert-large, 1024 for gpt2, 4096 for a model)")


def add_precision_arg(parser: argparse.ArgumentParser) -> None:
    """``--precision fp32|tf32|amp`` (default amp): what a projection onto a device computes in."""
    parser.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                        help="what the modelled device trains in: fp32, tf32 (fp32 where there are no TF32 units, "
                             "e.g. V100), amp (default: mixed precision, fp16 tensor cores on a V100, bf16 on an "
                             "A100 and later)")


def add_scenario_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by simulate and sweep (everything except the swept axes)."""
    parser.add_argument("--fidelity", choices=FIDELITIES,
                        help="analytic (closed forms) or des (SimPy + link-level messages)")
    parser.add_argument("--bucket-mode", choices=BUCKET_MODES, default="ddp",
                        help="ddp buckets (default), single (whole model, as the SIDCo paper), layer")
    parser.add_argument("--bucket-cap", default="25MiB", help="DDP bucket cap, a size (default 25MiB)")
    parser.add_argument("--first-bucket", default="1MiB", help="DDP first bucket cap, a size (default 1MiB)")
    parser.add_argument("--gpus-per-node", default="1",
                        help="GPUs per node (default 1; above 1 the topology defaults to hierarchical)")
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
    add_sites_args(parser)
    add_calibration_argument(parser)
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """The ``--parallel`` family: how data parallelism holds and exchanges the model states."""
    parser.add_argument("--parallel", choices=PARALLEL_CHOICES, default="ddp",
                        help="ddp (default: full replicas, gradient all-reduce in buckets), fsdp (PyTorch FSDP2 = "
                             "ZeRO-3: per-block parameter all-gather in forward and again in backward, gradient "
                             "reduce-scatter), hsdp (FSDP inside a shard group, gradient-shard all-reduce across "
                             "groups), zero1 / zero2 (DeepSpeed: optimizer states, and gradients, sharded; "
                             "all-reduce / reduce-scatter of gradients and an all-gather of the updated "
                             "parameters once per step). Needs --topology ring or hierarchical; docs/model.md")
    parser.add_argument("--shard-size", default=None, metavar="N",
                        help="hsdp: GPUs per shard group (default one node, --gpus-per-node); a divisor of a "
                             "node's GPUs or a multiple of them")
    parser.add_argument("--reduce-dtype", choices=DTYPE_CHOICES, default=REDUCE_DTYPE,
                        help=f"sharded: the dtype gradients are reduce-scattered and all-reduced in (default "
                             f"{REDUCE_DTYPE}, torchtitan's; the 16-bit cast compressors send 2 bytes an element "
                             "whatever this is)")
    parser.add_argument("--param-dtype", choices=DTYPE_CHOICES, default=PARAM_DTYPE,
                        help=f"sharded: the dtype parameters are all-gathered in (default {PARAM_DTYPE}; fp8: FSDP2's float8 "
                             "all-gather as torchao ships it, or ZeRO++'s quantized weights)")
    parser.add_argument("--micro-batch", default=None, metavar="N",
                        help="sequences per accumulation step; --batch-size (per GPU per optimizer step) is split "
                             "into --batch-size/N micro-batches (default: one). fsdp/hsdp gather parameters and "
                             "reduce gradients every micro-batch, zero2 reduce-scatters every micro-batch, zero1 "
                             "all-reduces once per step; under ddp it sets the activations' memory only")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation checkpointing per block: activations' memory 2*s*b*h a layer instead of "
                             "34*s*b*h (Korthikanti et al. 2022), and sharded plans recompute each block's forward "
                             "in backward")


def add_sites_args(parser: argparse.ArgumentParser) -> None:
    """``--sites`` and the WAN between them (``--wan-bandwidth``, ``--wan-rtt``)."""
    parser.add_argument("--sites", default="1",
                        help="sites the nodes are split evenly across, joined by a WAN (default 1: one site); "
                             "collectives across sites are hierarchical, one aggregated flow per site")
    parser.add_argument("--wan-bandwidth", metavar="RATE",
                        help="with --sites above 1: the WAN link of each site per direction, e.g. 1Gbit")
    parser.add_argument("--wan-rtt", metavar="TIME",
                        help="with --sites above 1: the WAN's round-trip time, e.g. 30ms; every dependent round "
                             "of a collective across sites pays half of it (one way)")


def sites_args(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario's ``sites``, ``wan_bandwidth_bps`` and ``wan_rtt_s`` from ``--sites``,
    ``--wan-bandwidth`` and ``--wan-rtt`` (text parsed here, the rule the request's:
    :func:`pipeline.request.sites_options`)."""
    parsed = {}
    for flag, text, key, parse in (("--wan-bandwidth", args.wan_bandwidth, "wan_bandwidth_bps", parse_bandwidth),
                                    ("--wan-rtt", args.wan_rtt, "wan_rtt_s", parse_duration)):
        if text is not None:
            try:
                parsed[key] = parse(text)
            except ValueError as exc:
                raise ValueError(f"{flag}: {exc}") from None
    return sites_options(parse_count(args.sites, "--sites"), **parsed)


def parse_jitter(text: str) -> float | str:
    """``--jitter``: a coefficient of variation ≥ 0, or ``trace`` (the workload's measured one)."""
    if str(text).strip() == "trace":
        return "trace"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid --jitter {text!r}: give a coefficient of variation >= 0 or 'trace'") from None
    if not value >= 0:
        raise ValueError(f"invalid --jitter {text!r}: must be >= 0")
    return value


def scenario_options(args: argparse.Namespace) -> dict[str, Any]:
    """Scenario keyword arguments from the shared options (units parsed strictly)."""
    return {
        "bucket_mode": args.bucket_mode,
        "bucket_cap_bytes": parse_bytes(args.bucket_cap),
        "first_bucket_bytes": parse_bytes(args.first_bucket),
        "gpus_per_node": parse_count(args.gpus_per_node, "--gpus-per-node"),
        "intra_bandwidth_bps": parse_bandwidth(args.intra_bandwidth),
        "intra_latency_s": parse_duration(args.intra_latency),
        "oversubscription": args.oversubscription,
        "ps_servers": args.ps_servers,
        "padded": not args.unpadded,
        "compress_on": args.compress_on,
        "jitter": parse_jitter(args.jitter),
        "interference": args.interference,
        "stragglers": args.stragglers,
        "straggler_slowdown": args.straggler_slowdown,
        "seed": args.seed,
        **sites_args(args),
    }


def sharding_option(args: argparse.Namespace) -> dict[str, Any]:
    """``{"sharding": ...}`` from the ``--parallel`` family, or nothing for plain DDP with every default."""
    return parallel_options(args.parallel, shard_size=args.shard_size, reduce_dtype=args.reduce_dtype,
                            param_dtype=args.param_dtype, micro_batch=args.micro_batch,
                            checkpointing=args.checkpointing, batch_size=args.batch_size)


def workload_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request's workload and device fields from ``--trace``/``--layout``/``--model``, ``--device``,
    ``--precision``, ``--device-flops``, ``--batch-size``, ``--samples-per-s``, ``--step-profile``, ``--tokens`` and
    ``--profile`` (text parsed here;
    the rules are the request's, :class:`pipeline.request.Request`)."""
    flops = _number(args.device_flops, float, "--device-flops", "FLOP/s, e.g. 100e12")
    return {"trace": args.trace, "layout": args.layout, "model": args.model, "device": args.device, "precision": args.precision,
            "device_flops_per_s": flops, "batch_size": parse_count(args.batch_size, "--batch-size"),
            "profile_file": args.profile, "calibration": args.calibration,
            "samples_per_s": _number(args.samples_per_s, float, "--samples-per-s", "samples/s, e.g. 400"),
            "tokens": _number(args.tokens, int, "--tokens", "a whole number of tokens, e.g. 384"),
            "step_profile": args.step_profile}


def _number(text: str | None, kind: type, flag: str, example: str) -> Any:
    """``text`` of option ``flag`` as ``kind`` (``None`` when not given); ValueError naming
    ``example`` when it is not one. Its range is the request's rule, checked there."""
    if text is None:
        return None
    try:
        return kind(str(text).strip())
    except ValueError:
        raise ValueError(f"invalid {flag} {text!r}: give {example}") from None


def add_latency_args(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """``--latency`` (one-way) and ``--rtt`` (round trip), one of them (``several``: comma-separated lists)."""
    group = parser.add_mutually_exclusive_group()
    many = "comma-separated; " if several else ""
    group.add_argument("--latency", help=many + LATENCY_HELP)
    group.add_argument("--rtt", help=many + RTT_HELP)


def one_way_latency(args: argparse.Namespace) -> float:
    """The one-way latency (seconds) of ``--latency`` or ``--rtt`` (:func:`pipeline.request.one_way_latencies`)."""
    latencies = one_way_latencies(args.latency, args.rtt)
    if len(latencies) != 1:
        raise ValueError(f"give one latency, got {len(latencies)} (sidco sweep takes several)")
    return latencies[0]


def cluster(args: argparse.Namespace) -> Cluster:
    """The cluster of ``--nodes``, ``--bandwidth``, ``--latency`` or ``--rtt``, ``--topology``, ``--fidelity``,
    ``--rank`` and the ``--parallel`` family (where the command has them) and the shared scenario options."""
    options = scenario_options(args)
    if getattr(args, "parallel", None) is not None:
        options.update(sharding_option(args))
    if getattr(args, "rank", None) is not None:
        options["rank"] = parse_count(args.rank, "--rank")
    return Cluster(parse_count(args.nodes, "--nodes"), parse_bandwidth(args.bandwidth), one_way_latency(args),
                   args.topology, args.fidelity, options)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help=COMMANDS["simulate"],
        description=(
            "Simulate one data-parallel iteration of a trace (or a full-size layout) on NODES machines "
            "with per-direction NIC links of BANDWIDTH (bits/s: 10Gbit, 1.25GB/s) and one-way LATENCY (50us; or "
            "--rtt, the round trip) "
            "behind a switch, with and without the compressor. Prints iteration time (s), samples/s, "
            "the breakdown forward/backward/compress/exposed communication/idle/optimizer (s) and "
            "the speed-up over no compression on the same cluster, and the memory one GPU holds (GiB, "
            "memory_gib in --json) against the device's (a configuration that does not fit is never called)."
        ),
    )
    add_source_args(parser)
    parser.add_argument("--nodes", required=True, help="machines (an integer >= 1)")
    parser.add_argument("--bandwidth", required=True, help="NIC bandwidth per direction, e.g. 10Gbit or 1.25GB/s")
    add_latency_args(parser)
    parser.add_argument("--compressor", default="none", help="compressor name (default none)")
    parser.add_argument("--density", type=float, help="target density in (0, 1], e.g. 0.001; needed by the sparsifiers "
                        "(the casts, the quantizers and powersgd send what their dtype, block format or rank sets: "
                        "default 1)")
    parser.add_argument("--rank", default="1", help="PowerSGD's rank r, columns of P and Q per layer (default 1)")
    parser.add_argument("--topology", choices=TOPOLOGIES,
                        help="ring, halving-doubling, tree, ps or hierarchical (default: ring, or hierarchical "
                             "with --gpus-per-node above 1)")
    parser.add_argument("--timeline", metavar="OUT.json",
                        help="write the iteration as Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    add_scenario_args(parser)
    add_parallel_args(parser)
    parser.set_defaults(func=run, fidelity="des")


def _print_result(result: dict[str, Any], args: argparse.Namespace, cluster: Cluster, workload: str) -> None:
    density = 1.0 if args.density is None else args.density  # the casts and PowerSGD: what they send
    print(f"{args.compressor}"
          + (f" @ density {density:g}" if args.compressor != "none" else "")
          + f" on {cluster.nodes} nodes ({result['workers']} workers), {cluster.topology}, "
            f"{format_bandwidth(cluster.bandwidth_bps)}, {format_seconds(cluster.latency_s)} one-way latency, "
            f"fidelity {cluster.fidelity}" + sites_text(cluster))
    print(f"  iteration      {format_seconds(result['iteration_s'])} (band {format_seconds(result['iteration_s_low'])}"
          f" to {format_seconds(result['iteration_s_high'])})")
    print(f"  throughput     {result['samples_per_s']:.1f} samples/s")
    print(f"  speed-up       {result['speedup']:.3f}x vs none ({format_seconds(result['baseline_iteration_s'])}; "
          f"band {result['speedup_low']:.3f}x to {result['speedup_high']:.3f}x)")
    for key in ("forward_s", "backward_s", "compress_s", "exposed_comm_s", "idle_s", "optimizer_s"):
        print(f"  {key[:-2]:<14} {format_seconds(result[key])}")
    print(f"  wire/worker    {format_bytes(result['wire_bytes'])} of {format_bytes(result['dense_bytes'])} dense, "
          f"{result['buckets']} buckets")
    print(f"  device         {result['device']} ({result['precision']}): compute from {result['compute_source']}")
    print(f"  memory/GPU     {memory_text(result)}")
    print(f"  workload       {workload}")
    if result.get("cost_source"):
        low, high = result["cost_band"]
        print(f"  costs from     {result['cost_source']} (band x{low:.2f}-{high:.2f}; {KERNEL_BAND_NOTE})")
    if "parallel" in result:
        print(f"  parallel       {result['parallel']}, shard group {result['shard_size']} GPUs, "
              f"{result['micro_batches']} micro-batch(es); {args.compressor} replaces the {result['collective']}")
        for name, c in result["collectives"].items():
            print(f"  {name:<40} {format_seconds(c['total_s'])} ({format_seconds(c['exposed_s'])} exposed), "
                  f"{format_bytes(c['bytes_per_gpu'])} sent per GPU, {c['count']} per step"
                  + (", compressed" if c["compressed"] else ""))
    if "verdict" in result:
        print(f"verdict: {result['verdict']['text']}")


def _verdict(store: Store, asked: projection.Projection, result: dict[str, Any]) -> dict[str, Any]:
    """Whether to compress with the simulated compressor rather than not at all: the verdict of
    ``sidco compare`` (:func:`pipeline.verdict.judge`) on its row and ``none``'s, projected alike,
    each with what it sends (nothing is replayed) and its memory per GPU (``result``'s already on it:
    a row that does not fit is never called)."""
    asked = projection.registered(store, asked)
    alone = replace(asked, request=replace(asked.request, compressors=("none",), densities=(), timeline=False),
                    pairs=(Pair("none"),))
    (none,) = projection.project(store, alone)
    request = asked.request
    density = None if not takes_density(result["compressor"]) else request.densities[0]
    rows = [{**none, "density": None, **memory_of(asked, "none")}, {**result, "density": density}]
    measured = quality.for_source(store, asked.source, [Pair(r["compressor"], r["density"]) for r in rows],
                                  rank=int(request.cluster.options.get("rank", 1)), run_missing=False)
    return judge(quality.attach(rows, measured))


def run(args: argparse.Namespace) -> int:
    """Simulate one scenario and print it."""
    densities = () if args.density is None else (args.density,)
    request = Request(cluster(args), (args.compressor,), densities, timeline=bool(args.timeline),
                      **workload_fields(args))
    if args.timeline:
        check_output_path(args.timeline)
    asked = projection.resolve(request)  # the device resolved once; bad input stops before any store is opened
    with Store(args.store) as store:
        (result,) = projection.project(store, asked)
        result.update(memory_of(asked, args.compressor))
        if args.compressor != "none":
            result["verdict"] = _verdict(store, asked, result)
    if args.timeline:
        meta = {"compressor": args.compressor, "nodes": request.cluster.nodes, "fidelity": args.fidelity}
        write_chrome_trace(args.timeline, result["timeline"], meta)
    if args.json:
        print(dump_json(result))
    else:
        _print_result(result, args, request.cluster, projection.workload_text(result))
        if args.timeline:
            print(f"  timeline       {args.timeline}")
    return 0
