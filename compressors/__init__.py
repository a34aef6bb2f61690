"""Gradient compressors: SIDCo-E/-P/-GP and their peers, error feedback, DGC momentum memory.

Roles compose as in GRACE: a *compressor* turns a 1-D gradient into a :class:`Sparse` selection
(``compress``) and back (``decompress``); a *memory* (:class:`ErrorFeedback`, :class:`DGCMemory`)
keeps per-key state around any compressor.

>>> import torch, compressors
>>> c = compressors.create("sidco-e", density=0.01)
>>> s = c.compress(torch.randn(10_000))
>>> dense = c.decompress(s)
"""

from __future__ import annotations

import importlib
from typing import Any

from compressors.base import Compressor
from compressors.dgc import DGC
from compressors.exact import NoCompression, TopK
from compressors.gaussiank import GaussianK
from compressors.memory import DGCMemory, ErrorFeedback, Memory
from compressors.randomk import RandomK
from compressors.redsync import RedSync
from compressors.sidco import SIDCo, SIDCoE, SIDCoGP, SIDCoP
from compressors.sparse import Sparse

_REGISTRY: dict[str, type[Compressor]] = {
    cls.name: cls
    for cls in (NoCompression, TopK, RandomK, DGC, GaussianK, RedSync, SIDCoE, SIDCoP, SIDCoGP)
}

__all__ = [
    "Compressor", "Sparse", "Memory", "ErrorFeedback", "DGCMemory", "names", "create",
    "NoCompression", "TopK", "RandomK", "DGC", "GaussianK", "RedSync", "SIDCo", "SIDCoE",
    "SIDCoP", "SIDCoGP",
]


def names() -> list[str]:
    """Names accepted by :func:`create`, in a stable order."""
    return list(_REGISTRY)


def create(name: str, density: float = 1.0, **options: Any) -> Compressor:
    """A new compressor ``name`` with target ``density`` in (0, 1] and its ``options``.

    Raises ``ValueError`` for an unknown name, a bad density or an unknown/bad option.
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown compressor {name!r}; choose from {', '.join(_REGISTRY)}")
    try:
        return cls(density, **options)
    except TypeError as exc:
        raise ValueError(f"bad options for compressor {name!r}: {exc}") from None


def __getattr__(attr: str) -> Any:
    if attr == "ddp":
        return importlib.import_module("compressors.ddp")
    raise AttributeError(f"module 'compressors' has no attribute {attr!r}")
