"""The on-disk trace format (see ``traces/FORMAT.md``): constants and the writer.

A trace is a directory holding ``manifest.json`` and one write-once safetensors
file per recorded iteration. Each file holds one 1-D float32 tensor per worker,
keyed ``worker_<w>``: that worker's gradient flattened in the manifest's layer
order. The whole directory is built in a temporary sibling directory and moved
into place with :func:`os.replace` only once the manifest is written, so a
crashed writer never leaves a half trace under the final name.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from processes.liveness import OwnerFile, owner_ended, pid_alive
from traces.errors import TraceError
from traces.flops import COUNTER, ForwardFlops

FORMAT_NAME = "sidco-trace"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


def iteration_file(iteration: int) -> str:
    """Name of the safetensors file holding recorded ``iteration``."""
    return f"grad-{iteration:09d}.safetensors"


def worker_key(worker: int) -> str:
    """Tensor key of ``worker``'s flattened gradient inside an iteration file."""
    return f"worker_{worker}"


MAX_LAYER_NAME_CHARS = 1024
"""The longest layer name a trace holds (characters; a parameter's dotted name is far shorter)."""


def layer_name_problem(name: object, seen: set[str]) -> str | None:
    """The one rule of a trace's layer names: a string of 1 to :data:`MAX_LAYER_NAME_CHARS` characters,
    each name once in a trace (``seen``: the names before it, to which ``name`` is added). Returns what
    is wrong (one line, the name cut to 40 characters) or None."""
    if not isinstance(name, str) or not name:
        return "has no name (a non-empty string)"
    if len(name) > MAX_LAYER_NAME_CHARS:
        return f"name {name[:40]!r}… is {len(name):,} characters long, over the limit of {MAX_LAYER_NAME_CHARS:,}"
    if name in seen:
        return f"name {name[:40]!r} repeats an earlier layer's (each layer is named once)"
    seen.add(name)
    return None


def layer_entries(layers: Sequence[tuple[str, Sequence[int], str]]) -> list[dict[str, Any]]:
    """Manifest entries (name, shape, dtype, offset, numel) for ``(name, shape, dtype)`` triples.

    ``offset`` and ``numel`` count elements of the flattened gradient. ValueError (one line) for a
    name :func:`layer_name_problem` refuses.
    """
    entries = []
    offset = 0
    seen: set[str] = set()
    for index, (name, shape, dtype) in enumerate(layers):
        problem = layer_name_problem(str(name), seen)
        if problem:
            raise ValueError(f"layer {index} {problem}")
        numel = 1
        for dim in shape:
            numel *= int(dim)
        entries.append(
            {"name": str(name), "shape": [int(d) for d in shape], "dtype": str(dtype), "offset": offset, "numel": numel}
        )
        offset += numel
    return entries


