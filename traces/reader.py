"""Opening traces: :func:`open_trace` validates the manifest and every file header, lazily.

Opening reads ``manifest.json`` and the small JSON header of each safetensors
file (a few hundred bytes each), never the gradient data, so a 1 GB trace opens
in milliseconds. :meth:`Trace.gradient` memory-maps one file and reads one
worker's tensor.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import safe_open

from traces.errors import TraceError
from traces.files import file_kind
from traces.format import FORMAT_NAME, MANIFEST, SCHEMA_VERSION, layer_name_problem, worker_key
from units import check_count

_TIMING_KEYS = ("forward_s", "backward_s", "optimizer_s", "batch_size", "device")
_MAX_HEADER_BYTES = 100_000_000

_DIGESTS: dict[tuple, str] = {}
"""Content digests this process computed, by the (path, size, mtime in ns, inode) of every file."""
_DIGESTS_KEPT = 64
"""Digests kept at most (the oldest goes first)."""


def _fail(path: Path, problem: str) -> TraceError:
    return TraceError(f"{path}: {problem}")


def _open_regular(path: Path, what: str) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file itself: no symbolic link (it could
    point outside the trace directory), FIFO (reading would block), device or directory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _fail(path, f"missing {what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _fail(path, f"{what} is a symbolic link; trace files must be regular files inside the trace directory") from None
        raise _fail(path, f"cannot open {what} ({exc.strerror or type(exc).__name__})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _fail(path, f"{what} is {file_kind(mode)}; trace files must be regular files inside the trace directory")
    return os.fdopen(fd, "rb")


def _read_manifest(root: Path) -> dict[str, Any]:
    if not root.exists():
        raise _fail(root, "no such trace directory")
    if not root.is_dir():
        raise _fail(root, "not a trace directory (a trace is a directory with manifest.json)")
    path = root / MANIFEST
    if not os.path.lexists(path):
        raise _fail(root, f"not a trace directory (no {MANIFEST})")
    with _open_regular(path, MANIFEST) as fh:
        if os.fstat(fh.fileno()).st_size > _MAX_HEADER_BYTES:
            raise _fail(path, f"manifest larger than {_MAX_HEADER_BYTES} bytes")
        raw = fh.read()
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _fail(path, f"corrupt manifest, not valid JSON ({type(exc).__name__})") from None
    if not isinstance(manifest, dict):
        raise _fail(path, "corrupt manifest, not a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise _fail(path, f"not a {FORMAT_NAME} manifest (format={manifest.get('format')!r})")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _fail(path, f"unknown schema version {version!r} (this reader understands {SCHEMA_VERSION})")
    return manifest


def _int_field(path: Path, manifest: Mapping[str, Any], key: str, minimum: int) -> int:
    value = manifest.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(path, f"manifest field {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_layers(path: Path, manifest: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    if manifest.get("dtype") != "float32":
        raise _fail(path, f"manifest dtype must be \"float32\" (a trace stores fp32 gradients), got {manifest.get('dtype')!r}")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _fail(path, "manifest field 'layers' must be a non-empty list")
    result = []
    offset = 0
    seen: set[str] = set()
    for index, entry in enumerate(layers):
        if not isinstance(entry, dict):
            raise _fail(path, f"layer {index} is not an object")
        name, shape = entry.get("name"), entry.get("shape")
        problem = layer_name_problem(name, seen)
        if problem:
            raise _fail(path, f"layer {index} {problem}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _fail(path, f"layer {name!r} has an invalid shape {str(shape)[:80]}")
        numel = math.prod(shape)
        if entry.get("offset") != offset or entry.get("numel") != numel:
            raise _fail(
                path,
                f"layer {name!r}: offset/numel {entry.get('offset')!r}/{entry.get('numel')!r} "
                f"do not match its shape (expected {offset}/{numel})",
            )
        offset += numel
        result.append((name, tuple(shape)))
    if manifest.get("numel") != offset:
        raise _fail(path, f"manifest numel {manifest.get('numel')!r} does not match the layer shapes ({offset})")
    return result


def _number(value: Any) -> bool:
    """Whether ``value`` is a finite JSON number >= 0 (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _check_timings(path: Path, manifest: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
    timings = manifest.get("timings")
    if not isinstance(timings, dict):
        raise _fail(path, "manifest field 'timings' must be an object")
    missing = [k for k in _TIMING_KEYS if k not in timings]
    if missing:
        raise _fail(path, f"timings lack {missing}")
    backward = timings["backward_s"]
    if not isinstance(backward, list) or len(backward) != n_layers:
        raise _fail(path, f"timings backward_s must list one time per layer ({n_layers})")
    for key in ("forward_s", "optimizer_s"):
        value = timings[key]
        if not _number(value):
            raise _fail(path, f"timings {key} must be a number of seconds >= 0")
    if not all(_number(v) for v in backward):
        raise _fail(path, "timings backward_s must hold numbers of seconds >= 0")
    return timings


def _check_flops(path: Path, manifest: Mapping[str, Any]) -> tuple[list[float], int] | None:
    """The optional forward FLOPs: per layer (one batch) and that batch's size; ``None`` when the
    trace has none (traces written before they were counted)."""
    layers = manifest["layers"]
    present = ["forward_flops" in entry for entry in layers]
    info = manifest.get("flops")
    if not any(present) and info is None:
        return None
    if not all(present):
        raise _fail(path, "forward_flops must be given for every layer or for none")
    values = [entry["forward_flops"] for entry in layers]
    if not all(_number(v) for v in values):
        raise _fail(path, "layers' forward_flops must be numbers of FLOPs >= 0")
    if not isinstance(info, dict):
        raise _fail(path, "manifest field 'flops' must be an object when layers carry forward_flops")
    batch = info.get("batch_size")
    try:
        check_count(batch, "flops batch_size")
    except ValueError as exc:
        raise _fail(path, str(exc)) from None
    if not _number(info.get("forward")):
        raise _fail(path, "flops forward must be a number of FLOPs >= 0")
    return [float(v) for v in values], batch


def _read_header(path: Path) -> dict[str, Any]:
    """Parse a safetensors header and check that the file holds all the data it declares."""
    try:
        with _open_regular(path, "safetensors file") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise _fail(path, "truncated safetensors file (no header)")
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, _MAX_HEADER_BYTES):
                raise _fail(path, "truncated or corrupt safetensors file (header length beyond end of file)")
            raw = fh.read(length)
    except TraceError:
        raise
    except FileNotFoundError:
        raise _fail(path, "missing safetensors file") from None
    except (OSError, ValueError) as exc:
        raise _fail(path, f"cannot read safetensors file ({type(exc).__name__})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _fail(path, "corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise _fail(path, "corrupt safetensors header (not an object)")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise _fail(path, f"corrupt safetensors header (tensor {key!r} has invalid data offsets)")
        end = max(end, offsets[1])
    if 8 + length + end > size:
        raise _fail(path, f"truncated safetensors file ({size} bytes, header declares {8 + length + end})")
    return header


class Trace:
    """A lazily opened gradient trace; see :func:`open_trace`.

    Attributes: ``path``, ``manifest`` (dict), ``workers`` (int), ``iterations``
    (list of recorded iteration numbers), ``layers`` (list of ``(name, shape)`` in
    flattening order), ``numel`` (elements of one flattened gradient), ``timings``
    (dict; ``forward_s``, ``optimizer_s`` seconds per worker step, ``backward_s``
    seconds per layer aligned with ``layers``, ``batch_size`` samples per worker,
    ``device``), ``forward_flops`` (forward FLOPs per layer for one batch of
    ``flops_batch_size`` samples, aligned with ``layers``; ``None`` with ``flops_batch_size``
    for a trace without them).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        manifest = _read_manifest(self.path)
        mpath = self.path / MANIFEST
        self.manifest: dict[str, Any] = manifest
        self.workers: int = _int_field(mpath, manifest, "workers", 1)
        self.layers: list[tuple[str, tuple[int, ...]]] = _check_layers(mpath, manifest)
        self.numel: int = int(manifest["numel"])
        self.timings: dict[str, Any] = _check_timings(mpath, manifest, len(self.layers))
        flops = _check_flops(mpath, manifest)
        self.forward_flops: list[float] | None = None if flops is None else flops[0]
        self.flops_batch_size: int | None = None if flops is None else flops[1]
        iterations = manifest.get("iterations")
        if (
            not isinstance(iterations, list)
            or not iterations
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in iterations)
            or any(b <= a for a, b in zip(iterations, iterations[1:]))
        ):
            raise _fail(mpath, "manifest field 'iterations' must be a non-empty increasing list of integers")
        self.iterations: list[int] = list(iterations)
        with os.scandir(self.path) as listing:
            held = sum(1 for entry in listing if entry.name != MANIFEST)
        if len(self.iterations) > held:
            raise _fail(mpath, f"manifest lists {len(self.iterations)} iterations but the trace directory holds "
                               f"{held} gradient files (one per recorded iteration)")
        files = manifest.get("files")
        if not isinstance(files, dict) or set(files) != {str(i) for i in self.iterations}:
            raise _fail(mpath, "manifest field 'files' must map every recorded iteration to a file")
        names = [files[str(i)] for i in self.iterations]
        if len(set(map(str, names))) != len(names):
            raise _fail(mpath, "manifest field 'files' names one file for several iterations: each recorded "
                               "iteration has its own file")
        self._files: dict[int, Path] = {}
        self._content: str | None = None
        for iteration in self.iterations:
            name = files[str(iteration)]
            if not isinstance(name, str) or not name or "\0" in name or Path(name).name != name or name.startswith("."):
                raise _fail(mpath, f"iteration {iteration} file name {name!r} is not a plain file name")
            fpath = self.path / name
            self._check_file(fpath)
            self._files[iteration] = fpath

    def _check_file(self, fpath: Path) -> None:
        header = _read_header(fpath)
        tensors = sorted(k for k in header if k != "__metadata__")
        if len(tensors) != self.workers:
            raise _fail(fpath, f"holds {len(tensors)} tensors, manifest says {self.workers} workers")
        for worker in range(self.workers):
            key = worker_key(worker)
            info = header.get(key)
            if not isinstance(info, dict):
                raise _fail(fpath, f"no tensor {key!r} (manifest says {self.workers} workers)")
            if info.get("dtype") != "F32":
                raise _fail(fpath, f"tensor {key!r} has dtype {info.get('dtype')!r}, expected F32")
            if info.get("shape") != [self.numel]:
                raise _fail(fpath, f"tensor {key!r} has shape {info.get('shape')!r}, manifest layers sum to [{self.numel}]")
            start, end = info["data_offsets"]
            if end - start != 4 * self.numel:
                raise _fail(fpath, f"tensor {key!r} holds {end - start} bytes, expected {4 * self.numel}")

    def content_sha256(self) -> str:
        """The SHA-256 (hex) of what the trace holds: its manifest and every gradient file, in
        iteration order (about 0.5 GB/s; a process reads files whose size, modification time and inode
        it already hashed only once: :data:`_DIGESTS`). Stored replays carry it, so a trace whose
        files changed since is replayed again, never matched to the old rows."""
        if self._content is None:
            files = (self.path / MANIFEST, *(self._files[i] for i in self.iterations))
            try:
                stamp = tuple((str(f.resolve()), (st := f.stat()).st_size, st.st_mtime_ns, st.st_ino) for f in files)
            except OSError as exc:
                raise _fail(self.path, f"cannot read its files ({exc.strerror})") from None
            if stamp not in _DIGESTS:
                digest = hashlib.sha256()
                for fpath in files:
                    with _open_regular(fpath, fpath.name) as fh:
                        digest.update(f"{fpath.name}\0{os.fstat(fh.fileno()).st_size}\0".encode())
                        while chunk := fh.read(1 << 22):
                            digest.update(chunk)
                while len(_DIGESTS) >= _DIGESTS_KEPT:
                    del _DIGESTS[next(iter(_DIGESTS))]
                _DIGESTS[stamp] = digest.hexdigest()
            self._content = _DIGESTS[stamp]
        return self._content

    def file(self, iteration: int) -> Path:
        """Path of the safetensors file of recorded ``iteration``."""
        if iteration not in self._files:
            raise _fail(self.path, f"iteration {iteration} was not recorded (recorded: {self.iterations[0]}..{self.iterations[-1]})")
        return self._files[iteration]

    def gradient(self, iteration: int, worker: int) -> torch.Tensor:
        """``worker``'s flattened gradient at recorded ``iteration``: 1-D float32 CPU tensor of ``numel``.

        Raises :class:`TraceError` if the stored values are not finite.
        """
        fpath = self.file(iteration)
        if not 0 <= worker < self.workers:
            raise _fail(self.path, f"worker {worker} out of range (trace has {self.workers} workers)")
        _open_regular(fpath, "safetensors file").close()
        try:
            with safe_open(str(fpath), framework="pt", device="cpu") as handle:
                tensor = handle.get_tensor(worker_key(worker))
        except Exception as exc:  # safetensors raises its own SafetensorError besides OSError
            detail = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise _fail(fpath, f"cannot read tensor {worker_key(worker)!r}: {detail}") from None
        if not bool(torch.isfinite(tensor).all()):
            raise _fail(fpath, f"tensor {worker_key(worker)!r} holds NaN or Inf values")
        return tensor

    def layer_slices(self) -> list[tuple[str, int, int]]:
        """``(name, offset, numel)`` of each layer in the flattened gradient."""
        return [(e["name"], e["offset"], e["numel"]) for e in self.manifest["layers"]]

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return (
            f"Trace({str(self.path)!r}, workload={self.manifest.get('workload')!r}, workers={self.workers}, "
            f"iterations={len(self.iterations)}, numel={self.numel})"
        )


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """Open the trace directory at ``path`` lazily; raise :class:`TraceError` naming file and problem."""
    return Trace(path)
