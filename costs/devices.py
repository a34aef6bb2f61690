"""Device models: the numbers a cost model needs about one accelerator or this host.

>>> from costs import devices
>>> devices.names()
['cpu', 'v100', 'a100', 'h100', 'h200']
>>> devices.get("h200").memory_bandwidth_Bps
4300000000000.0

Every number carries its source (``Device.sources``; docs/devices.md cites them). A GPU is one
file, ``profiles/devices/<name>.json`` (:func:`read_gpu`): its spec-sheet figures, each citing its
source; the rest follows from rules. GPU figures come from the vendors' spec sheets, except where
measurements exist: the sustained bandwidth,
launch and sync latency are fitted to published kernel timings on such GPUs
(``profiles/published-<gpu>.json``, :mod:`costs.published`; the H200's bandwidth from a copy
measured on one); the per-operation rates a GPU needs for top-k, sorting,
compaction and gathers are derived from its memory bandwidth by the rules written next to
them (:data:`GPU_RULES`). ``cpu`` is this host: its numbers are measured by an explicit job
(``sidco profile --run-on cpu``, :func:`measuring.host.measure_host`) and stored; until then :func:`get`
returns the stated defaults of :data:`CPU_DEFAULTS`. Nothing here is ever timed implicitly.

Units: bytes/s, FLOP/s, seconds, seconds per element.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import profiles
from costs import published
from machine import cache_dir, host_identity, host_key

LAYOUT_UTILISATION = 0.3
"""Fraction of a CPU's measured peak that a layout's FLOPs are assumed to run at (stated, not
fitted: no published CPU training table is shipped). GPUs take the rule fitted to published
training throughput instead (:mod:`costs.throughput`). ``--device-flops`` overrides both."""


@dataclass(frozen=True)
class Device:
    """One device, as a cost model sees it.

    ``memory_bandwidth_Bps``: sustained read bandwidth of device memory (bytes/s);
    ``write_bandwidth_Bps``: sustained write bandwidth (bytes/s; on GPUs the same number);
    ``fp32_flops``/``bf16_flops``: dense peak FLOP/s (bf16 through tensor cores; a device
    without bf16 units carries its fp32 rate); ``launch_s``: host time to issue one kernel
    (one eager torch op on a CPU); ``sync_s``: one device→host synchronisation (``.item()``,
    ``nonzero`` sizing); ``pcie_Bps``: host link bandwidth (bytes/s); ``topk_s_per_element``: seconds per input
    element of ``torch.topk`` as ``((density, s), ...)`` points (:meth:`topk_s` interpolates),
    ``topk_cache_s_per_element`` the same when the input fits in the cache; ``sort_s_per_element``: per element of
    ``torch.sort``; ``gather_s_per_element``: per element moved by ``index_select`` /
    ``index_add_`` / ``index_copy_``; ``compact_s_per_element``: per input element of
    ``nonzero``; ``op_s_per_element``: the compute time per element of each kind of streaming
    kernel (:data:`compressors.work.declare.KINDS`; a kernel takes the longer of its memory traffic and
    this); ``alloc_threshold_bytes`` / ``fault_s_per_byte``: a fresh buffer at least this large
    is mapped anew by the allocator and costs this per byte in page faults (GPU caching
    allocators reuse memory: no threshold); ``cache_bytes``: last-level cache; ``cache_speedup``: how much faster
    per-element work runs when a call's working set fits in it (1 = not modelled); ``sort_s_by_size``: seconds per element of
    ``torch.sort`` of int64 keys as ``((length, s), ...)`` points (:meth:`sort_s` interpolates; a CPU's
    rate changes with the length, by a factor of 3 on this testbed's torch), ``()`` where
    ``sort_s_per_element`` holds for every length; ``cache_speedup_by_fraction``: how much faster than
    ``memory_bandwidth_Bps`` a working set of each fraction of ``cache_bytes`` reads when read again,
    as ``((fraction, speed-up), ...)`` points (:meth:`reuse_speedup` interpolates; on this testbed's
    CPU 3.5× up to a quarter of the cache, 2.5× at half, 1.3× at the whole of it), ``()`` where
    ``cache_speedup`` holds below ``cache_bytes``. ``sources`` maps each field name to where its value comes from;
    ``measured`` is the measurement date (ISO, UTC) or ``""`` for spec-sheet devices;
    ``identity`` describes the hardware (CPU model and flags, GPU name, torch version).
    ``fp16_flops``/``tf32_flops``: dense fp16 and TF32 tensor-core peaks (FLOP/s; 0 where the
    device has no such units: fp16 then runs at ``bf16_flops``, TF32 at ``fp32_flops``).
    """

    name: str
    kind: str
    label: str
    memory_bandwidth_Bps: float
    write_bandwidth_Bps: float
    fp32_flops: float
    bf16_flops: float
    launch_s: float
    sync_s: float
    pcie_Bps: float
    topk_s_per_element: tuple[tuple[float, float], ...]
    topk_cache_s_per_element: tuple[tuple[float, float], ...]
    sort_s_per_element: float
    gather_s_per_element: float
    compact_s_per_element: float
    op_s_per_element: Mapping[str, float]
    alloc_threshold_bytes: float
    fault_s_per_byte: float
    cache_bytes: float
    cache_speedup: float
    sort_s_by_size: tuple[tuple[float, float], ...] = ()
    cache_speedup_by_fraction: tuple[tuple[float, float], ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    measured: str = ""
    identity: Mapping[str, Any] = field(default_factory=dict)
    fp16_flops: float = 0.0
    tf32_flops: float = 0.0

    def topk_s(self, density: float, cached: bool = False) -> float:
        """Seconds per input element of a top-k keeping ``density`` of it (linear in log density);
        ``cached``: its input fits in the cache."""
        return _interpolate(self.topk_cache_s_per_element if cached else self.topk_s_per_element, density)

    def reuse_speedup(self, working_set_bytes: float) -> float:
        """How much faster than from memory a call whose working set is ``working_set_bytes``
        reads or rewrites what it touched before (linear in the fraction of the cache
        between the points of :attr:`cache_speedup_by_fraction`, 1 beyond the last; without them
        :attr:`cache_speedup` below :attr:`cache_bytes`, else 1)."""
        if not 0 < working_set_bytes:
            return 1.0
        if not self.cache_speedup_by_fraction:
            return self.cache_speedup if working_set_bytes < self.cache_bytes else 1.0
        return _interpolate(self.cache_speedup_by_fraction, working_set_bytes / self.cache_bytes, log=False,
                            beyond=1.0)

    def sort_s(self, elements: float) -> float:
        """Seconds per element of one sort of ``elements`` keys (linear in log length between the
        measured lengths of :attr:`sort_s_by_size`, else :attr:`sort_s_per_element`)."""
        return _interpolate(self.sort_s_by_size, elements) if self.sort_s_by_size else self.sort_s_per_element

    def select_s(self, kept: float, cached: bool = False) -> float | None:
        """Seconds per input element of a fused selecting pass that keeps ``kept`` of its input,
        memory traffic included (linear in log kept; measured in cache and from memory:
        ``op_s_per_element`` keys ``native_select@<kept>`` / ``native_select_memory@<kept>``);
        ``None`` when this device has no such measurement."""
        prefix = "native_select@" if cached else "native_select_memory@"
        points = [(float(k[len(prefix):]), t) for k, t in self.op_s_per_element.items() if k.startswith(prefix)]
        return _interpolate(points, kept) if points else None

    def whole_s(self, kind: str, kept: float, cached: bool = False) -> float | None:
        """Seconds per element of a streaming kernel of ``kind`` timed whole, memory traffic
        included, where this device has such a measurement: a selecting pass by the fraction it
        keeps (:meth:`select_s`), a rank-1 product written to memory (``op_s_per_element``
        ``outer_memory``, beyond the cache); ``None`` otherwise (the kernel's roofline then)."""
        if kind == "native_select":
            return self.select_s(kept, cached)
        if kind == "outer" and not cached:
            return self.op_s_per_element.get("outer_memory")
        return None

    @property
    def amp_dtype(self) -> str:
        """What mixed precision (``amp``) computes in here: ``bf16`` where the device has bf16
        units (A100 and later, a CPU's autocast), ``fp16`` on a GPU without them (V100)."""
        has_bf16 = self.bf16_flops > self.fp32_flops
        return "fp16" if self.kind == "gpu" and not has_bf16 and self.fp16_flops > 0 else "bf16"

    def dtype(self, precision: str) -> str:
        """The number format a ``precision`` (``fp32``, ``tf32``, ``amp``) runs its matrix
        products in here: ``amp`` as :attr:`amp_dtype`, ``tf32`` as ``fp32`` where there are no
        TF32 units (V100, a CPU)."""
        if precision == "amp":
            return self.amp_dtype
        if precision == "tf32":
            return "tf32" if self.tf32_flops > 0 else "fp32"
        if precision == "fp32":
            return "fp32"
        raise ValueError(f"unknown precision {precision!r}; choose from fp32, tf32, amp")

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s of ``precision`` (``fp32``, ``tf32``, ``amp``) on this device, in the
        format :meth:`dtype` says it runs in."""
        return {"fp32": self.fp32_flops, "tf32": self.tf32_flops or self.fp32_flops,
                "fp16": self.fp16_flops or self.bf16_flops, "bf16": self.bf16_flops}[self.dtype(precision)]

    @property
    def modelled(self) -> bool:
        """Whether the cost model and the compute rule know this device's numbers: every device
        but a GPU whose model a trace did not record (:func:`unrecorded_gpu`)."""
        return self.name != UNRECORDED_GPU

    def label_for_source(self) -> str:
        """How cost sources name this device: ``measured cpu 2026-12-01`` or ``model a100``."""
        return f"{self.name} {self.measured}" if self.measured else self.name

    def to_json(self) -> dict[str, Any]:
        """The device as a JSON-able dict (:func:`from_json` reads it back)."""
        data = asdict(self)
        data["sources"] = dict(self.sources)
        data["identity"] = dict(self.identity)
        return data


def _interpolate(points: Sequence[tuple[float, float]], x: float, *, log: bool = True,
                 beyond: float | None = None) -> float:
    """``y`` at ``x`` from ``(x, y)`` points, linear in ``log x`` (in ``x`` with ``log=False``), held
    at the first point below them and at the last one above them (``beyond`` there when given)."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            share = math.log(x / x0) / math.log(x1 / x0) if log else (x - x0) / (x1 - x0)
            return y0 + share * (y1 - y0)
    return points[-1][1] if beyond is None else beyond


def from_json(data: Mapping[str, Any]) -> Device:
    """A :class:`Device` from :meth:`Device.to_json` output; ValueError on missing or bad fields."""
    names = {f for f in Device.__dataclass_fields__}
    optional = {"sources", "measured", "identity", "sort_s_by_size", "cache_speedup_by_fraction", "fp16_flops",
                "tf32_flops"}
    missing = names - set(data) - optional
    if missing:
        raise ValueError(f"device description lacks {', '.join(sorted(missing))}")
    values = {k: data[k] for k in names if k in data}
    for key in ("sort_s_by_size", "cache_speedup_by_fraction"):
        values[key] = tuple((float(m), float(t)) for m, t in values.get(key, ()))
    absent = {k: "absent from this measurement (an older one): the default" for k in optional - set(data)}
    values["sources"] = {**absent, **dict(values.get("sources") or {})}
    for key in ("topk_s_per_element", "topk_cache_s_per_element"):
        values[key] = tuple((float(d), float(t)) for d, t in values[key])
        if not values[key]:
            raise ValueError(f"device {values['name']}: {key} needs at least one (density, s) point")
    values["op_s_per_element"] = {str(k): float(v) for k, v in dict(values["op_s_per_element"]).items()}
    if "native" in values["op_s_per_element"]:  # measured before 2026-12-01: "native" timed the selecting pass
        values["op_s_per_element"].setdefault("native_select", values["op_s_per_element"]["native"])
    if "reduce" in values["op_s_per_element"]:  # measured before aminmax had a kind of its own
        values["op_s_per_element"].setdefault("minmax", values["op_s_per_element"]["reduce"])
    for key in (names & set(values)) - {"name", "kind", "label", "sources", "measured", "identity", "topk_s_per_element",
                                        "topk_cache_s_per_element", "op_s_per_element", "sort_s_by_size",
                                        "cache_speedup_by_fraction"}:
        number = float(values[key])
        if not number >= 0 or number != number:
            raise ValueError(f"device {values['name']}: {key} must be a number >= 0, got {values[key]!r}")
        values[key] = number
    return Device(**values)


# --- GPUs: spec sheets, with the per-operation rates derived from bandwidth ---------------------

GPU_RULES = {
    "topk": "PyTorch's multi-block radix select on fp32: 4 digit passes of 8 bits plus one gather "
            "pass, each reading 4 bytes per element: 20 bytes per element at the read bandwidth",
    "sort": "CUB radix sort (Onesweep): one pass per 8-bit digit of the key, each reading and writing every key and "
            "its payload once (the ~2n global accesses per digit pass of Adinets & Merrill, arXiv:2206.01784): "
            "radix_sort_bytes(8) = 128 bytes per int64 key at the bandwidth; checked against the published A100 "
            "rate of 32-bit keys (profiles/published-a100.json), which it prices 39 % fast",
    "gather": "an uncoalesced 4-byte access moves a 32-byte sector; plus the 8-byte index: 40 bytes "
              "per element",
    "compact": "nonzero over a bool mask: a counting pass and a writing pass over 1 byte per element "
               "(2 bytes per element; the 8-byte outputs are charged as bytes written)",
    "ops": "streaming kernels are bound by memory on a GPU (no per-element compute charged), except "
           "logarithms: one special-function unit per 8 fp32 lanes, fp32 FLOP/s ÷ 16 elements/s",
    "alloc": "the caching allocator reuses device memory: fresh buffers cost nothing per call",
    "launch": "per eager operation, the median of the published launch rows of profiles/published-<gpu>.json "
              "(costs.published): 7 µs, the launch overhead of meta-pytorch/autoparallel's compute cost model "
              "(PR #146, 2025), fitted to runtimes measured on H100s (every operator costs at least 7 µs); taken "
              "for every GPU, measured on none here",
    "sync": "fitted with the bandwidth to the device's published copy rows that include a synchronisation "
            "(torch copy_ then torch.cuda.synchronize(), timed from Python: what they take beyond one launch and "
            "their bytes at the bandwidth); a GPU without such rows takes the median of the others (costs.published)",
}


def radix_sort_bytes(key_bytes: float, value_bytes: float = 0.0) -> float:
    """Bytes a GPU radix sort moves per key (:data:`GPU_RULES` ``sort``): ``key_bytes`` passes
    of one 8-bit digit, each reading and writing the key and its ``value_bytes`` of payload."""
    return key_bytes * 2.0 * (key_bytes + value_bytes)


def _bandwidth_rules(bandwidth: float) -> dict[str, Any]:
    """The fields of a GPU that :data:`GPU_RULES` derive from its sustained ``bandwidth`` (bytes/s):
    top-k, sort, gather and compaction rates, and the bandwidths themselves."""
    return {"memory_bandwidth_Bps": bandwidth, "write_bandwidth_Bps": bandwidth,
            "topk_s_per_element": ((1.0, 20.0 / bandwidth),), "topk_cache_s_per_element": ((1.0, 20.0 / bandwidth),),
            "sort_s_per_element": radix_sort_bytes(8) / bandwidth,
            "gather_s_per_element": 40.0 / bandwidth, "compact_s_per_element": 2.0 / bandwidth}


def with_bandwidth(device: Device, bandwidth: float, sync_s: float | None = None, name: str | None = None) -> Device:
    """GPU ``device`` with another sustained ``bandwidth`` (bytes/s) and every rate :data:`GPU_RULES`
    derive from it, and ``sync_s`` (s) when given: the same GPU rules refitted without some
    published rows (:mod:`costs.kernel_bands`), or a GPU that is not modelled, described by
    its bandwidth (``name``)."""
    if device.kind != "gpu":
        raise ValueError(f"bandwidth rules are modelled for GPUs only, not {device.name!r}")
    changed = {**_bandwidth_rules(bandwidth), **({} if sync_s is None else {"sync_s": sync_s})}
    return replace(device, **changed, **({"name": name, "label": name} if name else {}))


DEVICES_DIR = profiles.HERE / "devices"
"""One file per device: per GPU, ``<name>.json``, what its spec sheet (or a measurement) says, each
field with its source, every other number from the rules above (:func:`read_gpu`); ``cpu.json``,
this host's stated defaults (:data:`CPU_FILE`)."""

CPU_FILE = DEVICES_DIR / "cpu.json"
"""This host's stated defaults (``defaults``: :class:`Device` fields in SI units) until ``sidco
profile --run-on cpu`` has measured it, each field citing its source; every other file of
:data:`DEVICES_DIR` is a GPU."""

SPEC_FIELDS = ("fp32_flops", "bf16_flops", "fp16_flops", "tf32_flops", "pcie_Bps")
"""The numbers a device file gives (FLOP/s, bytes/s), each ``>= 0``; ``memory_bandwidth_Bps`` beside them."""

FILE_FIELDS = ("name", "kind", "label", "match", "announced", "memory_bandwidth_Bps", *SPEC_FIELDS, "sources")
"""Every key of a device file; ``sources`` cites each one but ``name``, ``kind``, ``label`` and itself."""


def read_gpu(path: Path) -> dict[str, Any]:
    """The checked contents of one device file (:data:`FILE_FIELDS`); ValueError naming the file
    and the field otherwise. ``memory_bandwidth_Bps``: bytes/s read plus written, or ``null`` to fit
    it to ``profiles/published-<name>.json`` (its source then names the peak it is a fraction of);
    ``match``: the part of the name CUDA gives the device that names the GPU; ``announced``:
    ``YYYY-MM``, the order devices are listed in."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"device file {path}: {exc}") from None
    if not isinstance(data, dict) or set(data) != set(FILE_FIELDS):
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"device file {path}: needs exactly the keys {', '.join(FILE_FIELDS)}, has {keys}")
    if data["name"] != Path(path).stem or data["kind"] != "gpu":
        raise ValueError(f"device file {path}: name must be the file's name ({Path(path).stem}) and kind gpu")
    for key in ("label", "match", "announced"):
        if not isinstance(data[key], str) or not data[key]:
            raise ValueError(f"device file {path}: {key} must be a non-empty string")
    bandwidth = data["memory_bandwidth_Bps"]
    for key, value in ((k, data[k]) for k in ("memory_bandwidth_Bps", *SPEC_FIELDS)):
        if key == "memory_bandwidth_Bps" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"device file {path}: {key} must be a number >= 0, got {value!r}")
    if (bandwidth is not None and not bandwidth > 0) or not data["fp32_flops"] > 0:
        raise ValueError(f"device file {path}: memory_bandwidth_Bps and fp32_flops must be > 0")
    sources = data["sources"]
    cited = ("match", "announced", "memory_bandwidth_Bps", *SPEC_FIELDS)
    if not isinstance(sources, dict) or any(not isinstance(sources.get(k), str) or not sources[k] for k in cited):
        missing = [k for k in cited if not isinstance(sources, dict) or not sources.get(k)]
        raise ValueError(f"device file {path}: sources must cite {', '.join(missing)}")
    return data


def _gpu(data: Mapping[str, Any]) -> Device:
    """A GPU from its device file (:func:`read_gpu`) and its published rows (:mod:`costs.published`):
    launch and sync always from them; the bandwidth from them when the file gives none."""
    name, sources = data["name"], data["sources"]
    bandwidth, bandwidth_source = data["memory_bandwidth_Bps"], sources["memory_bandwidth_Bps"]
    found, launch = published.numbers(name), published.launch_s()
    if launch is None or (bandwidth is None and (found is None or found.bandwidth_Bps is None)):
        raise RuntimeError(f"no published rows for {name} in profiles/ (published-<gpu>.json): reinstall the testbed")
    if bandwidth is None:
        bandwidth = found.bandwidth_Bps
        bandwidth_source = (f"published: fitted to the {found.copy_rows} copy rows of profiles/{found.file} "
                            f"({bandwidth / 1e9:.0f} GB/s read + write, {bandwidth_source}; docs/devices.md cites them)")
    own_sync = found is not None and found.sync_s is not None
    sync = found.sync_s if own_sync else published.sync_s()
    sync_source = (f"{GPU_RULES['sync']}: fitted to profiles/{found.file}" if own_sync
                   else f"{GPU_RULES['sync']}: none here, the median of the other GPUs'")
    fp32 = float(data["fp32_flops"])
    return Device(
        name=name, kind="gpu", label=data["label"], fp16_flops=float(data["fp16_flops"]),
        tf32_flops=float(data["tf32_flops"]), fp32_flops=fp32, bf16_flops=float(data["bf16_flops"]), launch_s=launch,
        sync_s=sync, pcie_Bps=float(data["pcie_Bps"]),
        **_bandwidth_rules(float(bandwidth)), op_s_per_element={"log": 16.0 / fp32},
        alloc_threshold_bytes=math.inf, fault_s_per_byte=0.0,
        cache_bytes=0.0, cache_speedup=1.0,
        sources={
            "memory_bandwidth_Bps": bandwidth_source, "write_bandwidth_Bps": bandwidth_source,
            **{key: sources[key] for key in SPEC_FIELDS},
            "launch_s": GPU_RULES["launch"], "sync_s": sync_source,
            "topk_s_per_element": GPU_RULES["topk"], "topk_cache_s_per_element": GPU_RULES["topk"],
            "sort_s_per_element": GPU_RULES["sort"],
            "gather_s_per_element": GPU_RULES["gather"], "compact_s_per_element": GPU_RULES["compact"],
            "op_s_per_element": GPU_RULES["ops"], "alloc_threshold_bytes": GPU_RULES["alloc"],
            "fault_s_per_byte": GPU_RULES["alloc"],
            "cache_bytes": "L2 not modelled: every pass is charged at memory bandwidth",
            "cache_speedup": "L2 not modelled: every pass is charged at memory bandwidth",
            "sort_s_by_size": "no table: a radix sort's rate per element does not depend on the length",
            "cache_speedup_by_fraction": "L2 not modelled: every pass is charged at memory bandwidth",
        },
        identity={"gpu": data["label"]},
    )


def gpu_files(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every device file of ``directory`` (default :data:`DEVICES_DIR`), checked, in the order
    the GPUs were announced."""
    paths = sorted(p for p in Path(directory or DEVICES_DIR).glob("*.json") if p.name != CPU_FILE.name)
    return sorted((read_gpu(path) for path in paths), key=lambda d: (d["announced"], d["name"]))


def load_gpus(directory: Path | None = None) -> dict[str, Device]:
    """The GPUs of the device files in ``directory`` (default :data:`DEVICES_DIR`), by name."""
    return {data["name"]: _gpu(data) for data in gpu_files(directory)}


def cuda_names(directory: Path | None = None) -> dict[str, str]:
    """Device name by the part of a CUDA device's name that names it (``{"H200": "h200", ...}``),
    newest first, from the device files in ``directory`` (default :data:`DEVICES_DIR`)."""
    return {data["match"]: data["name"] for data in reversed(gpu_files(directory))}


GPUS: dict[str, Device] = load_gpus()


OLD_TOPK_S_PER_ELEMENT = 2.5576 / 100 / 2_000_000
"""Seconds per input element of ``torch.topk`` on one large fp32 slice before PyTorch's
multi-block radix select (pytorch/pytorch#71081, in PyTorch 1.12, 2022): one thread block per
slice, so one SM makes every pass. Published: pytorch/pytorch#22812 (2019, PyTorch 1.1, CUDA
10.0, a Quadro GP100): 100 calls of ``topk(1000, sorted=False)`` on 2,000,000 fp32 took
2.5576 s, 25.6 ms a call, 12.8 ns an element (``sort`` of the same: 3.2 ms). No V100 figure of
that era was found: a V100 is charged the GP100's rate (one SM either way, at a similar clock),
an unmeasured input whose cost band is a factor of 2."""

ERAS = {
    "pytorch-1.3": {
        "topk_s_per_element": ((1.0, OLD_TOPK_S_PER_ELEMENT),),
        "topk_cache_s_per_element": ((1.0, OLD_TOPK_S_PER_ELEMENT),),
        "source": "PyTorch 1.3's single-block torch.topk: 12.8 ns per element, measured on a Quadro GP100 with "
                  "PyTorch 1.1 (pytorch/pytorch#22812), unmeasured on this GPU",
    },
}
"""Kernel costs of earlier PyTorch releases, by era: ``get("v100@pytorch-1.3")`` is the V100 with
the fields given here (the SIDCo paper's code pins PyTorch 1.3); every other number is today's."""


def in_era(device: Device, era: str) -> Device:
    """``device`` with the kernel costs of PyTorch ``era`` (:data:`ERAS`), named ``<name>@<era>``."""
    if era not in ERAS:
        raise ValueError(f"unknown PyTorch era {era!r}; choose from {', '.join(ERAS)}")
    if device.kind != "gpu":
        raise ValueError(f"eras are modelled for GPUs only, not {device.name!r}")
    fields = {k: v for k, v in ERAS[era].items() if k != "source"}
    sources = {**device.sources, **{k: ERAS[era]["source"] for k in fields}}
    return replace(device, name=f"{device.name}@{era}", label=f"{device.label} ({era} kernels)", sources=sources,
                   **fields)


def base_name(name: str) -> str:
    """The device a name stands for without its era: ``v100`` for ``v100@pytorch-1.3``."""
    return name.split("@", 1)[0]


def compute_ratio(captured_on: Device, target: Device, precision: str = "amp") -> float:
    """Factor on compute times measured on ``captured_on`` to project them onto ``target``
    running in ``precision``.

    The rule: the ratio of the dense peaks, fp32 on the capturing device (traces are captured
    in fp32) and the precision's on the target (:meth:`Device.peak_flops`: mixed precision on
    fp16 tensor cores on a V100, bf16 on later GPUs); with equal utilisation on both,
    utilisation cancels. 1 when both are the same device."""
    if captured_on.name == target.name:
        return 1.0
    return captured_on.fp32_flops / target.peak_flops(precision)


# --- this host -------------------------------------------------------------------------------

CPU_FIELDS = ("memory_bandwidth_Bps", "write_bandwidth_Bps", "fp32_flops", "bf16_flops", "launch_s", "sync_s",
              "pcie_Bps", "topk_s_per_element", "topk_cache_s_per_element", "sort_s_per_element",
              "gather_s_per_element", "compact_s_per_element", "op_s_per_element", "alloc_threshold_bytes",
              "fault_s_per_byte", "cache_bytes", "cache_speedup")
"""The fields a CPU's stated defaults give (its tensor-unit peaks are 0: :data:`NO_TENSOR_UNITS`)."""


def read_cpu(path: Path = CPU_FILE) -> dict[str, Any]:
    """The checked contents of the host's stated defaults (:data:`CPU_FILE`): ``defaults`` holds
    exactly :data:`CPU_FIELDS` (``(x, s)`` points as tuples), ``sources`` cites each; ValueError
    naming the file and the field otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"device file {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "cpu" or not isinstance(data.get("defaults"), dict):
        raise ValueError(f"device file {path}: needs kind cpu and its defaults")
    defaults = data["defaults"]
    if set(defaults) != set(CPU_FIELDS):
        raise ValueError(f"device file {path}: defaults need exactly {', '.join(CPU_FIELDS)}")
    for key in ("topk_s_per_element", "topk_cache_s_per_element"):
        defaults[key] = tuple((float(x), float(t)) for x, t in defaults[key])
    sources = data.get("sources")
    missing = [k for k in CPU_FIELDS if not isinstance(sources, dict) or not isinstance(sources.get(k), str)
               or not sources[k]]
    if missing:
        raise ValueError(f"device file {path}: sources must cite {', '.join(missing)}")
    return data


_CPU = read_cpu()
CPU_DEFAULTS = _CPU["defaults"]
"""Stated defaults for ``cpu`` until ``sidco profile --run-on cpu`` has measured this host: a
two-core server share (about 20 GB/s read, 100 GFLOP/s); projections made with them say so
(:data:`CPU_FILE`)."""

NO_TENSOR_UNITS = "a CPU has no fp16 or TF32 matrix units: 0 (fp16 runs at bf16_flops, TF32 at fp32_flops)"


def _cache_file() -> Path:
    """This host's measured device numbers, in the testbed's cache directory."""
    return cache_dir() / "host-device.json"


def cpu_default() -> Device:
    """``cpu`` with the stated defaults of :data:`CPU_DEFAULTS` (nothing measured)."""
    identity = host_identity()
    return Device(
        name="cpu", kind="cpu", label=f"this host: {host_key(identity)}", **CPU_DEFAULTS,
        sources={**_CPU["sources"], **{k: NO_TENSOR_UNITS for k in ("fp16_flops", "tf32_flops")}},
        identity=identity,
    )


def save_host(device: Device) -> Path:
    """Keep a measured ``cpu`` device for later :func:`get` calls on this host; returns the file."""
    path = _cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(device.to_json(), indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def stored_host() -> Device | None:
    """The measured ``cpu`` device saved by :func:`save_host` when it describes this host."""
    path = _cache_file()
    try:
        device = from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return device if host_key(device.identity) == host_key(host_identity()) else None


def shipped_host() -> Device | None:
    """This host's numbers from a profile shipped in ``profiles/`` that was measured on the same
    CPU model and flags (its ``device_model``), or ``None``."""
    from costs import device_profile

    here = host_key(host_identity())
    for path in profiles.paths():
        try:
            shipped = device_profile.load(path)
            if shipped.device == "cpu" and shipped.device_model:
                device = from_json(shipped.device_model)
                if host_key(device.identity) == here:
                    return device
        except (ValueError, KeyError, TypeError):
            continue
    return None


UNRECORDED_GPU = "cuda"
"""The name of a GPU whose model a trace did not record (its timings are kept, its costs are
stored replays and profiles of ``cuda``)."""


def unrecorded_gpu() -> Device:
    """The device of a trace captured on a GPU whose model it did not record: its name
    (:data:`UNRECORDED_GPU`) and kind only; every number is NaN, since nothing may be priced on
    it (:attr:`Device.modelled` is ``False``: the cost model and the compute rule skip it)."""
    nan = math.nan
    return Device(name=UNRECORDED_GPU, kind="gpu", label="a GPU whose model is not recorded",
                  memory_bandwidth_Bps=nan, write_bandwidth_Bps=nan, fp32_flops=nan, bf16_flops=nan, launch_s=nan,
                  sync_s=nan, pcie_Bps=nan, topk_s_per_element=(), topk_cache_s_per_element=(),
                  sort_s_per_element=nan, gather_s_per_element=nan, compact_s_per_element=nan,
                  op_s_per_element={}, alloc_threshold_bytes=nan, fault_s_per_byte=nan, cache_bytes=nan,
                  cache_speedup=nan)


def names() -> list[str]:
    """Device names :func:`get` accepts: ``cpu`` (this host) and the GPUs."""
    return ["cpu", *GPUS]


def get(name: str) -> Device:
    """The device ``name`` (case-insensitive); ValueError listing the known names otherwise.

    ``cpu`` is this host as last measured by ``sidco profile --run-on cpu``, else as measured
    for a profile shipped in ``profiles/`` on the same CPU model and flags, else the stated
    defaults. ``NAME@ERA`` is a GPU with the kernel costs of an earlier PyTorch (:func:`in_era`).
    """
    key = str(name).strip().lower()
    if "@" in key:
        return in_era(get(base_name(key)), key.split("@", 1)[1])
    if key == "cpu":
        return stored_host() or shipped_host() or cpu_default()
    if key in GPUS:
        return GPUS[key]
    raise ValueError(f"unknown device {name!r}; choose from {', '.join(names())}")
