"""The one compression-profile policy: where the compression costs of a projection come from.

:func:`compression_profile` looks for the costs of each (compressor, density) in these
places, in order, and takes each pair from the first place that has it:

1. ``profile_file`` when given: a JSON file ``{"device": NAME, "source": TEXT, "rows":
   [{"compressor", "density", "numel", "compress_s", "decompress_s"[, "wire_bytes"]}, ...]}``
   (seconds, elements, bytes);
2. the replay rows of this trace on this device: every replay of the trace is merged, the
   newest replay that holds a pair wins for that pair;
3. the newest stored device profile of this device that holds the pair (``sidco profile``);
4. a device profile shipped with the testbed (``profiles/<device>.json``);
5. the cost model (:mod:`costs.costmodel`: the compressor's declared work on the device's
   numbers) when the projection's device is a modelled one (a :class:`costs.devices.Device`,
   resolved once by the request, :func:`pipeline.request.resolve_device`; never looked up here);
6. otherwise a one-line :class:`MissingCosts` error naming the command that fills the gap.

A stored or shipped ``cpu`` profile is used only on a host with the same CPU model and SIMD
flags as the one it was measured on.

Tiers 2 and on are the entries of :data:`TIERS`; a new source of costs is one more entry.
Densities are matched by their canonical key (:func:`costs.profile.density_key`), never
by float equality. Nothing here runs a compressor: measuring is an explicit job (``sidco
replay``, ``sidco profile``). Every returned cost carries its ``source``.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressors import work as declared_work
from compressors.messages.wire import sparse_bytes
from costs import costmodel, device_profile, devices, kernel_bands
from costs.profile import CompressionCost, CompressionProfile, density_key
from machine import host_identity, host_key
from results.store import Store
from units import Pair

Key = tuple[str, float | None]
VALUE_BYTES = 4  # fp32 values, as replay and the traces store them


class MissingCosts(ValueError):
    """No tier has the costs of some (compressor, density) on the device (one line, names the fix)."""


@dataclass(frozen=True)
class CostRequest:
    """What a tier is asked: costs on the device named ``device`` for a trace (``trace_id``,
    ``None`` for a layout), for buckets of about ``numel`` elements when known; ``model``: that
    device as the cost model sees it (``None`` for a device it does not model, e.g. ``cuda``)."""

    store: Store
    trace_id: int | None
    device: str
    numel: int | None
    model: devices.Device | None = None


Tier = Callable[[CostRequest, Sequence[Key]], dict[Key, CompressionCost]]


def same_device(stored: str | None, wanted: str) -> bool:
    """Whether a stored device string (``"cpu"``, or an identity such as ``"cpu: AMD EPYC
    (avx512)"``, ``"cuda: NVIDIA H200 SXM"``) is the device ``wanted`` (``"cpu"``, ``"cuda"``,
    ``"h200"``), case-insensitive: equal, equal to its kind before ``:``, or, for a GPU, one
    whole word of the name after it (``h200`` is a word of ``NVIDIA H200 SXM``, not of
    ``NVIDIA GH200``: no substring matching)."""
    if not stored:
        return False
    stored_l, wanted_l = stored.strip().lower(), wanted.strip().lower()
    kind, _, name = stored_l.partition(":")
    return stored_l == wanted_l or kind.strip() == wanted_l or (
        kind.strip() == "cuda" and wanted_l in re.split(r"[^a-z0-9@.]+", name))


def _day(created: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(created))


def _fit(rows: Sequence[Mapping[str, Any]], source: str) -> dict[Key, CompressionCost]:
    return dict(CompressionProfile.from_replay_rows(rows, source=source).costs)


def _profile_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Device-profile rows as replay-shaped rows (one worker, error feedback on). A row without
    ``wire_bytes`` gets the sparse message size of :func:`compressors.messages.wire.sparse_bytes`, k = max(1, round(δ·n))."""
    out = []
    for row in rows:
        numel, density = int(row["numel"]), float(row["density"])
        wire = row.get("wire_bytes")
        if wire is None:
            wire = sparse_bytes(max(1, round(density * numel)), VALUE_BYTES)
        out.append({"compressor": str(row["compressor"]), "density": density, "error_feedback": 1, "worker": 0,
                    "numel": numel, "compress_s": float(row["compress_s"]),
                    "decompress_s": float(row["decompress_s"]), "wire_bytes": int(wire)})
    return out


