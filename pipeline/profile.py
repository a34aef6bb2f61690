"""Device profiles: measuring one (``sidco profile``) and checking the cost model against every
measured one (``sidco profile --check``); a model's training step measured
(``sidco profile --model``, :func:`measure_step`). Measuring is an explicit job; nothing else
times compressors or steps."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import compressors
from compressors import work as declared
from costs import anchor, costmodel, devices
from costs.throughput import check_precision as throughput_precision
from costs import device_profile as dp
from results.store import Store, row_id
from units import check_count

CHECK_MIN_NUMEL = 1 << 20
"""``--check`` judges the model on calls of at least this many elements (smaller ones are
dominated by launch and dispatch latency)."""
GOAL = 0.30
"""The model's target: within 30 % of every measured profile at ≥ :data:`CHECK_MIN_NUMEL`."""
KERNEL_FACTOR = 2.0
"""Published kernel rows (``profiles/published-<gpu>.json``): the model's target is a median
|error| within :data:`GOAL` and every row within this factor either way."""


def store_profile(store: Store, profile: dp.DeviceProfile) -> int:
    """Keep ``profile`` in the results store (``device_profiles``/``device_profile_rows``); returns its id.

    The identity column holds the identity, the creation date, the method and the measured
    device numbers, so that :func:`stored_profiles` rebuilds the same profile (the pipeline writes
    the store; :mod:`costs.device_profile` keeps to the file format)."""
    identity = {"identity": dict(profile.identity), "created": profile.created, "method": dict(profile.method),
                "device_model": profile.device_model}
    return store.add_device_profile(profile.device, identity, profile.source, profile.rows)


def stored_profiles(store: Store, device: str) -> list[tuple[int, dp.DeviceProfile]]:
    """The store's profiles of ``device``, newest first, as ``(id, profile)``."""
    found = []
    for row in store.device_profiles(device):
        meta = json.loads(row["identity_json"])
        rows = tuple(
            {k: r[k] for k in ("compressor", "density", "numel", "compress_s", "decompress_s", "wire_bytes", "backend")
             if r.get(k) is not None}
            for r in store.device_profile_rows(row["id"])
        )
        if rows:
            found.append((int(row["id"]), dp.DeviceProfile(
                row["device"], row["source"], rows, meta.get("created", ""), meta.get("identity") or {},
                meta.get("method") or {}, meta.get("device_model"),
            )))
    return found


@dataclass(frozen=True)
class Measured:
    """A measured profile and its id in the store."""

    profile_id: int
    profile: dp.DeviceProfile


def measure(store: Store, device: str, sizes: Sequence[int], names: Sequence[str], densities: Sequence[float], *,
            warmup: int = 5, repeats: int = 7, sessions: int = 1, threads: int = 1,
            out: str | Path | None = None,
            progress: Callable[[str], None] | None = None,
            note: Callable[[str], None] = lambda text: None) -> Measured:
    """Measure ``device`` (``cpu``, ``cuda``…): on a CPU first this host's numbers (pinned to
    ``threads``), then every compressor × density × size, then the host's numbers again (the
    faster figure of the two is kept, for ``--run-on cpu``); store the profile and write it to
    ``out``. A run stopped halfway keeps the rows measured as a partial profile. Refuses
    (``ChildProcessError``) to start while another measuring child of the testbed is alive."""
    from measuring import host as measure, profiling

    compressors.check_names(names)
    dev = profiling.torch_device(device)
    profiling.check_sizes(sizes, dev)
    profiling.refuse_beside_others()
    host = None
    if dev.type == "cpu":
        cpus = profiling.pin_threads(threads)
        note(f"measuring this host ({threads} threads on CPUs {cpus}) ...")
        host = measure.measure_host(repeats=max(3, repeats))
        devices.save_host(host)

    def keep_partial(partial: dp.DeviceProfile, exc: BaseException) -> None:
        kept = store_profile(store, partial)
        note(f"stopped: the {len(partial.rows)} rows measured are kept as device profile #{kept}")

    profile = profiling.profile(device, sizes, names, densities, warmup=warmup, repeats=repeats, sessions=sessions,
                                host=host, progress=progress, on_partial=keep_partial)
    if host is not None:
        note("measuring this host again ...")
        host = measure.fastest(host, measure.measure_host(repeats=max(3, repeats)))
        devices.save_host(host)
        profile = replace(profile, device_model=host.to_json())
    profile_id = store_profile(store, profile)
    if out is not None:
        profile.save(out)
    return Measured(profile_id, profile)


