"""The error band of a projection: the same scenario re-run with its inputs at the ends of their measured error.

A projection rests on inputs whose error is measured elsewhere: compute (the rule fitted to
published training throughput, :mod:`costs.throughput`, or the trace's own timings) and
compression costs (the cost model checked against shipped profiles, or a measured profile's
spread, :func:`pipeline.costs.cost_band`). :func:`band` re-runs the scenario with every compute
time and every compression time at each end of those errors and reports the range of the
iteration time and of the speed-up. Units: seconds; factors are dimensionless.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from costs import CompressionCost, CompressionProfile
from simulator.scenario import Scenario
from simulator.simulate import iteration as simulate_alone
from simulator.workload import scaled

BAND_KEYS = ("iteration_s_low", "iteration_s_high", "speedup_low", "speedup_high")


def scaled_costs(profile: CompressionProfile, factor: float) -> CompressionProfile:
    """``profile`` with every compress and decompress time × ``factor`` (wire bytes kept)."""
    costs = {key: CompressionCost(c.compress_fixed_s * factor, c.compress_per_element_s * factor,
                                  c.decompress_fixed_s * factor, c.decompress_per_element_s * factor,
                                  c.wire_per_element, c.source) for key, c in profile.costs.items()}
    return CompressionProfile(costs, profile.source)


def band(scenario: Scenario, result: Mapping[str, Any], compute: tuple[float, float],
         costs: tuple[float, float]) -> dict[str, float]:
    """The error band of one projection: ``iteration_s_low``/``iteration_s_high`` and
    ``speedup_low``/``speedup_high``, the projection re-run with every compute time × each end
    of ``compute`` and every compression time × each end of ``costs`` (factors ``(low, high)``
    spanning the inputs' measured error: :func:`costs.throughput.compute`,
    :func:`pipeline.costs.cost_band`). Compute moves the baseline and the compressed iteration
    together (one device), costs only the compressed one. The corners run at the analytic
    fidelity and scale the point estimate (a DES point keeps its queueing detail); each band
    contains its point. All ones: the band is the point."""
    point_s, point_speedup = float(result["iteration_s"]), float(result["speedup"])
    if compute == (1.0, 1.0) and costs == (1.0, 1.0):
        return {"iteration_s_low": point_s, "iteration_s_high": point_s,
                "speedup_low": point_speedup, "speedup_high": point_speedup}
    quick = replace(scenario, fidelity="analytic", timeline=False)

    def seconds(c: float, k: float, compressed: bool = True) -> float:
        sc = replace(quick, workload=scaled(quick.workload, c))
        if not compressed:
            sc = replace(sc, compressor="none", density=None, profile=None)
        elif sc.profile is not None and k != 1.0:
            sc = replace(sc, profile=scaled_costs(sc.profile, k))
        return float(simulate_alone(sc)["iteration_s"])

    none = scenario.compressor == "none"
    at = {(c, k): seconds(c, k) for c in set(compute) | {1.0} for k in set(costs) | {1.0}}
    base = {c: at[(c, 1.0)] if none else seconds(c, 1.0, compressed=False) for c in set(compute) | {1.0}}
    ref_s, ref_speedup = at[(1.0, 1.0)], base[1.0] / at[(1.0, 1.0)]
    times = [point_s * t / ref_s for t in at.values()]
    speedups = [point_speedup * (base[c] / t) / ref_speedup for (c, _), t in at.items()] if not none else [1.0]
    return {"iteration_s_low": min(point_s, *times), "iteration_s_high": max(point_s, *times),
            "speedup_low": min(point_speedup, *speedups), "speedup_high": max(point_speedup, *speedups)}
