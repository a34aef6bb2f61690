"""Compute anchored on a measurement: a layout's single-GPU training throughput as the user measured it.

``--samples-per-s N`` at ``--batch-size B`` says one training iteration of ``B`` samples takes
``B / N`` seconds on one GPU. The simulator's single-GPU iteration of a layout is its forward
and backward FLOPs at one effective rate plus the optimizer step at the device's memory
bandwidth (:func:`simulator.workload.workload_from_layout`), so the measurement fixes the rate:

    rate = B · F / (B / N − optimizer_s)

with ``F`` the training FLOPs of one sample (3 × its forward FLOPs at ``tokens`` tokens,
:func:`costs.throughput.layout_flops`) and ``optimizer_s`` the layout's optimizer step on
the device (:func:`costs.throughput.optimizer_s`): projected on one node the iteration is
exactly ``B / N``. The rule fitted to published throughput is then not used, and its band with
it: what remains is the measurement's own noise, :data:`MEASUREMENT_NOISE`, or the spread of
the timed steps when they were timed here and spread wider.

A :class:`StepProfile` is such a measurement made by ``sidco profile --model``: a model's
training step timed on one device, kept as a JSON file (``--out``; ``--step-profile FILE`` of
``simulate``, ``compare``, ``sweep`` and ``tta`` reads it)::

    {"kind": "step", "model": "llama-3.1-8b", "config": {...the model's traces.llm.Config...},
     "device": "h100", "precision": "amp", "parallel": "ddp", "batch_size": 4, "tokens": 4096,
     "step_s": 0.61, "step_min_s": 0.60, "step_max_s": 0.63, "layers": 32, "layers_timed": 32,
     "scale": 1.0, "runs": [{"layers": 32, "seconds": [...]}], "warmup": 3, "repeats": 10,
     "created": "2026-12-07", "identity": {...}, "source": "how it was measured"}

``step_s`` is the median step at full depth (seconds), scaled from ``layers_timed`` of
``layers`` blocks when the whole model did not fit (``scale`` = layers ÷ layers_timed);
``runs`` hold every timed step. Units: samples/s,
FLOP, FLOP/s, seconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from costs import throughput
from costs.devices import Device
from costs.device_profile import save_text

MEASUREMENT_NOISE = 0.05
"""Band (±, a fraction of compute time) on compute anchored on a measured throughput: stated,
not fitted. A throughput measured in one's own training loop on one's own GPU removes every
difference of harness, model code and software between the published rows and the user's run
(the published rows of the same model and GPU differ by up to 1.5× between harnesses,
docs/devices.md); left is what changes from run to run of that loop and between one GPU and
the data-parallel worker: clocks under power and thermal limits, the input pipeline, the
memory traffic of communication overlapping backward. ±5 % covers the spread of repeated
timings of one loop on one GPU; a measurement with a wider spread should widen it."""


def measured(layout: str, device: Device, batch_size: int, samples_per_s: float,
             tokens: int | None = None, precision: str = throughput.DEFAULT_PRECISION, *,
             by: str = "--samples-per-s", spread: tuple[float, float] = (1.0, 1.0)) -> throughput.Compute:
    """The compute of ``layout`` (at ``tokens`` tokens per sample) on ``device`` when one GPU
    trains ``samples_per_s`` samples/s at ``batch_size`` samples per iteration (the module
    docstring): its effective FLOP/s and the measurement's band (the note says when that rate is
    above the device's peak in ``precision``, and names the measurement ``by``). ``spread``: the
    fastest and slowest timed iteration ÷ the median, when known; the band is the wider of it and
    :data:`MEASUREMENT_NOISE`. ValueError when the optimizer step alone takes longer than the
    measured iteration."""
    iteration_s = batch_size / samples_per_s
    optimizer_s = throughput.optimizer_s(layout, device)
    if not iteration_s > optimizer_s:
        raise ValueError(f"--samples-per-s {samples_per_s:g} at batch {batch_size} is {iteration_s * 1e3:.3g} ms an "
                         f"iteration, less than {layout}'s optimizer step alone on {device.name} "
                         f"({optimizer_s * 1e3:.3g} ms): give the throughput measured at this --batch-size")
    flops = batch_size * throughput.layout_flops(layout, tokens) / (iteration_s - optimizer_s)
    low, high = min(1.0 - MEASUREMENT_NOISE, spread[0]), max(1.0 + MEASUREMENT_NOISE, spread[1])
    peak = device.peak_flops(precision)
    beyond = (f"; above {device.name}'s {device.dtype(precision)} peak of {peak / 1e12:.3g} TFLOP/s: check "
              "--batch-size, --tokens and --precision against the measurement" if flops > peak else "")
    stated = (low, high) == (1.0 - MEASUREMENT_NOISE, 1.0 + MEASUREMENT_NOISE)
    note = (f"{flops / 1e12:.3g} TFLOP/s effective, from the measured {samples_per_s:g} samples/s at batch "
            f"{batch_size} ({by}: {iteration_s * 1e3:.4g} ms an iteration on one GPU, less the optimizer's "
            f"{optimizer_s * 1e3:.3g} ms at {device.name}'s bandwidth{beyond}); time band x{low:.2f}-{high:.2f}, "
            + ("the measurement's noise (stated)" if stated else "the spread of the timed steps"))
    return throughput.Compute(flops_per_s=flops, low=low, high=high, unmeasured=(), note=note)


STEP_KIND = "step"
"""The ``kind`` of a step profile file."""

MAX_STEP_PROFILE_BYTES = 1 << 20
"""Largest step profile file read (bytes): 1 MiB; one holds a few hundred numbers."""


@dataclass(frozen=True, kw_only=True)
class StepProfile:
    """A model's training step measured on one device (the module docstring has the fields)."""

    model: str
    config: Mapping[str, Any]
    device: str
    precision: str
    parallel: str
    batch_size: int
    tokens: int
    step_s: float
    step_min_s: float
    step_max_s: float
    layers: int
    layers_timed: int
    scale: float
    warmup: int
    repeats: int
    runs: tuple[Mapping[str, Any], ...] = ()
    created: str = ""
    identity: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def samples_per_s(self) -> float:
        """Training throughput of one device at :attr:`batch_size` (samples/s)."""
        return self.batch_size / self.step_s

    @property
    def tokens_per_s(self) -> float:
        """Training throughput of one device (tokens/s)."""
        return self.samples_per_s * self.tokens

    @property
    def spread(self) -> tuple[float, float]:
        """The fastest and slowest timed step ÷ the median."""
        return self.step_min_s / self.step_s, self.step_max_s / self.step_s

    def to_json(self) -> str:
        """The profile in the file format."""
        data = {"kind": STEP_KIND, **asdict(self), "config": dict(self.config), "runs": [dict(r) for r in self.runs],
                "samples_per_s": self.samples_per_s, "tokens_per_s": self.tokens_per_s}
        return json.dumps(data, indent=1, sort_keys=True)

    def save(self, path: str | Path) -> Path:
        """Write the profile to ``path`` (created with its folder; replaced atomically)."""
        return save_text(path, self.to_json() + "\n")

