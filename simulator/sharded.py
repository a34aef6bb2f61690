"""Sharded data parallelism (FSDP2, HSDP, DeepSpeed ZeRO-1/2): the plan of one optimizer step.

:class:`Sharding` says how the model states are sharded (``--parallel``), :func:`build` turns a
:class:`~simulator.scenario.Scenario` with one into a :class:`Plan`: the compute stream's tasks and
the collectives of three communication streams (all-gather, reduce-scatter, all-reduce: FSDP2's
``FSDPCommContext`` streams), each collective released by a compute task's start or end and run
first-in first-out on its stream. :func:`run_analytic` times the plan with the closed forms of
:mod:`simulator.topologies` (every collective alone on its links); :func:`run_des` runs the same
plan in SimPy with every collective's step program as link-level messages on one shared
:class:`~simulator.links.Fabric`, so collectives of different streams that meet on a link queue
behind each other there. :func:`iteration` gives the output fields (those of DDP plus
``parallel``, ``collective`` and ``collectives``: each collective's bytes, total and exposed
time) and, asked for, the timeline. docs/model.md, "Sharded data parallelism", has the rules and
their sources. Units: seconds, bytes.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from compressors import card
from compressors.messages.wire import ALLREDUCE, COUNT_BYTES, counts_first
from compressors.work import wire_bytes
from compressors.rules import plan as lowrank_plan
from simulator import plans
from simulator.iteration import MIN_COMPRESSION_RATE, _levels
from simulator.links import Fabric, Level
from simulator.topologies import KINDS, Phase, Ring
from units import check_count

if TYPE_CHECKING:
    from simulator.scenario import Scenario

PARALLEL = ("ddp", "fsdp", "hsdp", "zero1", "zero2")
"""The ``--parallel`` choices: DDP (full replicas, :mod:`simulator.iteration`), FSDP2 (ZeRO-3),
HSDP (FSDP2 inside a shard group, replicated across groups), DeepSpeed ZeRO stages 1 and 2."""

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp8": 1}
"""Bytes per element of the dtypes a collective may carry (``--reduce-dtype``, ``--param-dtype``)."""
REDUCE_DTYPE = "fp32"
"""The default dtype gradients are reduced in (torchtitan's)."""
PARAM_DTYPE = "bf16"
"""The default dtype parameters are all-gathered in (mixed precision's compute dtype)."""


STREAMS = ("all-gather", "reduce-scatter", "all-reduce")
"""FSDP2's communication streams (all-gather, reduce-scatter, HSDP's all-reduce)."""

QUANTIZED_REDUCE_SCATTER = "reduce-scatter (gradients, quantized all-to-all)"
"""The label of a block quantizer's reduce-scatter (:func:`quantized_all_to_all`)."""

_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
"""A parameter of transformer block ``N``: ``model.layers.N.``, GPT-2's ``transformer.h.N.``."""


@dataclass(frozen=True)
class Sharding:
    """How data parallelism holds the model states: ``parallel`` (:data:`PARALLEL`);
    ``shard_size``: GPUs per shard group under ``hsdp`` (``None``: one node); ``reduce_dtype`` and
    ``param_dtype``: what gradients are reduced in and parameters all-gathered in
    (:data:`DTYPE_BYTES`; defaults torchtitan's fp32 reduce, bf16 parameters); ``micro_batch``:
    sequences per accumulation step (``None``: the whole ``--batch-size``, one step);
    ``checkpointing``: activation checkpointing per block (its forward is recomputed in backward)."""

    parallel: str = "ddp"
    shard_size: int | None = None
    reduce_dtype: str = REDUCE_DTYPE
    param_dtype: str = PARAM_DTYPE
    micro_batch: int | None = None
    checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL:
            raise ValueError(f"unknown --parallel {self.parallel!r}; choose from {', '.join(PARALLEL)}")
        for name in ("reduce_dtype", "param_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise ValueError(f"unknown --{name.replace('_', '-')} {getattr(self, name)!r}; "
                                 f"choose from {', '.join(DTYPE_BYTES)}")
        if self.shard_size is not None:
            check_count(self.shard_size, "--shard-size")
            if self.parallel != "hsdp":
                raise ValueError("--shard-size applies to --parallel hsdp (GPUs per shard group)")
        if self.micro_batch is not None:
            check_count(self.micro_batch, "--micro-batch")

    @property
    def sharded(self) -> bool:
        """Whether the plan is this module's (anything but DDP)."""
        return self.parallel != "ddp"


@dataclass(frozen=True)
class Unit:
    """One FSDP unit: a transformer block (``root`` False) or the root (every parameter outside the
    blocks: embeddings, final norm, LM head); ``numel`` parameters of ``shapes``; compute per step (s)."""

    name: str
    numel: int
    forward_s: float
    backward_s: float
    root: bool
    shapes: tuple[tuple[int, ...], ...] = ()


def units(workload: Any) -> list[Unit]:
    """The FSDP units of ``workload``: the root first, then the blocks in parameter order. A
    layer's forward time is the workload's forward split as its backward (2x forward per layer,
    :func:`costs.compute.compute_from_flops`), by elements when backward is zero."""
    groups: dict[str, list[Any]] = {"root": []}
    for layer in workload.layers:
        found = _BLOCK.search(layer.name)
        groups.setdefault(f"block {found.group(1)}" if found else "root", []).append(layer)
    total_bwd = workload.backward_s
    total_numel = sum(layer.nbytes for layer in workload.layers)
    out = []
    for name, layers in groups.items():
        if not layers:
            continue
        bwd = sum(layer.backward_s for layer in layers)
        share = bwd / total_bwd if total_bwd > 0 else sum(layer.nbytes for layer in layers) / total_numel
        out.append(Unit(name, sum(layer.nbytes for layer in layers) // workload.itemsize, workload.forward_s * share,
                        bwd, name == "root",
                        tuple(layer.shape or (layer.nbytes // workload.itemsize,) for layer in layers)))
    return out


@dataclass(frozen=True)
class Group:
    """Ranks of one collective, as parallel groups on the two-level fabric: ``q`` GPUs of a node
    (local ranks ``o·q + j``, or ``o + stride·j`` when ``stride`` > 1) times ``k`` nodes (``node_stride``
    apart); ``share`` groups of a node send through its NIC at once."""

    q: int
    k: int
    stride: int = 1
    node_stride: int = 1
    share: int = 1

    @property
    def size(self) -> int:
        """Ranks in one group."""
        return self.q * self.k


def shard_group(size: int, gpus: int) -> Group:
    """The shard group of ``size`` GPUs (a divisor of a node's ``gpus`` or a multiple of it)."""
    if size <= gpus:
        return Group(size, 1, share=gpus // size)
    return Group(gpus, size // gpus)


def replicate_group(size: int, gpus: int, nodes: int) -> Group:
    """The replicate group of HSDP with shard groups of ``size`` GPUs: one rank of every shard group."""
    if size >= gpus:
        return Group(1, nodes * gpus // size, node_stride=size // gpus, share=gpus)
    return Group(gpus // size, nodes, stride=size, share=size)


def _ring_s(kind: str, nbytes: float, ranks: int, link: Level) -> float:
    """Closed form (s) of a ring ``kind`` over ``ranks`` of a ``nbytes`` buffer (the gathered
    output of an all-gather): :class:`simulator.topologies.Ring`'s."""
    if ranks <= 1:
        return 0.0
    block = nbytes / ranks if kind == "allgather" else nbytes
    return Ring(ranks).collective(kind, block, link).analytic_s


@functools.lru_cache(maxsize=4096)
def group_phase(kind: str, nbytes: float, group: Group, nodes: int, gpus: int, link: Level, intra: Level) -> Phase:
    """One ``kind`` collective of a ``nbytes`` buffer per group (the gathered output of an
    all-gather) on every group at once, hierarchically as :class:`simulator.topologies.Hierarchical`:
    a ring among a group's GPUs of a node (intra-node links), a ring among its nodes (the NIC
    carrying ``share`` groups' data), reduce-scatter intra then inter, all-gather inter then intra;
    the all-to-all (``alltoall``, ZeRO++'s two hops) a pairwise exchange among a group's GPUs of a
    node, then among its nodes of the 1/q each GPU summed."""
    q, k = group.q, group.k
    local = np.arange(gpus).reshape(-1, q) if group.stride == 1 else np.arange(gpus).reshape(q, -1).T
    intra_ranks = (np.arange(nodes)[:, None, None] * gpus + local[None]).ravel()
    node_ids = np.arange(nodes)
    inter_ranks = (node_ids.reshape(-1, k) if group.node_stride == 1 else node_ids.reshape(-1, k * group.node_stride)
                   .reshape(-1, k, group.node_stride).transpose(0, 2, 1).reshape(-1, k)).ravel()

    def intra_steps() -> plans.Plan:
        return plans.ring_steps(q, q - 1, 1.0 / q, "intra", intra_ranks) if q > 1 else plans.EMPTY

    def inter_steps(rounds: int) -> plans.Plan:
        return plans.ring_steps(k, rounds * (k - 1), group.share / k, "inter", inter_ranks) if k > 1 else plans.EMPTY

    intra_s = _ring_s("reduce_scatter", nbytes, q, intra)
    nic = group.share * nbytes
    if kind == "alltoall":
        plan = plans.pairwise_steps(q, 1.0 / q, "intra", intra_ranks) + plans.pairwise_steps(
            k, group.share / k, "inter", inter_ranks)
        seconds = _ring_s("alltoall", nbytes, q, intra) + _ring_s("alltoall", nic, k, link)
    elif kind == "allreduce":
        plan = intra_steps() + inter_steps(2) + intra_steps()
        seconds = 2 * intra_s + _ring_s("allreduce", nic, k, link)
    elif kind == "reduce_scatter":
        plan = intra_steps() + inter_steps(1)
        seconds = intra_s + _ring_s("reduce_scatter", nic, k, link)
    else:
        plan = inter_steps(1) + intra_steps()
        seconds = _ring_s("allgather", nic, k, link) + intra_s
    return Phase(plan, float(nbytes), None, seconds, link)


def sent_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """Bytes one GPU sends in a ring ``kind`` over ``ranks`` of a ``nbytes`` buffer (the gathered
    output of an all-gather): 2(p−1)/p·n for an all-reduce, (p−1)/p·n for the halves and for one
    hop of an all-to-all."""
    share = (ranks - 1) / ranks
    return (2 if kind == "allreduce" else 1) * share * nbytes


@dataclass
class Op:
    """One collective of the plan on ``stream``: released when compute task ``release[0]``
    starts (``"start"``) or ends (``"end"``), ``None`` at time 0 (or, after the optimizer, by it);
    ``pre_s``/``post_s`` compression and decompression on the stream around its ``phases``."""

    name: str
    collective: str
    stream: str
    phases: list[Phase]
    release: tuple[int, str] | None
    bytes_per_gpu: float
    per: str
    pre_s: float = 0.0
    post_s: float = 0.0
    compressed: bool = False

    @property
    def analytic_s(self) -> float:
        """The collective's closed-form length (s), compression included."""
        return self.pre_s + sum(ph.gap_s + ph.analytic_s for ph in self.phases) + self.post_s


@dataclass
class Task:
    """A compute task (s) that may start once the collectives ``needs`` (indices) have ended."""

    name: str
    kind: str
    seconds: float
    needs: list[int] = field(default_factory=list)


@dataclass
class Plan:
    """The compute tasks in stream order and the collectives in issue order; ``collective``:
    what the scenario's compressor replaces (or, for ``none``, would)."""

    scenario: Any
    tasks: list[Task]
    ops: list[Op]
    collective: str
    micro_batches: int
    units: int
    flat: Level
    intra: Level


def summed_in_flight(name: str) -> bool:
    """Whether compressor ``name``'s message is summed by the network as it travels: its card says
    it sends the whole vector in a narrower dtype carried by an all-reduce (the 16-bit casts), so it
    goes into a ring reduce-scatter as it is."""
    found = card(name)
    return found.message == "dense" and found.collective == ALLREDUCE


def block_quantized(name: str) -> bool:
    """Whether compressor ``name`` sends block-quantized codes and scales (its card's message): they
    differ from rank to rank, so they go into a reduce-scatter as ZeRO++'s qgZ sends them, a
    quantized all-to-all each rank dequantizes and sums (:func:`quantized_all_to_all`)."""
    return card(name).message == "quantized"


def element_bytes(name: str) -> float:
    """Bytes an element of compressor ``name``'s message takes on the wire (its declared wire bytes
    of a dense vector, per element)."""
    return wire_bytes(name, _PER_ELEMENT, 1.0) / _PER_ELEMENT


_PER_ELEMENT = 1 << 20
"""Elements of the vector :func:`element_bytes` prices (any large size: the casts' bytes are linear)."""


def refusal(parallel: str, compressor: str) -> str | None:
    """Why ``compressor`` cannot run under ``parallel``, ``None`` when it can (docs/model.md)."""
    if parallel in ("ddp", "hsdp") or compressor == "none" or summed_in_flight(compressor):
        return None
    if parallel == "fsdp":
        if block_quantized(compressor):
            return None
        return (f"{compressor} under --parallel fsdp: gradients are reduce-scattered, and a sparse or low-rank "
                "message cannot be summed shard by shard (only the fp16/bf16 casts, summed in flight, and the block "
                "quantizers, as ZeRO++'s quantized all-to-all, go into the reduce-scatter; use hsdp, where it "
                "replaces the replicate all-reduce)")
    return (f"{compressor} under --parallel {parallel}: DeepSpeed's ZeRO reduces gradients in its own bucketed "
            "reduce with no communication hook (1-bit Adam refuses ZeRO, DeepSpeed #5046; ZeRO++'s quantized "
            "gradients are stage 3's); only the fp16/bf16 casts apply")


def check(sc: Scenario) -> None:
    """Raise ValueError (one line) unless ``sc``'s sharding can be planned on its cluster."""
    sh = sc.sharding
    if sh is None or not sh.sharded:
        return
    if sc.topology not in ("ring", "hierarchical"):
        raise ValueError(f"--parallel {sh.parallel} needs reduce-scatter and all-gather: use --topology ring or "
                         f"hierarchical, not {sc.topology}")
    if sc.jitter or sc.stragglers or sc.interference:
        raise ValueError("--jitter, --stragglers and --interference are modelled under --parallel ddp only")
    if sc.sites > 1:
        raise ValueError(f"--sites {sc.sites} is modelled under --parallel ddp only: a sharded plan across a WAN "
                         f"(--parallel {sh.parallel}) is not")
    g, p = sc.gpus_per_node, sc.workers
    size = shard_size(sc)
    if not ((size <= g and g % size == 0) or (size % g == 0 and p % size == 0)):
        raise ValueError(f"--shard-size {size} must divide a node's {g} GPUs or be a multiple of them dividing "
                         f"the {p} GPUs")
    if sh.micro_batch is not None and sc.workload.batch_size % sh.micro_batch:
        raise ValueError(f"--micro-batch {sh.micro_batch} must divide --batch-size {sc.workload.batch_size}")
    reason = refusal(sh.parallel, sc.compressor)
    if reason is not None:
        raise ValueError(reason)


def shard_size(sc: Scenario) -> int:
    """GPUs a parameter is sharded over: all under fsdp/zero, ``shard_size`` (default a node) under hsdp."""
    sh = sc.sharding
    if sh.parallel == "hsdp":
        return sh.shard_size or sc.gpus_per_node
    return sc.workers


def micro_batches(sc: Scenario) -> int:
    """Accumulation steps of one optimizer step: ``--batch-size`` ÷ ``--micro-batch``."""
    sh = sc.sharding
    return 1 if sh.micro_batch is None else sc.workload.batch_size // sh.micro_batch


def _compressed(sc: Scenario, unit: Unit, shard: int, group: Group, make: Callable[..., Phase]
                ) -> tuple[list[Phase], float, float, float]:
    """The replicate exchange of one unit's gradient shard (``shard`` elements) by ``sc``'s
    sparsifier, block quantizer or PowerSGD: phases, compress and decompress seconds, bytes a GPU
    sends. The messages are all-gathered as the DDP hook gathers them: the counts first unless the
    message's size is known (:func:`compressors.messages.wire.counts_first`)."""
    cost = sc.profile.cost(sc.compressor, sc.density)
    r = group.size
    if sc.message == "lowrank":
        shapes = [(math.ceil(s[0] / shard_size(sc)), *s[1:]) for s in unit.shapes]
        blocks, rest, _ = lowrank_plan(shapes, sum(math.prod(s) for s in shapes), sc.rank, MIN_COMPRESSION_RATE)
        sizes = [sum(n for _, n in rest), sum(b.rows * b.rank for b in blocks), sum(b.cols * b.rank for b in blocks)]
        nbytes = [4.0 * n for n in sizes]
        middle = cost.compress_s(shard) / 2
        phases = [make("allreduce", n) for n in nbytes[:2] if n]
        q_phase = make("allreduce", nbytes[2])
        phases.append(Phase(q_phase.plan, q_phase.nbytes, None, q_phase.analytic_s, q_phase.link, gap_s=middle))
        return phases, middle, cost.decompress_s(shard), sum(sent_bytes("allreduce", n, r) for n in nbytes)
    wire = float(np.max(cost.wire_bytes(shard, r)))
    count = COUNT_BYTES if counts_first(sc.compressor) else 0
    phases = [make("allgather", count * r)] if count else []
    phases.append(make("allgather", wire * r))
    return phases, cost.compress_s(shard), r * cost.decompress_s(shard), sent_bytes("allgather", (wire + count) * r, r)


def quantized_all_to_all(cost: Any, numel: int, element: float, group: Group, make: Callable[..., Phase]
                         ) -> tuple[list[Phase], float, float, float]:
    """ZeRO++'s qgZ reduce-scatter of one unit's gradient (``numel`` elements, ``element`` bytes each
    on the wire: a block quantizer's codes and scales) on every ``group`` at once (Wang et al. 2023,
    arXiv 2306.10209, §3.3; DeepSpeed's ``all_to_all_quant_reduce``): quantize the gradient once; an
    all-to-all among the group's q GPUs of a node, each GPU dequantizing the q chunks it received,
    summing them and quantizing the sum (numel/q elements); an all-to-all of that among the group's
    k nodes, each GPU dequantizing the k chunks it received and summing them. A hop over one rank is
    left out. ``cost``: the compressor's cost (s per call of ``compress_s``/``decompress_s`` on a
    number of elements); ``make(kind, nbytes, group)``: a :class:`Phase` on the scenario's links.

    Returns the phases (the second after the first hop's dequantize, sum and quantize, its
    ``gap_s``), the seconds of quantizing before them and of dequantizing after, and the bytes a
    GPU sends, (q−1)/q·numel·element + (k−1)/k·numel/q·element = (p−1)/p·numel·element. No error
    feedback: qgZ keeps no residual."""
    across = Group(1, group.k, node_stride=group.node_stride, share=group.share * group.q)
    hops = [(r, n, g) for r, n, g in ((group.q, numel, replace(group, k=1)), (group.k, numel / group.q, across))
            if r > 1] or [(1, numel, group)]
    phases: list[Phase] = []
    sent = gap = 0.0
    for ranks, elements, hop in hops:
        phases.append(replace(make("alltoall", elements * element, hop), gap_s=gap))
        sent += sent_bytes("alltoall", elements * element, ranks)
        gap = ranks * cost.decompress_s(elements / ranks) + cost.compress_s(elements / ranks)
    ranks, elements, _ = hops[-1]
    return phases, cost.compress_s(numel), ranks * cost.decompress_s(elements / ranks), sent


def build(sc: Scenario) -> Plan:
    """The plan of one optimizer step of ``sc`` (docs/model.md, "Sharded data parallelism")."""
    sh = sc.sharding
    wl = sc.workload
    g, nodes, p = sc.gpus_per_node, sc.nodes, sc.workers
    size = shard_size(sc)
    intra = _levels(sc)[1]
    flat = {kind: _levels(sc, kind)[0] for kind in KINDS}
    shard_g = shard_group(size, g)
    repl_g = replicate_group(size, g, nodes) if sh.parallel == "hsdp" else None

    def make(kind: str, nbytes: float, group: Group = shard_g) -> Phase:
        link = flat[kind] if group.k == nodes else _levels(sc, kind, group.k)[0]
        return group_phase(kind, nbytes, group, nodes, g, link, intra)

    mb = micro_batches(sc)
    found = units(wl)
    blocks = [u for u in found if not u.root]
    root = [u for u in found if u.root]
    pb, rb = DTYPE_BYTES[sh.param_dtype], DTYPE_BYTES[sh.reduce_dtype]
    compressor = sc.compressor
    quant = summed_in_flight(compressor)
    qgz = block_quantized(compressor)
    grad_b = min(rb, element_bytes(compressor)) if quant else rb
    cost = sc.profile.cost(compressor, sc.density) if compressor != "none" else None
    sharded_params = sh.parallel in ("fsdp", "hsdp")
    tasks: list[Task] = []
    ops: list[Op] = []

    def op(name: str, label: str, stream: str, kind: str, nbytes: float, release: tuple[int, str] | None,
           per: str, group: Group = shard_g, pre: float = 0.0, post: float = 0.0, compressed: bool = False) -> int:
        ops.append(Op(name, label, stream, [make(kind, nbytes, group)], release,
                      sent_bytes(kind, nbytes, group.size), per, pre, post, compressed))
        return len(ops) - 1

    def reduce(unit: Unit, m: int, release: tuple[int, str], per: str, last: bool) -> None:
        """The gradient collectives of ``unit`` once its backward has produced it; HSDP's replicate
        all-reduce on the ``last`` micro-batch only (FSDP2's ``set_requires_all_reduce(False)`` before)."""
        quant_pre = cost.compress_s(unit.numel) if quant else 0.0
        quant_post = cost.decompress_s(unit.numel / size) if quant else 0.0
        if sh.parallel == "zero1":
            op(f"all-reduce {unit.name} m{m}", "all-reduce (gradients)", "reduce-scatter", "allreduce",
               unit.numel * grad_b, release, per, Group(g, nodes), quant_pre, quant_post, quant)
            return
        if qgz:
            phases, pre, post, sent = quantized_all_to_all(cost, unit.numel, element_bytes(compressor), shard_g, make)
            ops.append(Op(f"reduce-scatter {unit.name} m{m}", QUANTIZED_REDUCE_SCATTER, "reduce-scatter", phases,
                          release, sent, per, pre, post, True))
        else:
            op(f"reduce-scatter {unit.name} m{m}", "reduce-scatter (gradients)", "reduce-scatter", "reduce_scatter",
               unit.numel * grad_b, release, per, pre=quant_pre, post=0.0 if repl_g else quant_post, compressed=quant)
        if repl_g is None or repl_g.size <= 1 or not last:
            return
        shard = math.ceil(unit.numel / size)
        if compressor == "none" or quant:
            op(f"all-reduce {unit.name} m{m}", "all-reduce (replicate, gradient shard)", "all-reduce", "allreduce",
               shard * grad_b, release, "step", repl_g, post=quant_post, compressed=quant)
            return
        phases, pre, post, sent = _compressed(sc, unit, shard, repl_g, lambda kind, n: make(kind, n, repl_g))
        ops.append(Op(f"all-reduce {unit.name} m{m}", "all-reduce (replicate, gradient shard)", "all-reduce",
                      phases, release, sent, "step", pre, post, True))

    per = "micro-batch" if mb > 1 else "step"
    for m in range(mb):
        last = m == mb - 1
        before = (len(tasks) - 1, "end") if tasks else None
        gathered: dict[str, int] = {}
        if sharded_params:
            for i, unit in enumerate(root + blocks):
                first = i == 0 or (i == 1 and root)
                release = before if first else (len(tasks) + i - (2 if root else 1), "start")
                gathered[unit.name] = op(f"all-gather {unit.name} fwd m{m}", "all-gather (parameters)", "all-gather",
                                         "allgather", unit.numel * pb, release, per)
        for b, unit in enumerate(blocks):
            needs = [gathered[u.name] for u in ([unit] + (root if b == 0 else []))] if sharded_params else []
            tasks.append(Task(f"forward {unit.name} m{m}", "forward", unit.forward_s / mb, needs))
        for unit in root:
            needs = [gathered[unit.name]] if sharded_params else []
            tasks.append(Task(f"forward {unit.name} m{m}", "forward", unit.forward_s / mb, needs))
        order = list(reversed(blocks))
        regather: dict[str, int] = {}
        if sharded_params and order:
            regather[order[0].name] = op(f"all-gather {order[0].name} bwd m{m}", "all-gather (parameters)",
                                         "all-gather", "allgather", order[0].numel * pb,
                                         (len(tasks), "start") if root else (len(tasks) - 1, "end"), per)
        for unit in root:
            tasks.append(Task(f"backward {unit.name} m{m}", "backward", unit.backward_s / mb))
        reduce_per = "step" if sh.parallel == "zero1" else per
        for j, unit in enumerate(order):
            index = len(tasks)
            if sharded_params and j + 1 < len(order):
                nxt = order[j + 1]
                regather[nxt.name] = op(f"all-gather {nxt.name} bwd m{m}", "all-gather (parameters)", "all-gather",
                                        "allgather", nxt.numel * pb, (index, "start"), per)
            work = unit.backward_s + (unit.forward_s if sh.checkpointing else 0.0)
            tasks.append(Task(f"backward {unit.name} m{m}", "backward", work / mb,
                              [regather[unit.name]] if sharded_params else []))
            if sh.parallel != "zero1" or last:
                reduce(unit, m, (index, "end"), reduce_per, last)
        for unit in root:
            if sh.parallel != "zero1" or last:
                reduce(unit, m, (len(tasks) - 1, "end"), reduce_per, last)
    grads = [i for i, o in enumerate(ops) if o.stream != "all-gather"]
    shard_of = size if sh.parallel in ("fsdp", "hsdp") else p
    tasks.append(Task("optimizer", "optimizer", wl.optimizer_s / shard_of, grads))
    if sh.parallel in ("zero1", "zero2"):
        numel = sum(u.numel for u in found)
        op("all-gather parameters", "all-gather (updated parameters)", "all-gather", "allgather", numel * pb,
           (len(tasks) - 1, "end"), "step", Group(g, nodes))
    label = collective_label(sh.parallel, compressor)
    return Plan(sc, tasks, ops, label, mb, len(found), flat["allreduce"], intra)


def collective_label(parallel: str, compressor: str) -> str:
    """The collective ``compressor`` replaces under ``parallel`` (for ``none``: the one it would), a key
    of :func:`summarize`'s ``collectives``; a quantizer under HSDP also goes into the reduce-scatter
    (that entry's ``compressed``; a block quantizer's is :data:`QUANTIZED_REDUCE_SCATTER`)."""
    if parallel == "ddp":
        return "all-reduce (DDP gradient buckets)"
    if parallel == "hsdp":
        return "all-reduce (replicate, gradient shard)"
    if parallel == "zero1":
        return "all-reduce (gradients)"
    if block_quantized(compressor):
        return QUANTIZED_REDUCE_SCATTER
    return "reduce-scatter (gradients)"


@dataclass
class Times:
    """When each task and collective started and ended (s)."""

    task_start: np.ndarray
    task_end: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray


def _key(o: Op) -> tuple[int, int]:
    """When ``o`` is released, as (task, 0 at its start | 1 at its end); (-1, 1) at time 0."""
    return (-1, 1) if o.release is None else (o.release[0], 0 if o.release[1] == "start" else 1)


def run_analytic(plan: Plan) -> Times:
    """Time ``plan`` with every collective's closed form: a task starts when the previous one and
    the collectives it needs have ended; a collective when released and the one before it on its
    stream has ended. One sweep: :func:`build` issues the collectives in the order of their release."""
    n_t, n_o = len(plan.tasks), len(plan.ops)
    ts, te = np.zeros(n_t), np.zeros(n_t)
    os_, oe = np.zeros(n_o), np.zeros(n_o)
    free = dict.fromkeys(STREAMS, 0.0)
    j = 0

    def issue(until: tuple[int, int]) -> int:
        nonlocal j
        while j < n_o and _key(plan.ops[j]) <= until:
            o = plan.ops[j]
            released = 0.0 if o.release is None else (ts if o.release[1] == "start" else te)[o.release[0]]
            os_[j] = max(released, free[o.stream])
            oe[j] = free[o.stream] = os_[j] + o.analytic_s
            j += 1
        return j

    for i, task in enumerate(plan.tasks):
        issued = issue((i - 1, 1))
        if any(n >= issued for n in task.needs):
            raise RuntimeError(f"the sharded plan's task {task.name} waits for a collective it releases")
        ts[i] = max([te[i - 1] if i else 0.0, *(oe[n] for n in task.needs)])
        te[i] = ts[i] + task.seconds
        issue((i, 0))
    issue((n_t, 1))
    return Times(ts, te, os_, oe)


def run_des(plan: Plan) -> Times:
    """Run ``plan`` in SimPy: the compute stream and each communication stream a process; every
    collective's step program runs as link-level messages on one :class:`~simulator.links.Fabric`
    shared by all streams (busy-until links), compression around it on its stream."""
    sc = plan.scenario
    env = simpy.Environment()
    n_t, n_o = len(plan.tasks), len(plan.ops)
    ts, te, os_, oe = np.zeros(n_t), np.zeros(n_t), np.zeros(n_o), np.zeros(n_o)
    started = [env.event() for _ in range(n_t)]
    ended = [env.event() for _ in range(n_t)]
    finished = [env.event() for _ in range(n_o)]
    fabric = Fabric(sc.workers, plan.flat, gpus=sc.gpus_per_node, intra=plan.intra)

    def compute():
        for i, task in enumerate(plan.tasks):
            if task.needs:
                yield simpy.AllOf(env, [finished[n] for n in task.needs])
            ts[i] = env.now
            started[i].succeed()
            yield env.timeout(task.seconds)
            te[i] = env.now
            ended[i].succeed()

    def stream(name: str):
        for j, o in enumerate(plan.ops):
            if o.stream != name:
                continue
            if o.release is not None:
                index, edge = o.release
                yield (started if edge == "start" else ended)[index]
            os_[j] = env.now
            yield env.timeout(o.pre_s)
            for phase in o.phases:
                if phase.gap_s:
                    yield env.timeout(phase.gap_s)
                entry = np.full(sc.workers, env.now)
                finish = fabric.run(phase.plan, phase.nbytes, entry, phase.sizes, link=phase.link)
                yield env.timeout(max(float(finish.max()) - env.now, 0.0))
            yield env.timeout(o.post_s)
            oe[j] = env.now
            finished[j].succeed()

    env.process(compute())
    for name in STREAMS:
        env.process(stream(name))
    env.run()
    return Times(ts, te, os_, oe)


def _busy(starts: np.ndarray, ends: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Compute time (s) elapsed before each ``t`` on the compute stream (tasks sorted, disjoint)."""
    lengths = np.concatenate([[0.0], np.cumsum(ends - starts)])

    def before(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ends, t, side="right")
        inside = np.clip(t - starts[np.minimum(k, len(starts) - 1)], 0.0, None)
        inside = np.where(k < len(starts), np.minimum(inside, (ends - starts)[np.minimum(k, len(starts) - 1)]), 0.0)
        return lengths[k] + inside

    return before


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint ``(starts, ends)``."""
    order = np.argsort(starts, kind="stable")
    out_s: list[float] = []
    out_e: list[float] = []
    for a, b in zip(starts[order], ends[order]):
        if out_e and a <= out_e[-1]:
            out_e[-1] = max(out_e[-1], b)
        else:
            out_s.append(float(a))
            out_e.append(float(b))
    return np.array(out_s), np.array(out_e)


def summarize(plan: Plan, times: Times) -> dict[str, Any]:
    """The output fields of one step (those of :func:`simulator.iteration.summarize`; compression
    on the communication streams: ``compress_total_s`` counts what runs before a collective and
    between its phases, PowerSGD's orthogonalisation, qgZ's dequantize, sum and quantize between its
    hops; ``decompress_total_s`` what runs after) plus
    ``parallel``, ``micro_batches``, ``collective`` (what the compressor replaces) and
    ``collectives``: per collective name, its ``kind`` of stream, ``per`` (micro-batch or step),
    ``count``, ``bytes_per_gpu`` (sent per step), ``total_s`` and ``exposed_s`` (not hidden behind
    compute; two streams exposed at once are each counted) per step, ``compressed``."""
    sc = plan.scenario
    busy = _busy(times.task_start, times.task_end)
    iteration = float(max(times.task_end.max(), times.op_end.max() if len(plan.ops) else 0.0))
    op_len = times.op_end - times.op_start
    exposed_each = op_len - (busy(times.op_end) - busy(times.op_start)) if len(plan.ops) else op_len
    u_s, u_e = _union(times.op_start, times.op_end) if len(plan.ops) else (np.zeros(0), np.zeros(0))
    exposed = float(((u_e - u_s) - (busy(u_e) - busy(u_s))).sum()) if len(u_s) else 0.0
    kinds = {k: sum(t.seconds for t in plan.tasks if t.kind == k) for k in ("forward", "backward", "optimizer")}
    collectives: dict[str, dict[str, Any]] = {}
    for o, length, hidden_not in zip(plan.ops, op_len, exposed_each):
        row = collectives.setdefault(o.collective, {"stream": o.stream, "per": o.per, "count": 0,
                                                    "bytes_per_gpu": 0.0, "total_s": 0.0, "exposed_s": 0.0,
                                                    "compressed": o.compressed})
        row["count"] += 1
        row["bytes_per_gpu"] += o.bytes_per_gpu
        row["total_s"] += float(length)
        row["exposed_s"] += max(float(hidden_not), 0.0)
    wire = sum(o.bytes_per_gpu for o in plan.ops)
    compute = kinds["forward"] + kinds["backward"] + kinds["optimizer"]
    idle = iteration - compute - exposed
    return {
        "iteration_s": iteration,
        "samples_per_s": sc.workload.batch_size * sc.workers / iteration if iteration > 0 else float("inf"),
        "forward_s": kinds["forward"],
        "backward_s": kinds["backward"],
        "compress_s": 0.0,
        "exposed_comm_s": exposed,
        "idle_s": idle if idle > 1e-9 * iteration else 0.0,
        "optimizer_s": kinds["optimizer"],
        "comm_s": float(op_len.sum()),
        "compress_total_s": sum(o.pre_s + sum(ph.gap_s for ph in o.phases) for o in plan.ops),
        "decompress_total_s": sum(o.post_s for o in plan.ops),
        "wire_bytes": float(wire),
        "dense_bytes": float(sc.workload.nbytes),
        "buckets": plan.units,
        "workers": int(sc.workers),
        "parallel": sc.sharding.parallel,
        "shard_size": shard_size(sc),
        "micro_batches": plan.micro_batches,
        "collective": plan.collective,
        "collectives": collectives,
    }


def events(plan: Plan, times: Times) -> list[dict[str, Any]]:
    """The step as timeline events (:mod:`simulator.timeline`) of worker 0 (every worker runs the
    same plan): compute tasks on ``compute``, every collective on ``comm`` by name."""
    out = []
    for task, a, b in zip(plan.tasks, times.task_start, times.task_end):
        if b > a:
            out.append({"worker": 0, "stream": "compute", "name": task.name, "start_s": float(a), "end_s": float(b)})
    for o, a, b in zip(plan.ops, times.op_start, times.op_end):
        if b > a:
            out.append({"worker": 0, "stream": "comm", "name": o.name, "start_s": float(a), "end_s": float(b)})
    return out


def iteration(sc: Scenario) -> dict[str, Any]:
    """The output fields of one optimizer step of ``sc`` under its sharding (:func:`summarize`),
    with ``timeline`` (:func:`events`) when ``sc.timeline``."""
    plan = build(sc)
    times = run_des(plan) if sc.fidelity == "des" else run_analytic(plan)
    result = summarize(plan, times)
    if sc.timeline:
        result["timeline"] = events(plan, times)
    return result


def working_numel(workload: Any) -> tuple[int, int]:
    """Parameters FSDP holds gathered at once (the root, never resharded between forward and
    backward, and the largest block twice: the one computing and the one prefetched) and gradients
    unsharded at once (the root's and one block's, before their reduce-scatter), in elements, for
    :func:`costs.memory.sharded_state_bytes`."""
    found = units(workload)
    root = sum(u.numel for u in found if u.root)
    block = max((u.numel for u in found if not u.root), default=0)
    return root + 2 * block, root + block
