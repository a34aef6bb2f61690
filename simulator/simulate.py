"""Simulate a scenario: its iteration, the same cluster without compression, the speed-up."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator import sharded
from simulator.des import run_des
from simulator.iteration import Prepared, Record, prepare, run_analytic, summarize
from simulator.scenario import Scenario
from simulator.timeline import events


def _run(sc: Scenario) -> tuple[Prepared, Record]:
    prep = prepare(sc)
    return prep, (run_des(prep) if sc.fidelity == "des" else run_analytic(prep))


def iteration(sc: Scenario) -> dict[str, Any]:
    """The output fields of ``sc`` alone (no baseline, no speed-up); a sharded ``sc`` by :mod:`simulator.sharded`."""
    if sc.sharding is not None and sc.sharding.sharded:
        return sharded.iteration(sc)
    prep, rec = _run(sc)
    result = summarize(prep, rec)
    if sc.timeline:
        result["timeline"] = events(prep, rec)
    return result


def simulate(scenario: Scenario, baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate one iteration of ``scenario``.

    Returns a dict with ``iteration_s``, ``samples_per_s``, ``forward_s``, ``backward_s``,
    ``compress_s``, ``exposed_comm_s``, ``idle_s``, ``optimizer_s`` (these six sum to
    ``iteration_s``), ``speedup`` (iteration time of ``none`` on the same cluster ÷ this
    one), ``baseline_iteration_s``, more detail (README) and, when
    ``scenario.timeline``, ``timeline`` (list of events, :mod:`simulator.timeline`).
    ``baseline``: an already computed result of the ``none`` scenario (sweeps reuse it).
    """
    result = iteration(scenario)
    if scenario.compressor == "none":
        base_s = result["iteration_s"]
    else:
        if baseline is None:
            baseline = iteration(replace(scenario, compressor="none", density=None, profile=None, timeline=False))
        base_s = baseline["iteration_s"]
    result["baseline_iteration_s"] = base_s
    result["speedup"] = base_s / result["iteration_s"] if result["iteration_s"] > 0 else float("inf")
    return result
