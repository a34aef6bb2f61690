"""What to measure: the unmeasured input whose band decides the order of the winner and the runner-up.

A projection rests on inputs nobody measured on the user's cluster: single-GPU compute (the rule
fitted to published throughput, :mod:`costs.throughput`, unless ``--samples-per-s`` anchors
it), each compressor's kernel costs (the cost model, :mod:`costs.kernel_bands`, unless a
``--profile`` or a replay measured them) and the links' efficiency (the share of the nominal
bandwidth a collective reaches: 1 unless a calibration is applied). :func:`settle` takes the two
fastest configurations of a comparison and moves each input, alone, from its point to each end
of its band (compute and link efficiency move both rows, a kernel cost only its compressor's),
re-projecting both at the analytic fidelity (scaled to the points projected, as
:func:`simulator.band.band` does). An input *flips* the order when at one end the runner-up is
projected faster; the one that flips it with the smallest move (the share of its band's reach,
in logarithms) is named, with the value where the order flips and the one command that
measures it on the user's GPU or cluster. When no input flips the order, the one that comes
closest is named. Units: seconds; factors are dimensionless.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import simulator
import traces.layouts
from pipeline import project as projection
from pipeline.request import sharding_flags
from pipeline.verdict import rank
from results.store import Store
from simulator.band import scaled_costs
from simulator.calibration import Calibration
from simulator.simulate import iteration as simulate_alone
from simulator.workload import scaled
from units import Pair, format_bandwidth, format_seconds

LINK_EFFICIENCY = (0.69, 1.0)
"""Band of the links' efficiency when no calibration is applied: from the lowest efficiency the
testbed's calibration measured for one collective on shaped links (0.69, the two-rank
all-gather; 0.844 pooled over every operation, BENCHMARKS.md "Calibration") to the nominal rate
an uncalibrated projection assumes (1)."""

BISECTIONS = 14
"""Halvings of the interval (in logarithms) that locate where an input flips the order: 2⁻¹⁴ of the band's reach."""


@dataclass(frozen=True)
class Input:
    """One unmeasured input: ``key`` (``compute``, ``kernel:<label>``, ``link efficiency``),
    ``name`` in words, its ``band`` ``(low, high)`` around the point ``1`` (for link efficiency
    the efficiency itself, point 1), ``moves`` which configurations (labels; ``None``: all) and
    ``apply`` (a scenario with the input at a value)."""

    key: str
    name: str
    band: tuple[float, float]
    moves: tuple[str, ...] | None
    apply: Callable[[simulator.Scenario, float], simulator.Scenario]


def _analytic(scenario: simulator.Scenario) -> float:
    return float(simulate_alone(replace(scenario, fidelity="analytic", timeline=False))["iteration_s"])


def _scenario(store: Store, projected: projection.Projection, row: Mapping[str, Any]) -> simulator.Scenario:
    density = row.get("density")
    (scenario,) = projection.scenarios(store, projected, [row["compressor"]], 1.0 if density is None else density)
    return scenario


def inputs(source: projection.Source, rows: Sequence[Mapping[str, Any]],
           calibrated: bool) -> list[Input]:
    """The unmeasured inputs of two projected ``rows`` (results of :func:`pipeline.project.project`)
    on ``source``: compute when it was not measured (``--samples-per-s``) or given
    (``--device-flops``) and its band is not a point, each compressor's kernel cost when it was
    modelled (a measured one has only its spread), the links' efficiency unless ``calibrated``."""
    found = []
    measured = source.compute_from in ("measured", "profiled", "given")
    if not measured and (source.compute_low, source.compute_high) != (1.0, 1.0):
        found.append(Input("compute", "single-GPU compute", (source.compute_low, source.compute_high), None,
                           lambda sc, f: replace(sc, workload=scaled(sc.workload, f))))
    for row in rows:
        cost = row.get("cost_source") or ""
        if row["compressor"] == "none" or not cost.startswith("model "):
            continue
        name = Pair(row["compressor"], row.get("density")).label
        found.append(Input(f"kernel:{name}", f"the kernel cost of {name}", tuple(row["cost_band"]), (name,),
                           lambda sc, f: replace(sc, profile=scaled_costs(sc.profile, f))))
    if not calibrated:
        found.append(Input("link efficiency", "the links' efficiency", LINK_EFFICIENCY, None,
                           lambda sc, e: replace(sc, calibration=Calibration(0.0, 0.0, e))))
    return found


def _gap(item: Input, value: float, pair: Sequence[tuple[str, simulator.Scenario, float]]) -> float:
    """Runner-up ÷ winner iteration time with ``item`` at ``value`` (> 1: the winner still leads)."""
    times = []
    for name, scenario, point in pair:
        moved = item.moves is None or name in item.moves
        base = _analytic(scenario)
        times.append(point * (_analytic(item.apply(scenario, value)) / base if moved and base > 0 else 1.0))
    return times[1] / times[0]


