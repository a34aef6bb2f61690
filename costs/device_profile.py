"""Measured device profiles: compress/decompress times of compressors on one device, as data.

The file format (what ``sidco profile`` writes, ``--profile FILE`` reads and ``profiles/``
ships)::

    {"device": "h200", "source": "how and when it was measured",
     "rows": [{"compressor": "topk", "density": 0.01, "numel": 1048576,
               "compress_s": 0.0012, "decompress_s": 0.0001, "wire_bytes": 83888}, ...]}

``rows`` carry the fields of replay rows (seconds, elements, bytes; ``wire_bytes`` optional).
Optional keys written by ``sidco profile``: ``created`` (ISO date, UTC), ``identity`` (CPU
model and flags or GPU name, torch version, threads), ``method`` (warm-up, repeats, statistic),
``device_model`` (the host's measured :class:`~costs.devices.Device` numbers, for ``cpu``);
rows may add ``compress_min_s``, ``compress_max_s``, ``decompress_min_s`` (``compress_s`` and
``decompress_s`` are then the median call's), ``stages``, ``backend`` and the loop counts of the
call reported (``rounds``, ``trim``, ``steps``, ``pool``, ``collects``, ``hits``: the
elements each native selecting pass kept, a list; for SIDCo ``planned`` and ``deepened``, the
stages it planned and added within the call, beside the ``stages`` it used).

Any row may carry ``source`` (where it was published or how it was measured). A row may also
be a *kernel row*, the timing of one kernel rather than of a compressor (how the
``profiles/published-<gpu>.json`` files hold published GPU measurements)::

    {"kernel": "copy", "numel": 40000000, "element_bytes": 4, "seconds": 0.000128,
     "launches": 0, "syncs": 0, "source": "where it was published, device, software"}

``kernel``: one of :data:`KERNELS`; ``numel`` elements of ``element_bytes`` bytes each
(default 4; a ``sort``'s keys); ``out_bytes`` (``copy`` and ``cast``, default
``element_bytes``): the bytes written per element; ``value_bytes`` (``sort``, default 0): the
payload sorted with each key; ``seconds``: one call as published; ``launches``/``syncs``
(default 0): the kernel launches and device→host synchronisations the published timing
included (a timing by CUDA events around queued work includes none; ``time.time()`` around one
call and a ``synchronize`` includes one of each); ``source`` is required. Kernel rows are kept
apart (:attr:`DeviceProfile.kernels`): they are no compressor's costs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.files import read_regular
from units import check_density

REQUIRED = ("compressor", "density", "numel", "compress_s", "decompress_s")
KERNELS = ("copy", "read", "fill", "launch", "cast", "sort", "topk", "matmul")
"""Kernel rows' kinds: ``copy`` reads and writes ``numel`` elements (a ``copy_``, or a streaming
``A = c·B``), ``read`` reads them (a reduction), ``fill`` writes them, ``launch`` is the host
cost of issuing one eager operation (``numel`` 1), ``cast`` converts ``numel`` elements of
``element_bytes`` into ``out_bytes`` each (``x.to(dtype)``), ``sort`` is a radix sort of
``numel`` keys of ``element_bytes`` (with ``value_bytes`` of payload each), ``topk`` keeps ``k``
of ``numel`` elements (``torch.topk`` or another selection, as its ``source`` says), ``matmul``
is a product with ``numel`` outputs (``rows`` rows, default a square) over an ``inner`` dimension."""

MAX_PROFILE_BYTES = 4 * 2**20
"""Largest profile file read (bytes): 4 MiB; a measured profile is tens of kilobytes."""

MAX_PROFILE_ROWS = 20_000
"""Most rows a profile may hold: ``sidco profile`` writes one per (compressor, density, size)."""

MAX_CALL_S = 3600.0
"""Longest compress or decompress call a row may report (seconds): one hour. A bucket that
takes longer is no measurement of a training step, and larger finite numbers (1e308) overflow
the model's sums."""

MAX_ROW_NUMEL = 2**40
"""Largest bucket a row may describe (elements): 2^40, 4 TiB of fp32 gradient."""

MAX_WIRE_BYTES_PER_ELEMENT = 16
"""Most bytes a message may carry per element of its bucket: every element sent as an fp64
value with an int64 index. A row's ``wire_bytes`` above ``16 · numel`` is refused."""



def save_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path``, its folder created, replacing the file atomically (a temporary
    file beside it, renamed into place); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path

