"""Fused CPU kernels for float32 SIDCo (compiled once with the system C compiler, loaded with ctypes).

Eager torch needs one pass per operation (abs, sum, compare, nonzero); one kernel here gathers a
SIDCo stage's statistics (and, when asked, a selection) in one read pass, so that SIDCo costs a
few ``torch.sum`` passes on the CPU whatever its stage count. They serve contiguous float32 CPU tensors only; everything
else (CUDA, fp16/bf16/fp64) takes the pure-torch path in :mod:`compressors.sidco`, which computes
the same thresholds and selections.

The library is built on first use into ``$SIDCO_CACHE_DIR`` (default
``~/.cache/sidco-testbed``), keyed by a hash of the source, the compiler flags (with
``SIDCO_NATIVE_FLAGS``, which adds flags, e.g. ``-mno-avx512f`` to measure the AVX2 build on an
AVX-512 machine) and the CPU's
identity (:func:`machine.march_key`): it is built with ``-march=native``, so a build is never
loaded on another CPU model (a cache directory shared over NFS, a copied home). Where it goes and
whether it is built are :mod:`compressors.kernels.native_build`'s (no torch, no compiler). Set
``SIDCO_NATIVE=0`` to disable it. Without a C compiler, or when the build fails, one
``RuntimeWarning`` says why (the compiler's first error line) and SIDCo takes the torch path.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from compressors.kernels.c_source import SOURCE
from compressors.kernels.native_build import cache_path, enabled, flags
from machine import march_key

PARALLEL_MIN = 1 << 19
"""Inputs shorter than this run on one thread: waking threads costs more than it saves, and on a
loaded machine a parallel region can wait a whole scheduler slice for a descheduled thread (SIDCo
scans its small pool several times per call)."""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


class Stats(NamedTuple):
    """One-pass sums over ``y``: Σy, Σy², Σ ln y over y > 0, and #(y > 0)."""

    total: float
    total_sq: float
    total_log: float
    positive: int


class Selection(NamedTuple):
    """Hits of :func:`select_above` and the sums of their excess over the threshold."""

    indices: torch.Tensor
    magnitudes: torch.Tensor
    excess: float
    excess_sq: float


def _unavailable(reason: str) -> None:
    warnings.warn(f"native kernels unavailable ({reason}): compressors use the torch backend with the "
                  "same results, backend='torch' (set SIDCO_NATIVE=0 to silence)", RuntimeWarning, stacklevel=4)


