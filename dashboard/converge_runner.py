"""Run a small convergence run launched from the dashboard, through :mod:`pipeline.converge`.

The same configuration key as ``sidco converge``, so a cancelled run launched again resumes
(the pairs already stored are skipped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import converge
from pipeline.converge import RunConfig
from results.store import Store
from units import Pair, parse_density, parse_list

MAX_STEPS = 20_000
"""Most worker passes (workers × iterations × pairs) the page launches; bigger runs: ``sidco converge``."""


@dataclass(frozen=True)
class ConvergeSpec:
    """A run launched from the page: its configuration and its (compressor, density) pairs."""

    config: RunConfig
    pairs: tuple[Pair, ...]


def _whole(text: str | None, name: str) -> int:
    value = str(text or "").strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"invalid {name} {text!r}: a whole number >= 1")
    return int(value)


def parse_spec(workload: str | None, workers: str | None, iterations: str | None, eval_every: str | None,
               width: str | None, compressors: list[str] | None, densities: str | None) -> ConvergeSpec:
    """Validate the launch form; ``ValueError`` naming the first bad field."""
    try:
        width_value = float(str(width))
    except ValueError:
        raise ValueError(f"invalid width {width!r}: a number > 0, e.g. 0.25") from None
    if not width_value > 0:
        raise ValueError(f"invalid width {width!r}: a number > 0, e.g. 0.25")
    config = RunConfig(workload=str(workload), workers=_whole(workers, "workers"),
                       iterations=_whole(iterations, "iterations"), eval_every=_whole(eval_every, "eval every"),
                       width=width_value)
    config.check()
    pairs = converge.pairs(list(compressors or []), parse_list(densities or "", parse_density))
    steps = config.workers * config.iterations * len(pairs)
    if steps > MAX_STEPS:
        raise ValueError(f"{steps} worker passes is more than the page launches ({MAX_STEPS}); use `sidco converge`")
    return ConvergeSpec(config, tuple(pairs))


def run(store_path: str | Path, spec: ConvergeSpec, progress: Callable[[int, int, str], None] | None = None,
        started: Callable[[int], None] | None = None) -> int:
    """Train the pairs of ``spec`` not stored yet (then replay the run's trace); return the run's id.

    ``progress(done, total, label)`` counts training iterations over all pairs.
    """
    total = spec.config.iterations * len(spec.pairs)
    state = {"done": 0}

    def step(label: str, done: int, count: int) -> None:
        if label != "replay":
            state["done"] += 1
        if progress is not None:
            progress(min(state["done"], total), total, label)

    with Store(store_path) as store:
        convergence_id = converge.open_run(store, spec.config)
        skipped = len(converge.trained(store, convergence_id, spec.config.iterations) & set(spec.pairs))
        state["done"] = skipped * spec.config.iterations
        result = converge.run(store, spec.config, spec.pairs, progress=step, started=started)
    return result.convergence_id