def _flip_point(item: Input, end: float, pair: Sequence[tuple[str, simulator.Scenario, float]]) -> float:
    """The value between the point (1) and ``end`` where the two configurations tie (bisection in logarithms)."""
    lo, hi = 0.0, math.log(end)
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if _gap(item, math.exp(mid), pair) > 1.0:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def command(item: Input, projected: projection.Projection, rows: Sequence[Mapping[str, Any]],
            value: float | None) -> str:
    """The one command that measures ``item`` on the user's hardware: ``sidco profile --run-on
    cuda`` for a kernel cost (its ``--out`` file then goes to ``--profile``), ``sidco profile
    --model`` for a model's compute (its ``--out`` file then goes to ``--step-profile``), the
    comparison re-run with the measured single-GPU throughput as ``--samples-per-s`` for a
    layout's compute (``MEASURED``
    stands for it; ``value`` the compute factor where the order flips), ``sidco calibrate`` for
    the links' efficiency."""
    source = projected.source
    if item.key.startswith("kernel:"):
        row = next(r for r in rows if Pair(r["compressor"], r.get("density")).label == item.key.split(":", 1)[1])
        densities = "" if row.get("density") is None else f" --densities {row['density']:g}"
        return (f"sidco profile --run-on cuda --compressors {row['compressor']}{densities} "
                f"--out {source.device.name}-profile.json")
    if item.key == "compute":
        if source.kind != "layout":
            return "sidco capture --run-on cuda (a trace captured on the GPU keeps its own timings)"
        if projected.request.model is not None:
            tokens = f" --tokens {source.tokens}" if source.tokens is not None else ""
            return (f"sidco profile --model {source.ref} --run-on cuda --batch-size {source.batch_size}{tokens} "
                    f"--precision {source.precision} --out step.json (then this comparison with --step-profile "
                    "step.json)")
        c = projected.cluster
        options = {"tokens": projected.request.tokens, "gpus_per_node": c.options.get("gpus_per_node", 1),
                   "bucket_mode": c.options.get("bucket_mode", "ddp")}
        extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in options.items()
                        if v is not None and v not in (1, "ddp"))
        extra += sharding_flags(c.options.get("sharding"))
        names = ",".join(dict.fromkeys(r["compressor"] for r in rows))
        densities = ",".join(dict.fromkeys(f"{r['density']:g}" for r in rows if r.get("density") is not None))
        if c.options.get("sites", 1) > 1:
            extra += (f" --sites {c.options['sites']} --wan-bandwidth "
                      f"{format_bandwidth(c.options['wan_bandwidth_bps']).replace(' ', '')} --wan-rtt "
                      f"{format_seconds(c.options['wan_rtt_s']).replace(' ', '').replace('µs', 'us')}")
        return (f"sidco compare {traces.layouts.flag(source.ref)} --device {source.device.name} --precision {source.precision} "
                f"--batch-size {source.batch_size}{extra} --nodes {c.nodes} "
                f"--bandwidth {format_bandwidth(c.bandwidth_bps).replace(' ', '')} "
                f"--latency {format_seconds(c.latency_s).replace(' ', '').replace('µs', 'us')} --topology {c.topology} "
                f"--compressors {names}" + (f" --densities {densities}" if densities else "") +
                " --samples-per-s MEASURED")
    return "sidco calibrate (after sidco emulate; then --calibration latest)"


def _samples_per_s(source: projection.Source, factor: float) -> float | None:
    """The single-GPU throughput (samples/s) at which compute time is ``factor`` × the projected one."""
    if source.kind != "layout":
        return None
    workload = projection.workload(source)
    compute_s = workload.forward_s + sum(layer.backward_s for layer in workload.layers)
    return workload.batch_size / (factor * compute_s + workload.optimizer_s)


def settle(store: Store, projected: projection.Projection, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Which unmeasured input decides the order of the two fastest of ``rows`` (results of
    :func:`pipeline.project.project` of ``projected``; the module docstring):
    ``input`` (its key), ``name``, ``band``, ``flips`` (whether an end of its band puts the
    runner-up first), ``flips_at`` (the value where the two tie; ``None`` when it does not
    flip), ``ratio_at_end`` (runner-up ÷ winner iteration time at the band's end that narrows
    the gap most), ``command`` (the one command that measures it), ``winner``, ``runner_up``
    and, for compute, ``flips_at_samples_per_s``. ``None`` with fewer than two rows."""
    ranked = rank(rows)
    if len(ranked) < 2:
        return None
    pair_rows = ranked[:2]
    source = projected.source
    pair = [(r["label"], _scenario(store, projected, r), float(r["iteration_s"])) for r in pair_rows]
    calibrated = pair[0][1].calibration is not None
    best = None
    for item in inputs(source, pair_rows, calibrated):
        ends = [(end, _gap(item, end, pair)) for end in item.band if end != 1.0]
        if not ends:
            continue
        end, gap = min(ends, key=lambda e: e[1])
        flips = gap < 1.0
        at = _flip_point(item, end, pair) if flips else None
        reach = abs(math.log(at)) / abs(math.log(end)) if flips else math.inf
        rank_key = (0, reach) if flips else (1, gap)
        if best is None or rank_key < best[0]:
            best = (rank_key, item, end, gap, at)
    if best is None:
        return None
    _, item, end, gap, at = best
    found = {"input": item.key, "name": item.name, "band": list(item.band), "flips": at is not None,
             "flips_at": at, "ratio_at_end": gap, "end": end, "winner": pair_rows[0]["label"],
             "runner_up": pair_rows[1]["label"], "command": command(item, projected, pair_rows, at)}
    if item.key == "compute":
        found["flips_at_samples_per_s"] = None if at is None else _samples_per_s(source, at)
        found["projected_samples_per_s"] = _samples_per_s(source, 1.0)
    return found