def profiles_to_check(store: Store, files: Sequence[str | Path] = ()) -> list[tuple[str, dp.DeviceProfile]]:
    """Every measured profile: shipped (``profiles/``), given ``files``, and stored; duplicates
    (the same device and the same timings, e.g. a file also stored) once."""
    import profiles

    found = [(f"shipped {p.name}", dp.load(p)) for p in profiles.paths()]
    found += [(f"file {p}", dp.load(p)) for p in files]
    for name in sorted({r["device"] for r in store.device_profile_list()}):
        found += [(f"store #{profile_id}", profile) for profile_id, profile in stored_profiles(store, name)]
    seen, unique = set(), []
    for where, profile in found:
        key = (profile.device, tuple((r["compressor"], float(r["density"]), int(r["numel"]), float(r["compress_s"]))
                                     for r in profile.rows),
               tuple((r["kernel"], int(r["numel"]), float(r["seconds"])) for r in profile.kernels))
        if key not in seen:
            seen.add(key)
            unique.append((where, profile))
    return unique


def model_device(profile: dp.DeviceProfile) -> devices.Device | None:
    """The device the model uses for ``profile``: the host numbers measured with it, else the
    named device; ``None`` for an unknown device."""
    if profile.device_model:
        return devices.from_json(profile.device_model)
    try:
        return devices.get(profile.device)
    except ValueError:
        return None


def check_rows(profile: dp.DeviceProfile, device: devices.Device) -> list[dict[str, Any]]:
    """Model vs measured, row by row: seconds and relative errors ``model / measured − 1``
    (each row modelled with its own stage count, loop counts and code path when it records them,
    and with error feedback around every compressor when the profile says it was measured so)."""
    everywhere = profile.method.get("error_feedback") is True
    out = []
    for r in profile.rows:
        if r["compressor"] not in declared.DECLARATIONS:
            continue
        loops = {k: r[k] for k in ("rounds", "trim", "steps", "pool", "collects", "hits", "deepened")
                 if r.get(k) is not None}
        stages = r.get("planned", r.get("stages"))  # SIDCo: what it planned (older rows: what it used)
        model_c, model_d = costmodel.call_seconds(r["compressor"], int(r["numel"]), float(r["density"]), device,
                                                  stages=stages, backend=r.get("backend") or None,
                                                  error_feedback=True if everywhere else None, **loops)
        out.append({
            "compressor": r["compressor"], "density": r["density"], "numel": r["numel"],
            "compress_s": r["compress_s"], "model_compress_s": model_c,
            "compress_error": model_c / r["compress_s"] - 1 if r["compress_s"] > 0 else None,
            "decompress_s": r["decompress_s"], "model_decompress_s": model_d,
            "decompress_error": model_d / r["decompress_s"] - 1 if r["decompress_s"] > 0 else None,
        })
    return out


def check_kernels(profile: dp.DeviceProfile, device: devices.Device) -> list[dict[str, Any]]:
    """Model vs published, kernel row by kernel row (:func:`costs.costmodel.row_seconds`):
    seconds, the relative error ``model / published − 1`` and the row's source."""
    out = []
    for r in profile.kernels:
        model = costmodel.row_seconds(r, device)
        out.append({"kernel": r["kernel"], "numel": r["numel"], "element_bytes": r["element_bytes"],
                    "launches": r["launches"], "syncs": r["syncs"], "seconds": r["seconds"], "model_s": model,
                    "error": model / r["seconds"] - 1, "source": r["source"]})
    return out


def kernel_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| of kernel rows, the worst factor either way (model ÷ published
    or its inverse) and whether they meet the goals (:data:`GOAL`, :data:`KERNEL_FACTOR`)."""
    if not rows:
        return {}
    errors = sorted(abs(r["error"]) for r in rows)
    factor = max(max(1 + r["error"], 1 / (1 + r["error"])) for r in rows)
    median = statistics.median(errors)
    return {"rows": len(rows), "median": median, "worst": errors[-1], "worst_factor": factor,
            "ok": median <= GOAL and factor <= KERNEL_FACTOR}


def worst(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per compressor, the largest |error| of compress and decompress over rows of at least
    :data:`CHECK_MIN_NUMEL` elements."""
    found: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["numel"] < CHECK_MIN_NUMEL:
            continue
        entry = found.setdefault(r["compressor"], {"compress": 0.0, "decompress": 0.0})
        for what in ("compress", "decompress"):
            if r[f"{what}_error"] is not None:
                entry[what] = max(entry[what], abs(r[f"{what}_error"]))
    return found


def kernel_bands() -> list[dict[str, Any]]:
    """The cost model's band per kind of kernel on published GPU timings, held out by harness
    (:func:`costs.kernel_bands.table`: kind, low, high, rows, harnesses)."""
    from costs import kernel_bands as bands

    return bands.table()


def check(store: Store, files: Sequence[str | Path] = ()) -> list[dict[str, Any]]:
    """The cost model against every measured profile: one report per profile (``rows``, ``worst``)."""
    report = []
    for where, profile in profiles_to_check(store, files):
        device = model_device(profile)
        if device is None:
            report.append({"profile": where, "device": profile.device, "skipped": "unknown device, no host numbers"})
            continue
        rows, kernels = check_rows(profile, device), check_kernels(profile, device)
        report.append({"profile": where, "device": profile.device, "source": profile.source,
                       "model": costmodel.source_label(device), "rows": rows, "worst": worst(rows),
                       "kernels": kernels, "kernel_summary": kernel_summary(kernels)})
    return report


