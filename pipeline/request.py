"""The request: one projection as either front door asks for it, checked once.

``sidco simulate``, ``compare``, ``sweep`` and ``tta`` map their flags, the dashboard's What-if,
Timeline and Sweeps pages their controls, to a :class:`Request`; constructing it checks every rule a projection has
(the workload named once, compressors that exist, densities in (0, 1] where the compressor
takes one, the cluster's numbers, the precision, the calibration choice), so the doors carry
none of them. The modelled device is looked up in one place, :func:`resolve_device`, by one
default rule; :func:`pipeline.project.resolve` calls it once per request and the resolved
:class:`costs.devices.Device` travels on the projection's source to the compute rule and the
compression-cost policy. :class:`WorkloadRequest` is the workload alone (a sweep's grid or a
convergence run gives the cluster and the pairs). Units: bits/s, seconds, bytes, FLOP/s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from costs import devices
from costs.throughput import DEFAULT_PRECISION, check_precision
from simulator.limits import MESSAGE_BUDGET
from simulator.sharded import DTYPE_BYTES, PARALLEL, PARAM_DTYPE, REDUCE_DTYPE, Sharding, refusal
from simulator.lowcomm import STRATEGIES
from simulator.scenario import FIDELITIES, TOPOLOGIES
from results.store import row_id
from units import (Pair, check_bandwidth, check_count, check_density, check_latency, format_bandwidth, format_seconds,
                   parse_count, parse_duration, parse_list)

if TYPE_CHECKING:
    from costs.anchor import StepProfile

DEFAULT_LAYOUT_DEVICE = "a100"
"""Layouts are GPU models by construction: without ``--device`` they run on this device."""

DEVICE_RULE = (f"default: {DEFAULT_LAYOUT_DEVICE} for a layout, the device a trace was captured on for a trace; "
               "a trace captured on a GPU keeps its own timings, its GPU model unrecorded")
"""The one default rule of the modelled device, as ``--help`` and the dashboard state it."""


def resolve_device(asked: str | None, *, layout: bool, captured: str = "cpu") -> devices.Device:
    """The modelled device of a projection: the device ``asked`` names exactly (case-insensitive,
    ``NAME@ERA`` for a GPU with an earlier PyTorch's kernels; ValueError listing the known names
    otherwise), else the one default rule (:data:`DEVICE_RULE`): :data:`DEFAULT_LAYOUT_DEVICE`
    for a ``layout``, the device a trace was ``captured`` on (``cpu``, ``cuda:0``…):
    :func:`costs.devices.unrecorded_gpu` for a trace captured on a GPU whose model is not
    recorded (its timings are kept; its costs come from stored replays and profiles of ``cuda``).
    The only place a projection looks a device up."""
    if asked:
        return devices.get(asked)
    if layout:
        return devices.get(DEFAULT_LAYOUT_DEVICE)
    kind = captured.split(":")[0]
    return devices.get(kind) if kind == "cpu" else devices.unrecorded_gpu()


def modelled_devices() -> list[str]:
    """The modelled devices' names (``cpu``, ``v100``, ``a100``, ``h100``, ``h200``)."""
    return devices.names()


def device_choices() -> list[tuple[str, str]]:
    """Every modelled device a door may offer: ``(name, label)``, e.g. ``("h100", "NVIDIA H100 SXM")``."""
    return [(name, devices.get(name).label) for name in devices.names()]


