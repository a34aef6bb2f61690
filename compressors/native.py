"""Fused CPU kernels for float32 SIDCo (compiled once with the system C compiler, loaded with ctypes).

Eager torch needs one pass per operation (abs, sum, compare, nonzero); these kernels do SIDCo's
statistics in one read pass and its selection in one more, which is what makes SIDCo a few
times a ``torch.sum`` on the CPU. They serve contiguous float32 CPU tensors only; everything
else (CUDA, fp16/bf16/fp64) takes the pure-torch path in :mod:`compressors.sidco`, which computes
the same thresholds and selections.

The library is built on first use into ``$SIDCO_CACHE_DIR`` (default
``~/.cache/sidco-testbed``), keyed by a hash of the source, the compiler flags and the CPU's
identity (:func:`cpu_identity`): it is built with ``-march=native``, so a build is never
loaded on another CPU model (a cache directory shared over NFS, a copied home). Set
``SIDCO_NATIVE=0`` to disable it. Without a C compiler, or when the build fails, one
``RuntimeWarning`` says why (the compiler's first error line) and SIDCo takes the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from compressors._kernels_c import SOURCE

PARALLEL_MIN = 1 << 16
"""Inputs shorter than this run on one thread (waking threads costs more than it saves)."""

FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno",
         "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


_NO_HITS = (torch.empty(1, dtype=torch.int32), torch.empty(1, dtype=torch.float32))
"""Output buffers for selection calls with an infinite threshold (nothing is ever written)."""


class Stats(NamedTuple):
    """One-pass sums over ``y``: Σy, Σy², Σ ln y over y > 0, and #(y > 0)."""

    total: float
    total_sq: float
    total_log: float
    positive: int


def _cache_dir() -> Path:
    return Path(os.environ.get("SIDCO_CACHE_DIR") or Path.home() / ".cache" / "sidco-testbed")


def cpu_identity() -> str:
    """This CPU's model name and feature flags (``/proc/cpuinfo``; elsewhere the platform's
    processor and machine strings): what a ``-march=native`` build depends on."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features", "CPU part") and key not in fields:
                    fields[key] = " ".join(value.split())
    except OSError:
        pass
    if not fields:
        import platform

        return f"{platform.processor()} {platform.machine()}"
    return "; ".join(f"{key}: {value}" for key, value in sorted(fields.items()))


def cache_path(identity: str | None = None) -> Path:
    """Where the library built from this source and these flags for CPU ``identity``
    (default :func:`cpu_identity`) is cached."""
    cpu = cpu_identity() if identity is None else identity
    digest = hashlib.sha256("\0".join([SOURCE, " ".join(FLAGS), cpu]).encode()).hexdigest()[:16]
    return _cache_dir() / f"sidco_kernels_{digest}.so"


def _unavailable(reason: str) -> None:
    warnings.warn(f"native kernels unavailable ({reason}): compressors run on torch with the same results, "
                  "backend='torch' (set SIDCO_NATIVE=0 to silence)", RuntimeWarning, stacklevel=4)


def _build() -> ctypes.CDLL | None:
    name = os.environ.get("CC", "gcc")
    compiler = shutil.which(name)
    if compiler is None:
        _unavailable(f"no C compiler {name!r} on PATH")
        return None
    target = cache_path()
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "kernels.c"
            src.write_text(SOURCE)
            out = Path(tmp) / "kernels.so"
            done = subprocess.run([compiler, *FLAGS, "-o", str(out), str(src), "-lm"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
                first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")
                _unavailable(f"{name} failed with exit code {done.returncode}: {first.strip()}")
                return None
            os.replace(out, target)
    lib = ctypes.CDLL(str(target))
    lib.sidco_stats.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    lib.sidco_stats.restype = None
    lib.sidco_select.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_double), ctypes.c_void_p]
    lib.sidco_select.restype = ctypes.c_int64
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first call; ``None`` when unavailable/disabled."""
    global _lib, _tried
    if os.environ.get("SIDCO_NATIVE", "1") == "0":
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                _lib = _build()
            except OSError as exc:
                _unavailable(f"cannot build or load the library: {exc}")
                _lib = None
        return _lib


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels can serve ``x``: contiguous float32 on the CPU, fewer than 2³¹ elements
    (positions are int32), library available."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and x.numel() < 2**31
            and library() is not None)