PARALLEL = ("ddp",)
"""The data parallelisms a model's step is measured under: ``ddp`` (each GPU trains the whole
model, its optimizer over every parameter). Its effective rate anchors compute under every
``--parallel`` of a projection (each GPU computes the whole model's forward and backward under
every plan; the sharded optimizer, collectives and memory are the model's); a sharded step on one
GPU (its optimizer over a shard, parameters gathered layer by layer) is not measured yet."""


@dataclass(frozen=True)
class StepMeasured:
    """A measured training step of a model and its id in the store."""

    profile_id: int
    profile: anchor.StepProfile


def measure_step(store: Store, device: str, model: str, *, batch_size: int, tokens: int | None = None,
                 precision: str = "amp", parallel: str = "ddp", warmup: int = 3, repeats: int = 10,
                 threads: int = 1, layers: int | None = None, out: str | Path | None = None,
                 progress: Callable[[str], None] | None = None,
                 note: Callable[[str], None] = lambda text: None) -> StepMeasured:
    """Time the training step of ``model`` (a shipped name or a config.json, :mod:`traces.llm`)
    built in torch on ``device`` (``cpu``, ``cuda``…; on a CPU pinned to ``threads`` threads):
    ``batch_size`` sequences of ``tokens`` tokens (``None``: the model's default) in
    ``precision``, one GPU's share under ``parallel`` (:data:`PARALLEL`), ``warmup`` untimed then
    ``repeats`` timed steps (:func:`measuring.model_step.measure`; ``layers``: time that many
    blocks and scale up, ``None``: all that fit). Stores the step profile and writes it to ``out``.
    ValueError (one line) on a bad argument; ChildProcessError while another measuring process runs."""
    from dataclasses import asdict

    import torch

    from measuring import model_step, profiling
    from traces import llm

    if parallel not in PARALLEL:
        raise ValueError(f"--parallel {parallel} is not measured yet: measure ddp (the whole model on one GPU), whose "
                         "rate anchors compute under every --parallel of simulate and compare")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"--warmup must be >= 0 and --repeats >= 1, got {warmup} and {repeats}")
    throughput_precision(precision)
    ref = llm.check(model)
    config = llm.load(ref)
    tokens = llm.tokens_of(ref, tokens)
    check_count(batch_size, "--batch-size")
    if layers is not None and not 1 <= layers <= config.layers:
        raise ValueError(f"--layers must be from 1 to {config.layers} (the model's depth), got {layers}")
    dev = profiling.torch_device(device)
    profiling.refuse_beside_others()
    if dev.type == "cpu":
        cpus = profiling.pin_threads(threads)
        note(f"timing on {threads} thread(s), CPUs {cpus}")
    name, identity = profiling.device_identity(dev)
    step = model_step.measure(config, dev, batch_size, tokens, precision, warmup=warmup, repeats=repeats,
                              layers=layers, progress=progress)
    created = time.strftime("%Y-%m-%d", time.gmtime())
    what = identity.get("gpu") or name
    threads_text = f", {torch.get_num_threads()} CPU threads" if dev.type == "cpu" else ""
    timed = (f"the whole model ({config.layers} layers)" if step.scale == 1 else
             f"layers 0-{step.layers_timed - 1} of {config.layers} and the model without layers, the layers' time "
             f"scaled x{step.scale:.4g} to the full depth")
    source = (f"sidco profile --model on {what}{threads_text}, torch {torch.__version__}, {created}: {timed}; "
              f"{precision}, AdamW, synthetic tokens, {warmup} warm-up steps, median of {repeats} (wall clock, "
              f"device-synchronised)")
    profile = anchor.StepProfile(
        model=ref, config=asdict(config), device=name, precision=precision, parallel=parallel, batch_size=batch_size,
        tokens=tokens, step_s=step.step_s, step_min_s=step.low_s, step_max_s=step.high_s, layers=config.layers,
        layers_timed=step.layers_timed, scale=step.scale, warmup=warmup, repeats=repeats,
        runs=tuple({"layers": r.layers, "seconds": list(r.seconds)} for r in step.timed), created=created,
        identity=identity, source=source)
    profile_id = store.add_step_profile(ref, name, precision, batch_size, tokens, step.step_s, profile.to_json())
    if out is not None:
        profile.save(out)
    return StepMeasured(profile_id, profile)


def stored_step(store: Store, step_id: int | str) -> anchor.StepProfile:
    """The step profile ``sidco profile --model`` stored as ``step_id`` (read as its file is,
    :func:`costs.anchor.step_from_json`): what a door that opens no typed path (the What-if page)
    gives a request as its ``step_profile``. ValueError (one line) when there is none with that id."""
    number = row_id(step_id, "step profile")
    row = store.step_profile(number)
    if row is None:
        raise ValueError(f"no step profile #{number} in {store.path} (sidco profile --model stores one)")
    return anchor.step_from_json(row["profile_json"], f"stored step profile #{number}")
