"""The sharded simulator's projection (:mod:`simulator.sharded`) of an emulated FSDP2 / HSDP run.

- Workload: the scaled-down model's tensors (:func:`traces.llm.tensors`, fp32), its forward and
  backward the medians over every rank's compute-only passes of the run (s), the backward split over
  the tensors by their forward FLOPs (a tensor's backward is twice its forward, so its share of the
  forward's FLOPs is its share of the backward), the optimizer the run's measured sharded step
  times the shard group's size (the model divides it by the shard group again).
- Cluster: one rank a node (``gpus_per_node`` 1), ``workers`` nodes on links of the emulated rate,
  no added latency (no netem), a ring; FSDP2 without a mixed-precision policy (fp32 parameters and
  reductions); HSDP's shard groups of ``shard`` ranks.
- Backend: gloo runs ``reduce_scatter_tensor`` as an all-reduce of the whole buffer
  (:mod:`emulation.fsdp_plan`), so :func:`gloo_calibration` prices the plan's reduce-scatters as
  that all-reduce: a ring reduce-scatter of ``(p−1)`` steps of ``n/p`` bytes with twice the α and
  half the bandwidth takes exactly the ring all-reduce's ``2(p−1)`` steps. The plan and its bytes
  stay FSDP2's; only the time of the reduce-scatter is gloo's. With a calibration (``sidco
  calibrate``) the all-reduce and all-gather fits apply as in the DDP projection.

- Overlap: FSDP2 overlaps its collectives with compute through CUDA streams; on CPU there are none,
  and FSDP2 calls gloo's reduce-scatter, HSDP's all-reduce and (without prefetch, the default
  ``unshard(async_op=False)``) the all-gathers synchronously, so every collective blocks the
  rank (torch 2.13, ``_fsdp_collectives.foreach_reduce``). :func:`project` gives the sharded
  model's step (streams overlapping, as on GPUs) and ``serial_s``: the same plan's compute tasks,
  collectives' closed forms and FSDP2's host work end to end, what the CPU ranks do.
- Host work (:class:`Host`, :func:`host_s`): around each all-gather and reduce-scatter FSDP2 runs
  Python hooks, per-parameter bookkeeping and a collective's dispatch (a fixed cost per
  collective, ``fixed_s``) and copies (torch 2.13 ``_fsdp_collectives``, fp32 without a
  mixed-precision policy; :func:`copy_bytes`): an all-gather of a gathered buffer of ``n`` bytes
  copies the rank's shard in (``foreach_all_gather``'s copy-in, ``n/S``) and the gathered buffer
  out into the unsharded parameters (``split_with_sizes_copy``, ``n``); a reduce-scatter of ``n``
  copies the unsharded gradients into its input (``chunk_cat``, ``n``; gloo's copies inside the
  collective are the collective's); HSDP's all-reduce runs in place on the reduced shard. Both
  coefficients are measured in the run (:mod:`emulation.fsdp_worker`), as the compute is: the
  copy bandwidth ``copy_bps`` is the median of every rank's copy passes; the one-rank FSDP2 pass
  issues the same units' all-gathers and reductions with ``S = 1`` (an all-gather copies ``2n``,
  a reduction ``2n``: ``chunk_cat`` and, with no collective, the input into the output), so
  ``fixed_s`` is its time beyond the compute-only pass (the median over every rank's paired
  passes) less its copies at ``copy_bps``, per collective. ``host_s`` = Σ over the plan's
  all-gathers and reduce-scatters of ``fixed_s`` + copied bytes ÷ ``copy_bps``. HSDP's all-reduce
  adds one dispatch inside the reduction, not priced. The GPU model (:mod:`simulator.sharded`)
  does not price this term: on a GPU the fixed cost is CPU time that runs ahead of the kernels,
  the copy-in runs on its own stream, and under a mixed-precision policy the copies cast (a
  bf16 all-gather input copied from fp32 shards, bf16 gradients into an fp32 reduce-scatter
  input, the reduced shard back), so their bytes are not this fp32 formula's and the CPU runs
  cannot check them (docs/usage.md, "Sharded training").

:func:`collective_buffers` gives the model's per-collective buffers (bytes per step) for the
comparison with the flight recorder's.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import simulator
import traces.llm
from emulation.fsdp_plan import GRADIENTS, PARAMETERS
from simulator.calibration import OpFit
from simulator.sharded import Op, Sharding, build, shard_size

LINK_LATENCY_S = 0.0  # the emulated links add no delay (no netem)


def workload(config: traces.llm.Config, tokens: int, batch_size: int,
             rank_passes: Sequence[Sequence[Mapping[str, float]]], optimizer_s: float, shard: int) -> simulator.Workload:
    """The simulator's workload of the scaled-down model (module docstring); ``rank_passes[r][k]``:
    rank ``r``'s ``forward_s``/``backward_s`` of compute-only pass ``k`` (s); ``optimizer_s``: the
    measured sharded optimizer step (s)."""
    rows = traces.llm.tensors(config, tokens)
    passes = [q for rank in rank_passes for q in rank]
    forward = statistics.median(float(q["forward_s"]) for q in passes) if passes else 0.0
    backward = statistics.median(float(q["backward_s"]) for q in passes) if passes else 0.0
    flops = sum(r["forward_flops"] for r in rows)
    layers = tuple(simulator.Layer(r["name"], r["numel"] * 4, backward * r["forward_flops"] / flops, tuple(r["shape"]))
                   for r in rows)
    return simulator.Workload(layers, forward, optimizer_s * shard, batch_size, itemsize=4, name="fsdp-emulation")


def gloo_calibration(calibration: simulator.Calibration | None) -> simulator.Calibration:
    """``calibration`` (``None``: the nominal link, α 0, efficiency 1) with a ``reduce_scatter`` fit
    (and one per worker count the all-reduce has) of twice the all-reduce's α and half its
    efficiency: gloo's reduce-scatter is an all-reduce (module docstring)."""
    base = calibration or simulator.Calibration(0.0, 0.0, 1.0)
    ops = dict(base.ops)
    counts = [key.split("@", 1)[1] for key in base.ops if key.startswith("allreduce@")]
    for suffix in ["", *(f"@{n}" for n in counts)]:
        fit = base.ops.get(f"allreduce{suffix}") or base.fit_for("allreduce")
        ops[f"reduce_scatter{suffix}"] = OpFit(2 * fit.alpha_s, fit.efficiency / 2, fit.fit_error_pct, fit.points)
    return dataclasses.replace(base, ops=ops)