def from_replays(request: CostRequest, missing: Sequence[Key]) -> dict[Key, CompressionCost]:
    """Tier: this trace's replays on this device, newest first; the newest that holds a pair wins."""
    if request.trace_id is None:
        return {}
    found: dict[Key, CompressionCost] = {}
    for replay in request.store.replays_of_trace(request.trace_id):
        if not same_device(replay["device"], request.device):
            continue
        todo = set(missing) - found.keys()
        if not todo:
            break
        rows = [r for r in request.store.replay_rows(replay["id"], compressors=sorted({c for c, _ in todo}))
                if (r["compressor"], density_key(r["density"])) in todo]
        if rows:
            found.update(_fit(rows, f"replay #{replay['id']} {replay['device']} {_day(replay['created'])}"))
    return found


def _this_host(device: str, identity: Mapping[str, Any]) -> bool:
    """Whether a ``cpu`` profile measured on ``identity`` describes this host (profiles of
    other devices, and identities that name no CPU model and flags, always do)."""
    if device != "cpu":
        return True
    host = identity.get("identity", identity)
    if not isinstance(host, Mapping) or "cpu" not in host or "flags" not in host:
        return True
    return host_key(host) == host_key(host_identity())


def from_device_profiles(request: CostRequest, missing: Sequence[Key]) -> dict[Key, CompressionCost]:
    """Tier: the stored device profiles of this device, newest first; the newest that holds a pair wins."""
    found: dict[Key, CompressionCost] = {}
    for profile in request.store.device_profiles(request.device):
        todo = set(missing) - found.keys()
        if not todo:
            break
        if not _this_host(profile["device"], json.loads(profile["identity_json"] or "{}")):
            continue
        rows = [r for r in request.store.device_profile_rows(profile["id"])
                if (r["compressor"], density_key(r["density"])) in todo]
        if rows:
            source = f"measured {profile['device']} {_day(profile['created'])} (profile #{profile['id']})"
            found.update(_fit(_profile_rows(rows), source))
    return found


def from_shipped_profiles(request: CostRequest, missing: Sequence[Key]) -> dict[Key, CompressionCost]:
    """Tier: the device profiles shipped in ``profiles/`` for this device."""
    import profiles

    found: dict[Key, CompressionCost] = {}
    for path in profiles.paths():
        shipped = device_profile.load(path)
        if shipped.device != request.device.strip().lower() or not _this_host(shipped.device, shipped.identity):
            continue
        todo = set(missing) - found.keys()
        rows = [r for r in shipped.rows if (r["compressor"], density_key(r["density"])) in todo]
        if rows:
            found.update(_fit(_profile_rows(rows), f"{shipped.label} (shipped {path.name})"))
    return found


def from_cost_model(request: CostRequest, missing: Sequence[Key]) -> dict[Key, CompressionCost]:
    """Tier: the cost model on the request's device (``model a100``); nothing for a device it does not model."""
    if request.model is None:
        return {}
    names = set(declared_work.DECLARATIONS)
    return {key: costmodel.cost(key[0], key[1], request.model) for key in missing if key[0] in names}


TIERS: list[tuple[str, Tier]] = [
    ("replay", from_replays),
    ("device profile", from_device_profiles),
    ("shipped profile", from_shipped_profiles),
    ("model", from_cost_model),
]
"""The stored sources of costs after ``profile_file``, in the order they are asked."""