@dataclass(frozen=True)
class DeviceProfile:
    """One device's measured compression costs (see the module docstring for the fields)."""

    device: str
    source: str
    rows: tuple[Mapping[str, Any], ...]
    created: str = ""
    identity: Mapping[str, Any] = field(default_factory=dict)
    method: Mapping[str, Any] = field(default_factory=dict)
    device_model: Mapping[str, Any] | None = None
    kernels: tuple[Mapping[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """The cost source of these numbers: ``measured h200 2026-12-01``."""
        return f"measured {self.device}" + (f" {self.created}" if self.created else "")

    def to_json(self) -> str:
        """The profile in the file format."""
        data: dict[str, Any] = {"device": self.device, "source": self.source,
                                "rows": [dict(r) for r in (*self.rows, *self.kernels)]}
        if self.created:
            data["created"] = self.created
        if self.identity:
            data["identity"] = dict(self.identity)
        if self.method:
            data["method"] = dict(self.method)
        if self.device_model is not None:
            data["device_model"] = dict(self.device_model)
        return json.dumps(data, indent=1, sort_keys=True)

    def save(self, path: str | Path) -> Path:
        """Write the profile to ``path`` (created with its folder; replaced atomically)."""
        return save_text(path, self.to_json() + "\n")

    def pairs(self) -> list[tuple[str, float]]:
        """The (compressor, density) pairs measured."""
        from costs.profile import density_key

        return sorted({(str(r["compressor"]), density_key(r["density"])) for r in self.rows})


def _number(row: Mapping[str, Any], key: str, where: str, integer: bool = False) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {key} must be a number >= 0, got {value!r}")
    if integer and (int(value) != value or value < 1):
        raise ValueError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    return value


def from_json(text: str | bytes, origin: str = "profile") -> DeviceProfile:
    """Parse and check a profile; ValueError (one line, naming ``origin``) on any problem."""
    if len(text) > MAX_PROFILE_BYTES:
        raise ValueError(f"{origin}: larger than {MAX_PROFILE_BYTES} bytes, the most a profile may hold")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{origin}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"{origin}: not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: expected an object with device, source and rows")
    for key in ("device", "source"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ValueError(f"{origin}: {key!r} must be a non-empty string")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{origin}: 'rows' must be a non-empty list")
    if len(rows) > MAX_PROFILE_ROWS:
        raise ValueError(f"{origin}: {len(rows)} rows, more than the {MAX_PROFILE_ROWS} a profile may hold")
    checked, kernels = [], []
    seen: dict[tuple[str, float, int], tuple[int, tuple[Any, ...]]] = {}
    for i, row in enumerate(rows):
        where = f"{origin}: row {i}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object")
        if row.get("source") is not None and not isinstance(row["source"], str):
            raise ValueError(f"{where}: source must be a string")
        if "kernel" in row:
            kernels.append(_kernel_row(row, where))
            continue
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if not isinstance(row["compressor"], str) or not row["compressor"]:
            raise ValueError(f"{where}: compressor must be a name")
        density = check_density(_number(row, "density", where), f"{where}: density")
        numel = _number(row, "numel", where, integer=True)
        if numel > MAX_ROW_NUMEL:
            raise ValueError(f"{where}: numel {numel:g} is more than the {MAX_ROW_NUMEL} elements a row may describe")
        for key in ("compress_s", "decompress_s"):
            if _number(row, key, where) > MAX_CALL_S:
                raise ValueError(f"{where}: {key} {row[key]:g} s is longer than the {MAX_CALL_S:g} s a call may take")
        if row.get("wire_bytes") is not None and _number(row, "wire_bytes", where) > MAX_WIRE_BYTES_PER_ELEMENT * numel:
            raise ValueError(f"{where}: wire_bytes {row['wire_bytes']:g} is more than {MAX_WIRE_BYTES_PER_ELEMENT} bytes "
                             f"per element of its {numel:g}-element bucket")
        key = (row["compressor"], float(density), int(numel))
        values = tuple(row.get(k) for k in ("compress_s", "decompress_s", "wire_bytes"))
        if seen.setdefault(key, (i, values))[1] != values:
            raise ValueError(f"{where}: {row['compressor']} at density {density:g} on {int(numel)} elements "
                             f"contradicts row {seen[key][0]}; keep one measurement per (compressor, density, numel)")
        checked.append(dict(row))
    for key in ("identity", "method", "device_model"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ValueError(f"{origin}: {key!r} must be an object")
    return DeviceProfile(
        data["device"].strip().lower(), data["source"], tuple(checked), str(data.get("created", "")),
        data.get("identity") or {}, data.get("method") or {}, data.get("device_model"), tuple(kernels),
    )


def _kernel_row(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A checked kernel row (the module docstring), defaults filled in."""
    if row["kernel"] not in KERNELS:
        raise ValueError(f"{where}: kernel must be one of {', '.join(KERNELS)}, got {row['kernel']!r}")
    if not isinstance(row.get("source"), str) or not row["source"].strip():
        raise ValueError(f"{where}: a kernel row needs a source (where it was published)")
    out = {**row, "element_bytes": row.get("element_bytes", 4), "launches": row.get("launches", 0),
           "syncs": row.get("syncs", 0)}
    out["out_bytes"] = row.get("out_bytes", out["element_bytes"])
    out["value_bytes"] = row.get("value_bytes", 0)
    _number(out, "numel", where, integer=True)
    _number(out, "seconds", where)
    _number(out, "value_bytes", where)
    if not out["seconds"] > 0 or not _number(out, "element_bytes", where) > 0 or not _number(out, "out_bytes", where) > 0:
        raise ValueError(f"{where}: seconds, element_bytes and out_bytes must be > 0")
    for key in ("launches", "syncs"):
        if int(_number(out, key, where)) != out[key]:
            raise ValueError(f"{where}: {key} must be a whole number, got {out[key]!r}")
    needed = {"topk": ("k",), "matmul": ("inner",)}.get(out["kernel"], ())
    for key in (*needed, *(("rows",) if "rows" in out else ())):
        _number(out, key, where, integer=True)
    if out["kernel"] == "topk" and out["k"] > out["numel"]:
        raise ValueError(f"{where}: k must be at most numel")
    return out


def load(path: str | Path) -> DeviceProfile:
    """Read the profile file at ``path``: a regular file (never a FIFO, device or directory, so
    reading cannot block or run without end) of at most :data:`MAX_PROFILE_BYTES` bytes
    (:func:`traces.files.read_regular`). ValueError (one line, naming ``path``) on any problem."""
    return from_json(read_regular(path, MAX_PROFILE_BYTES, "profile"), str(Path(path)))