def scenario(wl: simulator.Workload, parallel: str, workers: int, shard: int, bandwidth_bps: float, *,
             calibration: simulator.Calibration | None = None, fidelity: str = "analytic") -> simulator.Scenario:
    """The scenario of an emulated run (module docstring); ``calibration`` goes through
    :func:`gloo_calibration`."""
    sharding = Sharding(parallel, shard_size=shard if parallel == "hsdp" else None, reduce_dtype="fp32",
                        param_dtype="fp32")
    return simulator.Scenario(wl, workers, bandwidth_bps, LINK_LATENCY_S, topology="ring", gpus_per_node=1,
                              calibration=gloo_calibration(calibration), fidelity=fidelity, sharding=sharding)


def collective_buffers(sc: simulator.Scenario) -> dict[str, list[float]]:
    """Per collective label of the sharded plan, the buffer of each of its collectives in one step
    (bytes; an all-gather's gathered output), in plan order."""
    out: dict[str, list[float]] = {}
    for op in build(sc).ops:
        out.setdefault(op.collective, []).extend(phase.nbytes for phase in op.phases)
    return out


@dataclasses.dataclass(frozen=True)
class Host:
    """FSDP2's host work per collective, measured in the run (module docstring): ``fixed_s`` (s per
    all-gather or reduce-scatter) and ``copy_bps`` (bytes copied per second)."""

    fixed_s: float
    copy_bps: float


def copy_bytes(op: Op, shard: int) -> float:
    """Bytes FSDP2 copies on a rank around ``op`` of the sharded plan over a shard group of
    ``shard`` ranks (module docstring): an all-gather of ``n``, ``n/shard + n``; a reduce-scatter,
    ``n`` (``2n`` when ``shard`` is 1); anything else, 0."""
    n = sum(phase.nbytes for phase in op.phases)
    if op.collective == PARAMETERS:
        return n / shard + n
    if op.collective == GRADIENTS:
        return n if shard > 1 else 2 * n
    return 0.0


def _hosted(sc: simulator.Scenario) -> list[Op]:
    """The collectives of ``sc``'s plan FSDP2 runs its hooks and copies around."""
    return [op for op in build(sc).ops if op.collective in (PARAMETERS, GRADIENTS)]


def host(sc: simulator.Scenario, rank_compute: Sequence[Sequence[Mapping[str, float]]],
         rank_host: Sequence[Sequence[Mapping[str, float]]],
         rank_copy: Sequence[Sequence[Mapping[str, float]]]) -> Host:
    """:class:`Host` of the run projected by ``sc`` from every rank's compute-only, one-rank FSDP2
    and copy passes (``forward_s``/``backward_s``, s; ``bytes``/``seconds``), the ``k``-th of each
    taken after the same step (module docstring). ``fixed_s`` is at least 0."""
    extra = [h["forward_s"] + h["backward_s"] - c["forward_s"] - c["backward_s"]
             for computes, hosts in zip(rank_compute, rank_host) for c, h in zip(computes, hosts)]
    copy_bps = statistics.median(q["bytes"] / q["seconds"] for rank in rank_copy for q in rank)
    ops = _hosted(sc)
    alone = sum(copy_bytes(op, 1) for op in ops) / copy_bps
    return Host(max(0.0, (statistics.median(extra) - alone) / len(ops)), copy_bps)


def host_s(sc: simulator.Scenario, costs: Host) -> float:
    """FSDP2's host work in one step of ``sc`` (s): per all-gather and reduce-scatter of the plan,
    ``costs.fixed_s`` and its :func:`copy_bytes` at ``costs.copy_bps``."""
    shard = shard_size(sc)
    return sum(costs.fixed_s + copy_bytes(op, shard) / costs.copy_bps for op in _hosted(sc))


def serial_s(sc: simulator.Scenario, costs: Host | None = None) -> float:
    """The step of ``sc`` with nothing overlapped (s): every compute task of the sharded plan plus
    every collective's closed form (compression included) plus, given ``costs``, FSDP2's host work
    (:func:`host_s`), one after another."""
    plan = build(sc)
    hosted = host_s(sc, costs) if costs is not None else 0.0
    return sum(task.seconds for task in plan.tasks) + sum(op.analytic_s for op in plan.ops) + hosted


def project(sc: simulator.Scenario, costs: Host | None = None) -> dict[str, Any]:
    """The projected step of ``sc`` (:func:`simulator.simulate`'s fields, ``collectives`` included)
    with ``serial_s`` (:func:`serial_s`) and ``host_s`` (:func:`host_s`, 0 without ``costs``)."""
    return {**simulator.simulate(sc), "serial_s": serial_s(sc, costs),
            "host_s": host_s(sc, costs) if costs is not None else 0.0}