def read_profile_file(path: str | Path, device: str) -> dict[Key, CompressionCost]:
    """The costs in a profile JSON file (format: :mod:`costs.device_profile`); ValueError
    naming the file when it is unreadable, malformed or for another device."""
    path = Path(path)
    try:
        given = device_profile.load(path)
    except ValueError as exc:
        detail = str(exc).splitlines()[0].removeprefix(f"{path}: ")
        raise ValueError(f"{path}: not a compression profile file ({detail})") from None
    file_device = given.device
    costs = _fit(_profile_rows(given.rows), f"file {path.name}: {given.source}") if given.rows else {}
    if not same_device(file_device, device):
        raise ValueError(f"{path}: profile is for device {file_device!r}, the projection is for {device!r}")
    return costs


def read_stored_profile(store: Store, profile_id: int, device: str) -> dict[Key, CompressionCost]:
    """The costs of the stored device profile ``profile_id``; ValueError when there is no such
    profile or it is for another device."""
    found = [p for p in store.device_profile_list() if p["id"] == int(profile_id)]
    if not found:
        raise ValueError(f"no device profile #{profile_id} in {store.path}")
    if not same_device(found[0]["device"], device):
        raise ValueError(f"device profile #{profile_id} is for {found[0]['device']!r}, the projection is for {device!r}")
    source = f"measured {found[0]['device']} {_day(found[0]['created'])} (profile #{profile_id}, chosen)"
    return _fit(_profile_rows(store.device_profile_rows(int(profile_id))), source)


def _fill_command(store: Store, trace_id: int | None, device: str, missing: Sequence[Key]) -> str:
    names = ",".join(sorted({c for c, _ in missing}))
    densities = ",".join(f"{d:g}" for d in sorted({d for _, d in missing if d is not None}))
    run_on = "cpu" if device == "cpu" else "cuda"
    where = "" if device in ("cpu", "cuda") else f" on a {device}"
    profile = f"`sidco profile --run-on {run_on}`{where}"
    if trace_id is None:
        return f"run {profile} (layouts have no gradients to replay)"
    row = store.trace(trace_id)
    path = row["path"] if row else "TRACE"
    return f"run `sidco replay {path} --compressors {names} --densities {densities} --run-on {run_on}`{where} or {profile}"


def compression_profile(
    store: Store,
    *,
    trace_id: int | None,
    device: devices.Device,
    pairs: Sequence[tuple[str, float | None]],
    profile_file: str | Path | None = None,
    numel: int | None = None,
    profile_id: int | None = None,
) -> CompressionProfile:
    """The compression costs of ``pairs`` ((compressor, density) list; ``none`` needs none) on
    ``device`` for the trace ``trace_id`` (``None`` for a layout), by the policy of this module.
    ``device``: the device a projection resolved (:func:`pipeline.request.resolve_device`; it
    reaches the cost model as it is; a device it does not model, :func:`costs.devices.unrecorded_gpu`,
    gets stored costs only).

    ``numel``: the bucket size (elements) the costs will mostly be asked for, for tiers that
    model rather than measure. ``profile_id``: a stored device profile chosen by hand (the
    dashboard's choice among stored profiles), taken first like ``profile_file``. Raises :class:`MissingCosts` naming the first uncovered pair and
    the command that measures it.
    """
    model = device if device.modelled else None
    device = device.name
    wanted = list(dict.fromkeys((c, density_key(d)) for c, d in pairs if c != "none"))
    costs: dict[Key, CompressionCost] = {}
    if profile_file is not None:
        from_file = read_profile_file(profile_file, device)
        costs.update({k: v for k, v in from_file.items() if k in wanted})
    if profile_id is not None:
        chosen = read_stored_profile(store, profile_id, device)
        costs.update({k: v for k, v in chosen.items() if k in wanted and k not in costs})
    request = CostRequest(store, trace_id, device, numel, model)
    for _, tier in TIERS:
        missing = [k for k in wanted if k not in costs]
        if not missing:
            break
        costs.update({k: v for k, v in tier(request, missing).items() if k in missing})
    missing = [k for k in wanted if k not in costs]
    if missing:
        raise MissingCosts(f"no compression costs for {Pair(*missing[0]).label} on {device}: "
                           f"{_fill_command(store, trace_id, device, missing)}")
    sources = list(dict.fromkeys(costs[k].source for k in wanted))
    return CompressionProfile({k: costs[k] for k in wanted}, "; ".join(sources) or "none")