def _positive(value: Any, what: str) -> float:
    """``value`` as a finite float > 0; ValueError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)


def default_topology(gpus_per_node: object) -> str:
    """The topology a cluster gets when none is named: ``hierarchical`` with more than one GPU per
    node (the only one of the models that holds an intra-node level), else ``ring``."""
    return "hierarchical" if isinstance(gpus_per_node, int) and gpus_per_node > 1 else "ring"


@dataclass(frozen=True)
class Cluster:
    """The scenario without the compressor: ``nodes`` machines, NIC ``bandwidth_bps`` (bits/s)
    and per-message ``latency_s`` (s), a topology (``None``: :func:`default_topology` of the
    GPUs per node), a fidelity and further :class:`simulator.Scenario` keyword ``options`` (bucket
    sizes in bytes, jitter, …; their limits are the scenario's own,
    :func:`pipeline.project.check_options`)."""

    nodes: int
    bandwidth_bps: float
    latency_s: float
    topology: str | None = None
    fidelity: str = "analytic"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_count(self.nodes, "nodes")
        for value, check in ((self.bandwidth_bps, check_bandwidth), (self.latency_s, check_latency)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{check.__name__.removeprefix('check_')} must be a number, got {value!r}")
            check(value)
        if self.topology is None:
            object.__setattr__(self, "topology", default_topology(self.options.get("gpus_per_node", 1)))
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.topology!r}; choose from {', '.join(TOPOLOGIES)}")
        if self.fidelity not in FIDELITIES:
            raise ValueError(f"unknown fidelity {self.fidelity!r}; choose from {', '.join(FIDELITIES)}")


PARALLEL_CHOICES = PARALLEL
"""The ``--parallel`` choices (:data:`simulator.sharded.PARALLEL`)."""

DTYPE_CHOICES = tuple(DTYPE_BYTES)
"""The ``--reduce-dtype`` and ``--param-dtype`` choices."""


def sharding(parallel: str = "ddp", *, shard_size: int | None = None, reduce_dtype: str = REDUCE_DTYPE,
             param_dtype: str = PARAM_DTYPE, micro_batch: int | None = None, checkpointing: bool = False,
             batch_size: int | None = None) -> Sharding | None:
    """The :class:`simulator.sharded.Sharding` of the ``--parallel`` family (checked there; a
    ``micro_batch`` must divide ``batch_size``, sequences per GPU per optimizer step), ``None`` for
    plain DDP with every default (today's projection, unchanged)."""
    chosen = Sharding(parallel, shard_size, reduce_dtype, param_dtype, micro_batch, checkpointing)
    if micro_batch is not None and batch_size is not None and batch_size % micro_batch:
        raise ValueError(f"--micro-batch {micro_batch} must divide --batch-size {batch_size}")
    return None if chosen == Sharding() else chosen


def parallel_options(parallel: str = "ddp", *, shard_size: str | int | None = None, reduce_dtype: str = REDUCE_DTYPE,
                     param_dtype: str = PARAM_DTYPE, micro_batch: str | int | None = None, checkpointing: bool = False,
                     batch_size: str | int | None = None) -> dict[str, Any]:
    """The cluster options of the ``--parallel`` family as a door gives them (counts as text or
    integers, ``None`` or blank for the defaults): ``{"sharding": ...}`` (:func:`sharding`), or nothing
    for plain DDP with every default. The one place the family's values are parsed; ValueError
    naming the option otherwise."""
    counts = {flag: _whole(value, flag) for flag, value in (("--shard-size", shard_size),
                                                            ("--micro-batch", micro_batch),
                                                            ("--batch-size", batch_size))}
    chosen = sharding(parallel, shard_size=counts["--shard-size"], reduce_dtype=reduce_dtype, param_dtype=param_dtype,
                      micro_batch=counts["--micro-batch"], checkpointing=checkpointing,
                      batch_size=counts["--batch-size"])
    return {} if chosen is None else {"sharding": chosen}


def _whole(value: str | int | None, flag: str) -> int | None:
    """``value`` of option ``flag`` as an integer ≥ 1 (``None`` when not given or blank); ValueError otherwise."""
    if value is None or str(value).strip() == "":
        return None
    return parse_count(value, flag)


def refused(parallel: str, names: Sequence[str]) -> dict[str, str]:
    """The compressors of ``names`` that ``--parallel`` cannot run, each with the reason (one line,
    :func:`simulator.sharded.refusal`), in the order given."""
    return {name: reason for name in names if (reason := refusal(parallel, name)) is not None}


def sharding_flags(held: Sharding | None) -> str:
    """The ``--parallel`` family's flags that give ``held`` (its values other than the defaults), e.g.
    `` --parallel hsdp --micro-batch 1 --checkpointing``; empty for plain DDP."""
    if held is None:
        return ""
    default = Sharding()
    flags = [f" --{name.replace('_', '-')} {getattr(held, name)}"
             for name in ("parallel", "shard_size", "reduce_dtype", "param_dtype", "micro_batch")
             if getattr(held, name) != getattr(default, name)]
    return "".join(flags) + (" --checkpointing" if held.checkpointing else "")


def check_compressors(names: Sequence[str]) -> list[str]:
    """``names`` if every one is a compressor of :func:`compressors.names`; ValueError naming
    the first unknown one (and the choices) otherwise."""
    import compressors

    return compressors.check_names(names)


def takes_density(name: str) -> bool:
    """Whether compressor ``name`` sends the share a density sets (:func:`compressors.takes_density`)."""
    import compressors

    return compressors.takes_density(name)


def pair(compressor: str, density: float | None) -> Pair:
    """The :class:`units.Pair` of ``compressor`` at ``density``: ``None`` for a compressor that
    takes no density (:func:`takes_density`), whatever was recorded for it (the ``1.0`` a store
    row or a curve holds, a sweep grid's density), else ``density`` (checked: in (0, 1]). The one
    place a (compressor, density) read from a door, a store or a file becomes a pair."""
    if not takes_density(compressor):
        return Pair(compressor)
    if density is None:
        raise ValueError(f"{compressor} needs a density")
    return Pair(compressor, check_density(density))


def paired_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (each with ``compressor`` and ``density``: convergence rows a store or an older
    store holds, a curves file's rows, stored scenarios) each with its density by :func:`pair`:
    ``None`` for a compressor that takes none, whatever the row recorded."""
    return [{**row, "density": pair(row["compressor"], row["density"]).density} for row in rows]


def pairs(names: Sequence[str], densities: Sequence[float]) -> list[Pair]:
    """The (compressor, density) pairs of ``names`` (known compressors, repeats dropped) at
    ``densities`` (each in (0, 1]): a compressor that takes no density once with ``None``, every
    one that takes one at each density (ValueError when there is none)."""
    chosen = check_compressors(list(dict.fromkeys(names)))
    checked = [check_density(d) for d in dict.fromkeys(densities)]
    sparse = [n for n in chosen if takes_density(n)]
    if sparse and not checked:
        raise ValueError(f"--density is needed with --compressor {sparse[0]}")
    return [Pair(n) for n in chosen if not takes_density(n)] + [Pair(n, d) for d in checked for n in sparse]


DEFAULT_LATENCY = "50us"
"""The one-way per-message latency a projection assumes when neither ``--latency`` nor ``--rtt`` is given."""

LATENCY_HELP = (f"one-way per-message latency (half the round trip), e.g. 50us (default {DEFAULT_LATENCY}); "
                "or give --rtt")
RTT_HELP = "round-trip time instead of --latency (the one-way latency is half of it), e.g. 100us"


def one_way_latencies(latency: str | None, rtt: str | None) -> list[float]:
    """The one-way per-message latencies (seconds) of ``--latency`` (one-way) or ``--rtt`` (the
    round trip: one-way = rtt / 2), each comma-separated; :data:`DEFAULT_LATENCY` when neither is
    given. ValueError when both are: they name the same quantity."""
    if latency is not None and rtt is not None:
        raise ValueError("give --latency (one-way) or --rtt (round trip), not both")
    if rtt is not None:
        return [value / 2 for value in parse_list(rtt, parse_duration)]
    return parse_list(DEFAULT_LATENCY if latency is None else latency, parse_duration)


def parse_calibration(text: str | int) -> str | int:
    """``--calibration``: ``latest``, ``none`` or a calibration id (an integer >= 1)."""
    choice = str(text).strip().lower()
    if choice in ("latest", "none"):
        return choice
    if choice.isdigit() and int(choice) >= 1:
        return int(choice)
    raise ValueError(f"invalid --calibration {text!r}: give latest, a calibration id or none")


SAMPLES_PER_S_RANGE = (1e-3, 1e8)
"""A plausible single-GPU training throughput (samples/s): from one sample in 1000 s to 10⁸ per second.
Outside it the number is a typo or an underflow (1e-308), and the compute it implies is not physical."""


def check_anchors(layout: str | None, samples_per_s: float | None, tokens: int | None,
                  device_flops_per_s: float | None = None) -> None:
    """The rules of the user's anchors on a layout's compute: ``samples_per_s`` (a measured
    single-GPU training throughput, samples/s) in :data:`SAMPLES_PER_S_RANGE`, for a layout only and not
    beside ``device_flops_per_s``; ``tokens`` a sequence length a transformer ``layout`` (or model)
    takes (:func:`traces.layouts.check_tokens`). ValueError, one line, otherwise."""
    if samples_per_s is not None:
        if layout is None:
            raise ValueError("--samples-per-s applies to layouts (a single-GPU throughput measured at --batch-size); "
                             "a trace is projected from its own timings")
        if device_flops_per_s is not None:
            raise ValueError("give --samples-per-s or --device-flops, not both")
        low, high = SAMPLES_PER_S_RANGE
        if not low <= _positive(samples_per_s, "--samples-per-s") <= high:
            raise ValueError(f"--samples-per-s {samples_per_s!r} is implausible for one GPU's training throughput: "
                             f"give samples/s in {low:g} … {high:,.0f}")
    if tokens is not None:
        if layout is None:
            raise ValueError("--tokens applies to transformer layouts; a trace carries its own sequence length")
        from traces.layouts import check_tokens

        check_tokens(layout, tokens)


@dataclass(frozen=True, kw_only=True)
class WorkloadRequest:
    """The workload of a projection and how it is priced, without the cluster or the pairs (a
    sweep's grid and a convergence run give those), checked on construction (ValueError, one
    line, naming the first bad field).

    The workload: exactly one of ``trace`` (a trace directory), ``trace_id`` (a trace registered
    in the store) or ``layout`` (a full-size layout of :mod:`traces.layouts`, computed with
    ``batch_size`` samples per worker, at ``device_flops_per_s`` FLOP/s when given, or anchored on
    ``samples_per_s``, the single-GPU training throughput measured at ``batch_size``
    (:func:`check_anchors`); ``tokens``: a transformer layout's sequence length, ``None`` for its
    stated input) or ``model`` (a decoder-only transformer from its Hugging Face config.json: a
    shipped model's name or a config file's path, :mod:`traces.llm`; checked here and kept as its
    name or the file's absolute path, then computed as a layout is; ``step_profile``: a model's step
    measured by ``sidco profile --model``, a file (its path) or a stored one read
    (:func:`pipeline.profile.stored_step`), whose throughput anchors compute as
    ``samples_per_s`` does, its device and tokens taken when not given,
    :func:`costs.anchor.step_fields`). ``device``: the modelled device's name, ``None`` for the default rule
    (:func:`resolve_device`); ``precision``: ``fp32``, ``tf32`` or ``amp``. ``calibration``:
    ``latest``, an id or ``none``. Compression costs by the policy
    (:func:`pipeline.costs.compression_profile`), taking ``profile_file`` (a JSON profile) or
    the stored profile ``profile_id`` first. ``message_budget``: the most link-level messages one
    scenario may take."""

    trace: str | None = None
    trace_id: int | None = None
    layout: str | None = None
    device: str | None = None
    precision: str = DEFAULT_PRECISION
    device_flops_per_s: float | None = None
    batch_size: int = 32
    calibration: str | int = "none"
    profile_file: str | None = None
    profile_id: int | None = None
    message_budget: int = MESSAGE_BUDGET
    samples_per_s: float | None = None
    tokens: int | None = None
    model: str | None = None
    step_profile: str | StepProfile | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("trace", "trace_id", "layout", "model") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give one workload: a trace directory, a registered trace, a layout or a model")
        if self.layout is not None:
            from traces.layouts import names as layout_names

            if self.layout not in layout_names():
                raise ValueError(f"unknown layout {self.layout!r}; choose from {', '.join(layout_names())}")
        elif self.model is not None:
            from traces import llm

            object.__setattr__(self, "model", llm.check(self.model))
        elif self.device_flops_per_s is not None:
            raise ValueError("--device-flops applies to layouts; a trace is projected with --device")
        if self.device_flops_per_s is not None:
            _positive(self.device_flops_per_s, "device FLOP/s")
        check_count(self.batch_size, "batch size")
        check_precision(self.precision)
        check_anchors(self.computed, self.samples_per_s, self.tokens, self.device_flops_per_s)
        if self.step_profile is not None:
            from costs.anchor import step_fields

            for name, value in step_fields(self.step_profile, model=self.model, batch_size=self.batch_size,
                                           tokens=self.tokens, precision=self.precision, device=self.device,
                                           samples_per_s=self.samples_per_s,
                                           device_flops_per_s=self.device_flops_per_s).items():
                object.__setattr__(self, name, value)
        object.__setattr__(self, "calibration", parse_calibration(self.calibration))
        for name, what in (("trace_id", "trace"), ("profile_id", "device profile")):  # ids a store can hold
            if getattr(self, name) is not None:
                object.__setattr__(self, name, row_id(getattr(self, name), what))

    @property
    def computed(self) -> str | None:
        """The layout or model computed from its FLOPs (:func:`traces.layouts.layout` takes either),
        ``None`` for a trace."""
        return self.layout if self.layout is not None else self.model


DEFAULT_SYNC_EVERY = 500
"""Inner steps between outer syncs, H, when none is given: DiLoCo's main setting (Douillard et al.
2023, arXiv 2311.08105, H = 500)."""

DEFAULT_FRAGMENTS = 4
"""Fragments of Streaming DiLoCo when none is given (a choice of this testbed, not a published
setting; at most the workload's layers)."""


@dataclass(frozen=True)
class LowComm:
    """How the low-communication strategies (:data:`simulator.lowcomm.STRATEGIES`) sync across
    sites: every ``sync_every`` inner steps (H ≥ 1), ``streaming`` in ``fragments`` (1 … the
    workload's layers; ``None``: :data:`DEFAULT_FRAGMENTS`, or the layers when fewer), the
    pseudo-gradient through ``outer_compressor`` (a compressor of the testbed; ``none``: fp32)
    at ``outer_density`` (in (0, 1], required by a sparsifier, refused by the others). Checked
    on construction (ValueError, one line)."""

    sync_every: int = DEFAULT_SYNC_EVERY
    fragments: int | None = None
    outer_compressor: str = "none"
    outer_density: float | None = None

    def __post_init__(self) -> None:
        check_count(self.sync_every, "--sync-every")
        if self.fragments is not None:
            check_count(self.fragments, "--fragments")
        check_compressors([self.outer_compressor])
        if takes_density(self.outer_compressor):
            if self.outer_density is None:
                raise ValueError(f"--outer-compressor {self.outer_compressor} needs --outer-density")
            object.__setattr__(self, "outer_density", check_density(self.outer_density, "--outer-density"))
        elif self.outer_density is not None:
            raise ValueError(f"--outer-density applies to a sparsifier; {self.outer_compressor} sends what its "
                             "dtype, block format or rank sets")


def sites_options(sites: int = 1, wan_bandwidth_bps: float | None = None,
                  wan_rtt_s: float | None = None) -> dict[str, Any]:
    """A cluster's options for ``sites`` sites joined by a WAN of ``wan_bandwidth_bps`` (bits/s)
    and ``wan_rtt_s`` (round trip, s): only those that differ from one site (``{}`` for one site
    and no WAN, so a one-site request is today's, option for option). ValueError (one line) for a
    WAN without sites or sites without their WAN; the values' ranges are the scenario's."""
    check_count(sites, "--sites")
    chosen: dict[str, Any] = {"sites": sites} if sites > 1 else {}
    given = {k: v for k, v in (("wan_bandwidth_bps", wan_bandwidth_bps), ("wan_rtt_s", wan_rtt_s)) if v is not None}
    if given and sites == 1:
        raise ValueError("--wan-bandwidth and --wan-rtt are the link between sites: give --sites 2 or more")
    if sites > 1 and len(given) < 2:
        raise ValueError(f"--sites {sites} needs --wan-bandwidth and --wan-rtt (the link between the sites)")
    return {**chosen, **given}


def sites_of(cluster: Cluster) -> int:
    """The sites a cluster's nodes are split across (its ``sites`` option; 1 when not given)."""
    return int(cluster.options.get("sites", 1))


def sites_text(cluster: Cluster) -> str:
    """``; 2 sites over a 1 Gbit/s WAN, 30 ms round trip`` for a cluster of several sites, else
    empty: what both doors add to a cluster's description."""
    if sites_of(cluster) <= 1:
        return ""
    return (f"; {sites_of(cluster)} sites over a {format_bandwidth(cluster.options['wan_bandwidth_bps'])} WAN, "
            f"{format_seconds(cluster.options['wan_rtt_s'])} round trip")


@dataclass(frozen=True)
class Request(WorkloadRequest):
    """One projection: the workload (:class:`WorkloadRequest`, its fields by keyword) on
    ``cluster``, ``compressors`` at ``densities`` (each in (0, 1]; at least one when a
    compressor takes a density: :func:`pairs`); ``timeline``: keep the iteration's events;
    ``strategies``: low-communication strategies projected beside them (a cluster of 2 sites or
    more) as ``lowcomm`` says.
    Checked on construction (ValueError, one line, naming the first bad field)."""

    cluster: Cluster
    compressors: tuple[str, ...] = ("none",)
    densities: tuple[float, ...] = ()
    timeline: bool = False
    strategies: tuple[str, ...] = ()
    lowcomm: LowComm = field(default_factory=LowComm)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.cluster, Cluster):
            raise ValueError(f"a projection needs a cluster, got {self.cluster!r}")
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            raise ValueError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
        if self.strategies and sites_of(self.cluster) < 2:
            raise ValueError(f"{self.strategies[0]} syncs across sites: give --sites 2 or more (and --wan-bandwidth, "
                             "--wan-rtt)")
        object.__setattr__(self, "strategies", tuple(dict.fromkeys(self.strategies)))
        if not self.compressors:
            raise ValueError("choose at least one compressor")
        pairs(self.compressors, self.densities)
        object.__setattr__(self, "compressors", tuple(self.compressors))
        object.__setattr__(self, "densities", tuple(check_density(d) for d in self.densities))

    def pairs(self) -> list[Pair]:
        """The request's (compressor, density) pairs (:func:`pairs`)."""
        return pairs(self.compressors, self.densities)
