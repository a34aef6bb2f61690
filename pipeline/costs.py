"""The one compression-profile policy: where the compression costs of a projection come from.

:func:`compression_profile` looks for the costs of each (compressor, density) in these
places, in order, and takes each pair from the first place that has it:

1. ``profile_file`` when given: a JSON file ``{"device": NAME, "source": TEXT, "rows":
   [{"compressor", "density", "numel", "compress_s", "decompress_s"[, "wire_bytes"]}, ...]}``
   (seconds, elements, bytes);
2. the replay rows of this trace on this device: every replay of the trace is merged, the
   newest replay that holds a pair wins for that pair;
3. the newest stored device profile of this device that holds the pair (``sidco profile``);
4. otherwise a one-line :class:`MissingCosts` error naming the command that fills the gap.

Tiers 2 and on are the entries of :data:`TIERS`; a new source of costs is one more entry.
Densities are matched by their canonical key (:func:`simulator.profile.density_key`), never
by float equality. Nothing here runs a compressor: measuring is an explicit job (``sidco
replay``, ``sidco profile``). Every returned cost carries its ``source``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressors.wire import sparse_bytes
from results.store import Store
from simulator.profile import CompressionCost, CompressionProfile, density_key

Key = tuple[str, float | None]
VALUE_BYTES = 4  # fp32 values, as replay and the traces store them


class MissingCosts(ValueError):
    """No tier has the costs of some (compressor, density) on the device (one line, names the fix)."""


@dataclass(frozen=True)
class CostRequest:
    """What a tier is asked: costs on ``device`` for a trace (``trace_id``, ``None`` for a
    layout), for buckets of about ``numel`` elements when known."""

    store: Store
    trace_id: int | None
    device: str
    numel: int | None


Tier = Callable[[CostRequest, Sequence[Key]], dict[Key, CompressionCost]]


def same_device(stored: str | None, wanted: str) -> bool:
    """Whether a stored device string (``"cpu"``, or an identity such as ``"cpu: AMD EPYC
    (avx512)"``, ``"cuda: NVIDIA H200"``) is the device ``wanted`` (``"cpu"``, ``"cuda"``,
    ``"h200"``): equal, equal to its kind before ``:``, or named in it (case-insensitive)."""
    if not stored:
        return False
    stored_l, wanted_l = stored.strip().lower(), wanted.strip().lower()
    return stored_l == wanted_l or stored_l.split(":", 1)[0].strip() == wanted_l or wanted_l in stored_l


def _day(created: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(created))


def _fit(rows: Sequence[Mapping[str, Any]], source: str) -> dict[Key, CompressionCost]:
    return dict(CompressionProfile.from_replay_rows(rows, source=source).costs)


def _profile_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Device-profile rows as replay-shaped rows (one worker, error feedback on). A row without
    ``wire_bytes`` gets the sparse message size of :func:`compressors.wire.sparse_bytes`, k = max(1, round(δ·n))."""
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


def from_device_profiles(request: CostRequest, missing: Sequence[Key]) -> dict[Key, CompressionCost]:
    """Tier: the stored device profiles of this device, newest first; the newest that holds a pair wins."""
    found: dict[Key, CompressionCost] = {}
    for profile in request.store.device_profiles(request.device):
        todo = set(missing) - found.keys()
        if not todo:
            break
        rows = [r for r in request.store.device_profile_rows(profile["id"])
                if (r["compressor"], density_key(r["density"])) in todo]
        if rows:
            source = f"{profile['source']} {profile['device']} {_day(profile['created'])}"
            found.update(_fit(_profile_rows(rows), source))
    return found


TIERS: list[tuple[str, Tier]] = [
    ("replay", from_replays),
    ("device profile", from_device_profiles),
]
"""The stored sources of costs after ``profile_file``, in the order they are asked."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_row(row: Any, index: int) -> None:
    """ValueError naming the first field of profile-file row ``index`` that is missing or out of range."""
    if not isinstance(row, dict):
        raise ValueError(f"row {index} is not an object")
    checks = (
        ("compressor", lambda v: isinstance(v, str) and v != ""),
        ("density", lambda v: _number(v) and 0 < v <= 1),
        ("numel", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        ("compress_s", lambda v: _number(v) and v >= 0),
        ("decompress_s", lambda v: _number(v) and v >= 0),
        ("wire_bytes", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)),
    )
    for name, valid in checks:
        if name not in row and name != "wire_bytes":
            raise ValueError(f"row {index} lacks {name!r}")
        if not valid(row.get(name)):
            raise ValueError(f"row {index}: bad {name} {row.get(name)!r}")


def read_profile_file(path: str | Path, device: str) -> dict[Key, CompressionCost]:
    """The costs in a profile JSON file (see the module docstring); ValueError naming the file
    when it is unreadable, malformed or for another device."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        rows = data["rows"]
        file_device = str(data["device"])
        if not isinstance(rows, list) or not rows:
            raise ValueError("'rows' must be a non-empty list")
        for index, row in enumerate(rows):
            _check_row(row, index)
        costs = _fit(_profile_rows(rows), f"file {path.name}: {data.get('source', 'no source given')}")
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: not a compression profile file ({detail})") from None
    if not same_device(file_device, device):
        raise ValueError(f"{path}: profile is for device {file_device!r}, the projection is for {device!r}")
    return costs


def _fill_command(store: Store, trace_id: int | None, device: str, missing: Sequence[Key]) -> str:
    names = ",".join(sorted({c for c, _ in missing}))
    densities = ",".join(f"{d:g}" for d in sorted({d for _, d in missing if d is not None}))
    profile = f"`sidco profile --device {device}`"
    if trace_id is None:
        return f"run {profile} (layouts have no gradients to replay)"
    row = store.trace(trace_id)
    path = row["path"] if row else "TRACE"
    return f"run `sidco replay {path} --compressors {names} --densities {densities} --device {device}` or {profile}"


def compression_profile(
    store: Store,
    *,
    trace_id: int | None,
    device: str,
    pairs: Sequence[tuple[str, float | None]],
    profile_file: str | Path | None = None,
    numel: int | None = None,
) -> CompressionProfile:
    """The compression costs of ``pairs`` ((compressor, density) list; ``none`` needs none) on
    ``device`` for the trace ``trace_id`` (``None`` for a layout), by the policy of this module.

    ``numel``: the bucket size (elements) the costs will mostly be asked for, for tiers that
    model rather than measure. Raises :class:`MissingCosts` naming the first uncovered pair and
    the command that measures it.
    """
    wanted = list(dict.fromkeys((c, density_key(d)) for c, d in pairs if c != "none"))
    costs: dict[Key, CompressionCost] = {}
    if profile_file is not None:
        from_file = read_profile_file(profile_file, device)
        costs.update({k: v for k, v in from_file.items() if k in wanted})
    request = CostRequest(store, trace_id, device, numel)
    for _, tier in TIERS:
        missing = [k for k in wanted if k not in costs]
        if not missing:
            break
        costs.update({k: v for k, v in tier(request, missing).items() if k in missing})
    missing = [k for k in wanted if k not in costs]
    if missing:
        compressor, density = missing[0]
        pair = compressor if density is None else f"{compressor}@{density:g}"
        raise MissingCosts(f"no compression costs for {pair} on {device}: "
                           f"{_fill_command(store, trace_id, device, missing)}")
    sources = list(dict.fromkeys(costs[k].source for k in wanted))
    return CompressionProfile({k: costs[k] for k in wanted}, "; ".join(sources) or "none")