KERNEL_BAND_NOTE = ("modelled compression costs carry the bands of the kinds of kernel they use, from published "
                    "GPU timings (docs/compression-costs.md, 'Kernel bands'); a --profile measured on your GPU "
                    "(sidco profile --run-on cuda --out FILE) replaces the model and its band for the pairs it covers")
"""What the header of a projection says of its compression-cost bands (both doors print it)."""

UNMEASURED_COST_BAND = kernel_bands.UNMEASURED
"""Band on modelled compression costs on a device that no shipped profile checks: a factor of
2 either way (the cost model's goal on every row, not a measured error)."""


@functools.lru_cache(maxsize=8)
def model_band(device: str) -> tuple[float, float]:
    """Factors on modelled compression costs on ``device`` spanning the model's measured error:
    the range of measured ÷ modelled seconds (compress and decompress) over the compressor rows
    of at least 2²⁰ elements of the shipped profiles of this device (this host's measured profile
    for ``cpu``; a GPU's ``published-<gpu>.json`` holds kernel rows only, which check bandwidth
    and latencies, not the compressors' kernels, and do not narrow the band);
    :data:`UNMEASURED_COST_BAND` where no compressor row is shipped."""
    import profiles

    from pipeline.profile import CHECK_MIN_NUMEL, check_rows, model_device

    ratios = []
    for path in profiles.paths():
        shipped = device_profile.load(path)
        if shipped.device != device or not shipped.rows or not _this_host(shipped.device, shipped.identity):
            continue  # kernel rows alone (a GPU's published profile) check no compressor
        model = model_device(shipped)
        if model is None:
            continue
        for row in check_rows(shipped, model):
            if row["numel"] >= CHECK_MIN_NUMEL:
                ratios += [1.0 / (1.0 + row[f"{w}_error"]) for w in ("compress", "decompress")
                           if row[f"{w}_error"] is not None and row[f"{w}_error"] > -1]
    if not ratios:
        return UNMEASURED_COST_BAND
    return min(1.0, min(ratios)), max(1.0, max(ratios))


@functools.lru_cache(maxsize=1)
def measured_band() -> tuple[float, float]:
    """Factors on measured compression costs spanning their spread: the medians, over the rows
    of the shipped CPU profiles, of the fastest and slowest call over the median call
    (``compress_min_s`` / ``compress_s`` and ``compress_max_s`` / ``compress_s``)."""
    import profiles

    low, high = [], []
    for path in profiles.paths():
        for row in device_profile.load(path).rows:
            if row.get("compress_min_s") and row.get("compress_max_s") and row["compress_s"] > 0:
                low.append(row["compress_min_s"] / row["compress_s"])
                high.append(row["compress_max_s"] / row["compress_s"])
    if not low:
        return 1.0, 1.0
    return min(1.0, statistics.median(low)), max(1.0, statistics.median(high))


def cost_band(cost: CompressionCost, device: str, compressor: str | None = None, density: float | None = None,
              model: devices.Device | None = None) -> tuple[float, float]:
    """Factors ``(low, high)`` on ``cost``'s seconds spanning what is known of its error. Modelled
    costs of ``compressor`` at ``density`` on a GPU (``model``, the projection's device): the bands
    of the kinds of kernel its declared work uses, from published GPU timings
    (:func:`costs.kernel_bands.compressor_band`); other modelled costs: the model's measured
    error on ``device`` (:func:`model_band`). Measured costs (a ``--profile`` file, replays, stored
    or shipped profiles): the spread of measured calls (:func:`measured_band`), whatever the
    kernels: a measurement removes the kernel band for the pairs it covers."""
    if cost.source.startswith("model "):
        if model is not None and model.kind == "gpu" and compressor is not None:
            return kernel_bands.compressor_band(compressor, density, model)
        return model_band(device)
    return measured_band()