def stats(x: torch.Tensor, *, absolute: bool, shift: float = 0.0, squares: bool = False,
          logs: bool = False) -> Stats:
    """Sums over ``y = |x|`` (``absolute``) or the excess ``y = x − shift`` of the elements with
    ``x > shift`` (``positive`` then counts them) in one pass.

    ``squares`` adds Σy²; ``logs`` (with ``absolute`` only) adds Σ ln y over ``y > 0``
    (float32 log with < 2e-7 relative error, float64 accumulation). Without ``logs``, ``|x|``
    sums always include Σy² and leave ``positive`` at 0.
    """
    out = (ctypes.c_double * 4)()
    threads = max(1, torch.get_num_threads()) if x.numel() >= PARALLEL_MIN else 1
    if absolute and not logs:
        # The selection kernel with an infinite threshold: the same partition and summation order
        # as select_above(..., with_stats=True), so speculative and plain calls agree bit for bit.
        whole, excess = (ctypes.c_double * 2)(), (ctypes.c_double * 2)()
        library().sidco_select(x.data_ptr(), None, x.numel(), math.inf, 1, threads, _NO_HITS[0].data_ptr(),
                               _NO_HITS[1].data_ptr(), excess, ctypes.cast(whole, ctypes.c_void_p))
        return Stats(whole[0], whole[1], 0.0, 0)
    library().sidco_stats(x.data_ptr(), x.numel(), shift, int(absolute), int(squares), int(logs), threads, out)
    return Stats(out[0], out[1], out[2], int(out[3]))


class Selection(NamedTuple):
    """Hits of :func:`select_above` and the sums of their excess over the threshold."""

    indices: torch.Tensor
    magnitudes: torch.Tensor
    excess: float
    excess_sq: float


def select_above(x: torch.Tensor, threshold: float, *, absolute: bool, positions: torch.Tensor | None = None,
                 buffers: tuple[torch.Tensor, torch.Tensor] | None = None, with_stats: bool = False):
    """Indices and magnitudes of the elements with ``y > threshold`` (strict), ascending, with
    ``Σ(y − threshold)`` and ``Σ(y − threshold)²`` over them (float32 differences, float64 sums).

    ``y = |x|`` when ``absolute`` else ``x``. ``indices`` (int32) are positions in ``x`` or, when
    ``positions`` (int32, same length) is given, ``positions[i]``. ``buffers`` (an int32 and a
    float32 tensor of at least ``x.numel()`` elements) are reused for the output, which is then a
    view into them; without them fresh buffers are allocated. With ``with_stats`` (``absolute``
    only) the same pass also sums ``|x|`` and ``x²`` over all elements and ``(Selection, Stats)``
    is returned (``Stats.total_log`` and ``Stats.positive`` are not computed: 0).
    """
    if with_stats and not absolute:
        raise ValueError("with_stats needs absolute=True")
    n = x.numel()
    if buffers is None:
        buffers = (torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.float32))
    idx_buf, mag_buf = buffers
    if idx_buf.numel() < n or mag_buf.numel() < n:
        raise ValueError(f"selection buffers hold {min(idx_buf.numel(), mag_buf.numel())} elements, need {n}")
    parts = max(1, torch.get_num_threads()) if n >= PARALLEL_MIN else 1
    excess = (ctypes.c_double * 2)()
    whole = (ctypes.c_double * 2)() if with_stats else None
    total = library().sidco_select(x.data_ptr(), positions.data_ptr() if positions is not None else None, n,
                                   threshold, int(absolute), parts, idx_buf.data_ptr(), mag_buf.data_ptr(), excess,
                                   ctypes.cast(whole, ctypes.c_void_p) if whole is not None else None)
    selection = Selection(idx_buf[:total], mag_buf[:total], excess[0], excess[1])
    if whole is None:
        return selection
    return selection, Stats(whole[0], whole[1], 0.0, 0)
