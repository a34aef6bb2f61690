"""Where the fused CPU kernels of :mod:`compressors.kernels.native` are built, and whether they are: no
torch, no compiler (a projection that prices the native path asks :func:`built`, it never builds).

The library is cached in the testbed's cache directory (:func:`machine.cache_dir`),
keyed by a hash of the C source, the compiler flags (:data:`FLAGS` plus ``SIDCO_NATIVE_FLAGS``)
and the CPU fields a ``-march=native`` build depends on (:func:`machine.march_key`): a ``-march=native`` build is never loaded on
another CPU model.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

from compressors.kernels.c_source import SOURCE
from machine import cache_dir, march_key

FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno",
         "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]


def enabled() -> bool:
    """Whether the native kernels may be used at all (``SIDCO_NATIVE=0`` disables them)."""
    return os.environ.get("SIDCO_NATIVE", "1") != "0"


def flags() -> list[str]:
    """Compiler flags: :data:`FLAGS` plus the words of ``$SIDCO_NATIVE_FLAGS`` (e.g. ``-mno-avx512f``
    to build without AVX-512 on a machine that has it); both are part of the cache key."""
    return FLAGS + shlex.split(os.environ.get("SIDCO_NATIVE_FLAGS", ""))


def cache_path(identity: str | None = None) -> Path:
    """Where the library built from this source and these flags for CPU ``identity``
    (default :func:`march_key`) is cached."""
    cpu = march_key() if identity is None else identity
    digest = hashlib.sha256("\0".join([SOURCE, " ".join(flags()), cpu]).encode()).hexdigest()[:16]
    return cache_dir() / f"sidco_kernels_{digest}.so"


def built() -> bool:
    """Whether the library for this CPU, source and flags is built already (and not disabled):
    what the code would run on this host now, asked without building anything."""
    return enabled() and cache_path().is_file()