MAX_STEP_NUMBER = 1e15
"""Largest number a step profile's field may hold (seconds, samples, layers): far beyond any
measurement, and within what a float holds exactly for whole numbers."""


def _field(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}: {key} must be a non-empty string, got {value!r:.60}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_STEP_NUMBER:
        raise ValueError(f"{where}: {key} must be a number > 0 and at most {MAX_STEP_NUMBER:g}, got {value!r:.60}")
    if kind is int and int(value) != value:
        raise ValueError(f"{where}: {key} must be a whole number, got {value!r:.60}")
    return kind(value)


def step_from_json(text: str | bytes, origin: str = "step profile") -> StepProfile:
    """The :class:`StepProfile` of ``text``; ValueError (one line naming ``origin`` and the field) otherwise."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{origin}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != STEP_KIND:
        raise ValueError(f"{origin}: not a step profile (a JSON object with \"kind\": \"step\", "
                         "as sidco profile --model --out writes)")
    for key, kind in (("config", dict), ("identity", dict), ("runs", list), ("created", str), ("source", str)):
        if not isinstance(data.get(key, kind()), kind):
            raise ValueError(f"{origin}: {key} must be a JSON {kind.__name__.replace('dict', 'object')}, "
                             f"got {data[key]!r:.60}")
    if "config" not in data:
        raise ValueError(f"{origin}: config is missing (the model's configuration)")
    if not all(isinstance(run, dict) for run in data.get("runs", [])):
        raise ValueError(f"{origin}: runs must hold objects ({{\"layers\": N, \"seconds\": [...]}})")
    warmup = data.get("warmup", 0)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"{origin}: warmup must be a whole number >= 0, got {warmup!r:.60}")
    profile = StepProfile(
        **{k: _field(data, k, str, origin) for k in ("model", "device", "precision", "parallel")},
        **{k: _field(data, k, int, origin) for k in ("batch_size", "tokens", "layers", "layers_timed", "repeats")},
        **{k: _field(data, k, float, origin) for k in ("step_s", "step_min_s", "step_max_s", "scale")},
        warmup=warmup, config=data["config"], runs=tuple(data.get("runs", ())), created=data.get("created", ""),
        identity=data.get("identity", {}), source=data.get("source", ""))
    if not profile.step_min_s <= profile.step_s <= profile.step_max_s:
        raise ValueError(f"{origin}: step_min_s <= step_s <= step_max_s must hold, got {profile.step_min_s:g}, "
                         f"{profile.step_s:g} and {profile.step_max_s:g}")
    throughput.check_precision(profile.precision)
    return profile


def load_step(path: str | Path) -> StepProfile:
    """Read the step profile file at ``path`` (a regular file of at most :data:`MAX_STEP_PROFILE_BYTES`
    bytes, :func:`traces.files.read_regular`); ValueError (one line naming ``path``) on any problem."""
    from traces.files import read_regular

    return step_from_json(read_regular(path, MAX_STEP_PROFILE_BYTES, "step profile"), str(Path(path)))


def step_named(given: str | Path | StepProfile) -> tuple[StepProfile, str]:
    """The step profile ``given``: a file's path (read, :func:`load_step`) or a profile already read
    (one the results store holds), and how a message names it (the path; the model, device and day
    it was measured)."""
    if isinstance(given, StepProfile):
        return given, f"{given.model} on {given.device}" + (f" ({given.created})" if given.created else "")
    return load_step(given), str(given)


def step_fields(given: str | StepProfile, *, model: str | None, batch_size: int, tokens: int | None, precision: str,
                device: str | None, samples_per_s: float | None = None,
                device_flops_per_s: float | None = None) -> dict[str, Any]:
    """The rules of ``--step-profile FILE`` (or a stored step profile, :func:`step_named`) on a
    projection, and the fields it sets: the file's absolute path or the profile (``step_profile``),
    its device (``device``, when not given) and tokens per sample (``tokens``, when not given). A
    measured step holds for its own model (the same configuration), batch, sequence length,
    precision and device only: ValueError (one line) when the projection asks another, or gives
    another anchor beside it."""
    from costs import devices
    from traces import llm

    if model is None:
        raise ValueError("--step-profile applies to --model (a training step measured by sidco profile --model)")
    if samples_per_s is not None or device_flops_per_s is not None:
        raise ValueError("give --step-profile, --samples-per-s or --device-flops, not two of them")
    step, named = step_named(given)
    where = f"step profile {named}"
    if step.device.split("@")[0] not in devices.names():
        raise ValueError(f"{where} was measured on {step.device!r}, not one of the modelled devices "
                         f"({', '.join(devices.names())}): its network and memory are not known to the model")
    if dict(step.config) != asdict(llm.load(model)):
        raise ValueError(f"{where} measured {step.model!r}, whose configuration is not --model {model}'s")
    asked = {"--batch-size": (batch_size, step.batch_size), "--precision": (precision, step.precision)}
    if tokens is not None:
        asked["--tokens"] = (tokens, step.tokens)
    if device is not None:
        asked["--device"] = (devices.base_name(devices.get(device).name), step.device)
    for flag, (projected, measured_at) in asked.items():
        if projected != measured_at:
            raise ValueError(f"{where} was measured with {flag} {measured_at}, the projection asks {projected}: "
                             f"a measured step holds for its own {flag.removeprefix('--')} (project with {flag} "
                             f"{measured_at}, or measure this one)")
    kept = step if isinstance(given, StepProfile) else str(Path(given).resolve())
    return {"step_profile": kept, "device": device or step.device, "tokens": step.tokens}