def _build() -> ctypes.CDLL | None:
    name = os.environ.get("CC", "gcc")
    compiler = shutil.which(name)
    if compiler is None:
        _unavailable(f"no C compiler {name!r} on PATH")
        return None
    chosen = flags()
    target = cache_path()
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "kernels.c"
            src.write_text(SOURCE)
            out = Path(tmp) / "kernels.so"
            done = subprocess.run([compiler, *chosen, "-o", str(out), str(src), "-lm"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
                first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")
                _unavailable(f"{name} failed with exit code {done.returncode}: {first.strip()}")
                return None
            os.replace(out, target)
    lib = ctypes.CDLL(str(target))
    lib.sidco_scan.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                               ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
    lib.sidco_scan.restype = ctypes.c_int64
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first call; ``None`` when unavailable/disabled."""
    global _lib, _tried
    if not enabled():
        return None
    if _tried:  # built (or refused) already: no lock on the per-call path
        return _lib
    with _lock:
        if not _tried:
            try:
                _lib = _build()
            except OSError as exc:
                _unavailable(f"cannot build or load the library: {exc}")
                _lib = None
            _tried = True
        return _lib


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels can serve ``x``: contiguous float32 on the CPU, fewer than 2³¹ elements
    (positions are int32), library available."""
    return (x.dtype == torch.float32 and x.is_cpu and x.is_contiguous() and x.numel() < 2**31
            and library() is not None)


_Out = ctypes.c_double * 5
"""The kernel's five float64 results (count, Σ excess, Σ excess², Σ ln, positives)."""
_RESULTS = struct.Struct("5d")
"""Reads them in one call (iterating a ctypes array costs five lookups)."""


class Scan(NamedTuple):
    """One pass of :func:`scan`: statistics of the exceedances of ``shift`` and, when asked, a selection.

    ``count`` = #(y > shift); ``excess``, ``excess_sq`` = Σ(y − shift), Σ(y − shift)² over them
    (``excess_sq`` 0 when not asked for: ``squares=False``);
    ``total_log`` = Σ ln max(y, FLT_MIN) over all elements and ``positive`` = #(y > 0) (``logs``
    only, else 0); ``selection`` = the hits of ``select`` (or ``None``).
    """

    count: int
    excess: float
    excess_sq: float
    total_log: float
    positive: int
    selection: Selection | None


def scan(x: torch.Tensor, *, absolute: bool, shift: float = 0.0, squares: bool = True, logs: bool = False,
         select: float | None = None, positions: torch.Tensor | None = None,
         buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> Scan:
    """One read pass over ``y = |x|`` (``absolute``) or ``y = x``: the count and the sums of
    ``y − shift`` and (``squares``; else ``excess_sq`` is 0 and the pass does less) its square
    over the elements with ``y > shift`` (strict), optionally
    ``Σ ln max(y, FLT_MIN)`` with ``#(y > 0)`` (``logs``, with ``absolute`` only), and optionally
    the selection ``y > select`` (see :func:`select_above` for ``positions`` and ``buffers``) in
    the same pass. Sums: float32 over chunks of 1024 elements, float64 across chunks (error
    below 2e-5 of the sum of the terms' magnitudes on every build); ``total_log`` within 1e-7
    per element of the exact sum.
    """
    if logs and not absolute:
        raise ValueError("logs needs absolute=True")
    n = x.numel()
    out = _Out()
    kernel = (_lib or library()).sidco_scan
    parts = max(1, torch.get_num_threads()) if n >= PARALLEL_MIN else 1
    if select is None:
        kernel(x.data_ptr(), None, n, absolute, shift, squares, logs, 0, math.inf, parts, None, None, out)
        count, excess, excess_sq, total_log, positive = _RESULTS.unpack_from(out)
        return Scan(int(count), excess, excess_sq, total_log, int(positive), None)
    if buffers is None:
        buffers = (torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.float32))
    idx_buf, mag_buf = buffers
    if idx_buf.numel() < n or mag_buf.numel() < n:
        raise ValueError(f"selection buffers hold {min(idx_buf.numel(), mag_buf.numel())} elements, need {n}")
    if positions is not None and positions.numel() < n:
        raise ValueError(f"positions hold {positions.numel()} elements, need {n}")
    total = kernel(x.data_ptr(), None if positions is None else positions.data_ptr(), n, absolute, shift, squares,
                   logs, 1, select, parts, idx_buf.data_ptr(), mag_buf.data_ptr(), out)
    hits = Selection(idx_buf[:total], mag_buf[:total], math.nan, math.nan)
    count, excess, excess_sq, total_log, positive = _RESULTS.unpack_from(out)
    return Scan(int(count), excess, excess_sq, total_log, int(positive), hits)


def count_above(x: np.ndarray, threshold: float) -> int:
    """``#(x > threshold)`` (strict) over float32 values ``x`` (a float32 CPU tensor's ``.numpy()``
    view), ``threshold`` converted to float32 as :func:`scan`'s argument is: what a count-only
    :func:`scan` returns, but computed on the host by numpy, without a kernel. For a pool of a few thousand elements a kernel's
    ctypes call costs more than the count (SIDCo's correction tries: 1.3 vs 3.4 µs at 1,800
    elements, 2.5 vs 3.7 at 8,000, 5.3 vs 8.6 at 50,000, one thread, Zen 4)."""
    return int(np.count_nonzero(x > np.float32(ctypes.c_float(threshold).value)))


def stats(x: torch.Tensor, *, absolute: bool, shift: float = 0.0, squares: bool = False,
          logs: bool = False) -> Stats:
    """Sums over ``y = |x|`` (``absolute``) or the excess ``y = x − shift`` of the elements with
    ``x > shift`` in one pass: ``total`` = Σy, ``total_sq`` = Σy², ``positive`` = #(y > 0)
    (for the excess: the number of exceedances); with ``logs`` (``absolute`` only) also
    ``total_log`` = Σ ln y over ``y > 0`` (within 1e-7 per element; elements below FLT_MIN
    count as FLT_MIN). Σy² is always computed (``squares`` is accepted for compatibility;
    :func:`scan` with ``squares=False`` skips it).
    """
    del squares
    result = scan(x, absolute=absolute, shift=0.0 if absolute else shift, logs=logs)
    return Stats(result.excess, result.excess_sq, result.total_log,
                 result.positive if logs else result.count)


def select_above(x: torch.Tensor, threshold: float, *, absolute: bool, positions: torch.Tensor | None = None,
                 buffers: tuple[torch.Tensor, torch.Tensor] | None = None, with_stats: bool = False):
    """Indices and magnitudes of the elements with ``y > threshold`` (strict), ascending, with
    ``Σ(y − threshold)`` and ``Σ(y − threshold)²`` over them (float32 differences, float64 sums).

    ``y = |x|`` when ``absolute`` else ``x``. ``indices`` (int32) are positions in ``x`` or, when
    ``positions`` (int32, same length) is given, ``positions[i]``. ``buffers`` (an int32 and a
    float32 tensor of at least ``x.numel()`` elements) are reused for the output, which is then a
    view into them; without them fresh buffers are allocated. With ``with_stats`` (``absolute``
    only) the same pass also sums ``|x|`` and ``x²`` over all elements and ``(Selection, Stats)``
    is returned (``Stats.total_log`` is not computed: 0; ``Stats.positive`` = #(|x| > 0)).
    """
    if with_stats and not absolute:
        raise ValueError("with_stats needs absolute=True")
    result = scan(x, absolute=absolute, shift=0.0 if with_stats else threshold, select=threshold,
                  positions=positions, buffers=buffers)
    if not with_stats:
        return result.selection._replace(excess=result.excess, excess_sq=result.excess_sq)
    hits = scan(result.selection.magnitudes, absolute=False, shift=threshold)
    return (result.selection._replace(excess=hits.excess, excess_sq=hits.excess_sq),
            Stats(result.excess, result.excess_sq, 0.0, result.count))