def environment() -> dict[str, Any]:
    """Where the trace was written: torch and Python versions, host platform, CPU threads."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
    }


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


_PARTIAL = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]{8}\.partial$")
"""A trace being written: ``.NAME.<pid>.<8 random characters>.partial`` (see :class:`TraceWriter`)."""

PARTIAL_OWNER = ".owner.json"
"""The file in a partial trace that names its writer (:class:`processes.liveness.OwnerFile`: identity
and heartbeat); the writer removes it before the trace moves into place."""


def clean_stale_partials(out_dir: Path) -> list[Path]:
    """Remove the partial traces next to ``out_dir`` (``.NAME.<pid>.XXXXXXXX.partial``, any
    ``NAME``) whose writer has ended by the one rule of :func:`processes.liveness.owner_ended`
    (provably gone, or no heartbeat for :data:`processes.liveness.OWNER_LEASE_S`: a container's
    PID 1 killed and rerun, a writer in another PID namespace), as emulation removes the namespaces
    of dead runs. A partial without an owner record (one written before records, or in the instant
    before its record) is judged by its pid alone; older ``.NAME.*.partial`` folders without a pid
    for ``out_dir``'s own name too. Returns what was removed."""
    own = f".{out_dir.name}."
    removed = []
    try:
        entries = list(out_dir.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.endswith(".partial") or entry.is_symlink() or not entry.is_dir():
            continue
        match = _PARTIAL.match(name)
        if match is not None:
            pid = match["pid"]
        elif name.startswith(own):
            pid = name[len(own):].split(".", 1)[0]
        else:
            continue
        gone = owner_ended(entry / PARTIAL_OWNER)
        if gone is False or (gone is None and pid.isdigit() and pid_alive(int(pid))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _write_error(out_dir: Path, what: str, exc: BaseException) -> TraceError:
    """One line for a failed write of ``what`` into the trace being written at ``out_dir``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    full = getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in text or "os error 28" in text
    fix = f"free space on {out_dir.parent} and rerun" if full else f"check that {out_dir.parent} is writable"
    reason = "the disk is full" if full else text
    return TraceError(f"{out_dir}: cannot write {what} ({reason}); nothing was kept: {fix}")


SIBLING_NAME_EXTRA = 40
"""Characters the writer adds to the trace directory's name for its siblings (``.NAME.PID.XXXXXXXX.partial``
while writing, ``.NAME.<32 hex>.old`` while replacing): the name must leave them room."""


def _shown(path: str) -> str:
    """``path`` printable in one line whatever its bytes (undecodable ones as ``\\xff``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def check_out(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """The checks of a trace's ``--out`` that need no training, run before any: a UTF-8 path (the
    results store records it as text), a name the filesystem takes with the writer's sibling suffixes,
    an absolute path within the system's limit, nothing in the way (an existing path only as a trace
    to ``overwrite``), and a nearest existing folder that is a directory, writable, on a filesystem
    mounted read-write. Returns the path; :class:`TraceError` (one line naming it) otherwise."""
    text = os.fsdecode(out_dir)
    shown = _shown(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceError(f"{shown}: the path is not valid UTF-8 (the results store records it as text); "
                         "choose a UTF-8 name") from None
    path = Path(text)
    absolute = os.path.abspath(text)
    nearest = next((p for p in (Path(absolute), *Path(absolute).parents) if os.path.lexists(p)), Path("/"))
    folder = nearest if nearest != Path(absolute) else Path(absolute).parent
    try:
        name_max = os.pathconf(folder if folder.is_dir() else "/", "PC_NAME_MAX")
        path_max = os.pathconf(folder if folder.is_dir() else "/", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    longest = max((len(os.fsencode(part)) for part in Path(absolute).parts), default=0)
    if len(os.fsencode(path.name)) + SIBLING_NAME_EXTRA > name_max or longest > name_max:
        raise TraceError(f"{shown[:80]}…: the trace directory's name is too long for this filesystem (at most "
                         f"{name_max - SIBLING_NAME_EXTRA} bytes, the writer adds up to {SIBLING_NAME_EXTRA} to it "
                         "while writing); choose a shorter --out")
    if len(os.fsencode(absolute)) + SIBLING_NAME_EXTRA + len(iteration_file(0)) + 1 >= path_max:
        raise TraceError(f"{shown[:80]}…: the path is too long ({len(os.fsencode(absolute)):,} bytes, at most "
                         f"{path_max - SIBLING_NAME_EXTRA - len(iteration_file(0)) - 2:,}); choose a shorter --out")
    if os.path.lexists(path):
        if not overwrite:
            raise TraceError(f"{shown}: already exists (choose another path, or overwrite: --force)")
        if not (path / MANIFEST).is_file():
            raise TraceError(f"{shown}: exists and is not a trace directory; refusing to overwrite it")
    if not nearest.is_dir() and nearest != Path(absolute):
        raise TraceError(f"{shown}: {_shown(str(nearest))} is a file, not a directory; choose another --out")
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise TraceError(f"{shown}: {_shown(str(folder))} is on a filesystem mounted read-only; choose another --out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TraceError(f"{shown}: {_shown(str(folder))} is not writable; choose another --out")
    return path


class TraceWriter:
    """Writes one trace directory; nothing appears at ``out_dir`` until :meth:`close`.

    Use as a context manager; an exception inside the block discards everything.
    ``overwrite`` replaces an existing trace directory at ``out_dir`` (only one
    that holds a ``manifest.json``; any other existing path is refused).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        workload: str,
        layers: Sequence[tuple[str, Sequence[int], str]],
        workers: int,
        overwrite: bool = False,
    ) -> None:
        if workers < 1:
            raise TraceError(f"{out_dir}: workers must be >= 1, got {workers}")
        self.out_dir = check_out(out_dir, overwrite=overwrite)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.workload = workload
        self.layers = layer_entries(layers)
        self.numel = sum(entry["numel"] for entry in self.layers)
        if self.numel < 1:
            raise TraceError(f"{self.out_dir}: a trace needs at least one gradient element")
        self.workers = int(workers)
        self.iterations: list[int] = []
        clean_stale_partials(self.out_dir)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.{os.getpid()}.", suffix=".partial",
                                          dir=self.out_dir.parent))
        try:
            self._owner = OwnerFile(self._tmp / PARTIAL_OWNER).start()
        except OSError as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise _write_error(self.out_dir, PARTIAL_OWNER, exc) from None
        self._closed = False

    def write_iteration(self, iteration: int, gradients: Sequence[torch.Tensor]) -> None:
        """Write recorded ``iteration``: one flattened gradient per worker (any float dtype, any device)."""
        if self._closed:
            raise TraceError(f"{self.out_dir}: writer already closed")
        if self.iterations and iteration <= self.iterations[-1]:
            raise TraceError(f"{self.out_dir}: iteration {iteration} is not after {self.iterations[-1]}")
        if len(gradients) != self.workers:
            raise TraceError(f"{self.out_dir}: iteration {iteration} has {len(gradients)} gradients, expected {self.workers}")
        tensors = {}
        for worker, grad in enumerate(gradients):
            flat = grad.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
            if flat.numel() != self.numel:
                raise TraceError(
                    f"{self.out_dir}: worker {worker} gradient of iteration {iteration} has "
                    f"{flat.numel()} elements, layers sum to {self.numel}"
                )
            if not bool(torch.isfinite(flat).all()):
                raise TraceError(f"{self.out_dir}: worker {worker} gradient of iteration {iteration} is not finite")
            tensors[worker_key(worker)] = flat
        name = iteration_file(iteration)
        tmp = self._tmp / f".{name}.tmp"
        try:
            save_file(tensors, str(tmp), metadata={"format": FORMAT_NAME, "iteration": str(iteration)})
            os.replace(tmp, self._tmp / name)
        except (OSError, SafetensorError) as exc:
            self.abort()
            raise _write_error(self.out_dir, f"iteration {iteration}", exc) from None
        self.iterations.append(int(iteration))

    def close(self, *, timings: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
              flops: ForwardFlops | None = None) -> Path:
        """Write the manifest, move the trace into place and return its path.

        ``timings`` must hold ``forward_s`` (s), ``backward_s`` (list of s aligned with
        the layers), ``optimizer_s`` (s), ``batch_size`` and ``device``. ``flops``: the
        forward FLOPs of one batch per layer (:func:`traces.flops.count`), stored as
        ``layers[i].forward_flops`` and the manifest's ``flops`` object.
        """
        if self._closed:
            raise TraceError(f"{self.out_dir}: writer already closed")
        if not self.iterations:
            self.abort()
            raise TraceError(f"{self.out_dir}: no iteration was recorded")
        missing = {"forward_s", "backward_s", "optimizer_s", "batch_size", "device"} - set(timings)
        if missing:
            self.abort()
            raise TraceError(f"{self.out_dir}: timings lack {sorted(missing)}")
        if len(timings["backward_s"]) != len(self.layers):
            self.abort()
            raise TraceError(f"{self.out_dir}: backward_s has {len(timings['backward_s'])} entries for {len(self.layers)} layers")
        layers = self.layers
        if flops is not None:
            if len(flops.per_parameter) != len(self.layers):
                self.abort()
                raise TraceError(f"{self.out_dir}: {len(flops.per_parameter)} forward FLOP counts for {len(self.layers)} layers")
            layers = [{**entry, "forward_flops": f} for entry, f in zip(self.layers, flops.per_parameter)]
        manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "schema_version": SCHEMA_VERSION,
            "trace_id": uuid.uuid4().hex,
            "workload": self.workload,
            "layers": layers,
            "numel": self.numel,
            "dtype": "float32",
            "workers": self.workers,
            "iterations": self.iterations,
            "files": {str(it): iteration_file(it) for it in self.iterations},
            "timings": dict(timings),
            "environment": environment(),
        }
        if flops is not None:
            manifest["flops"] = {"counter": COUNTER, "batch_size": flops.batch_size, "forward": flops.total}
        if extra:
            manifest.update(extra)
        try:
            _write_json_atomic(self._tmp / MANIFEST, manifest)
        except OSError as exc:
            self.abort()
            raise _write_error(self.out_dir, MANIFEST, exc) from None
        self._closed = True
        self._owner.close()
        old = None
        if self.out_dir.exists():
            old = self.out_dir.with_name(f".{self.out_dir.name}.{uuid.uuid4().hex}.old")
            os.replace(self.out_dir, old)
        os.replace(self._tmp, self.out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out_dir

    def abort(self) -> None:
        """Discard everything written so far."""
        self._closed = True
        self._owner.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.abort()
