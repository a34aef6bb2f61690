"""Gradient compressors: SIDCo-E/-P/-GP and their peers, error feedback, DGC momentum memory.

Roles compose as in GRACE: a *compressor* turns a 1-D gradient into a message
(``compress``: a :class:`Sparse` selection, or for ``fp16``/``bf16`` a :class:`Dense` cast and for
``powersgd`` a :class:`LowRank` pair of factors) and back (``decompress``); a *memory* (:class:`ErrorFeedback`, :class:`DGCMemory`)
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
from compressors.casts import BF16, FP16
from compressors.dgc import DGC
from compressors.reference import NoCompression, TopK
from compressors.gaussiank import GaussianK
from compressors.memory import DGCMemory, ErrorFeedback, Memory
from compressors.messages import Dense, LowRank, Message
from compressors.powersgd import PowerSGD
from compressors.randomk import RandomK
from compressors.redsync import RedSync
from compressors.sidco import SIDCo, SIDCoE, SIDCoGP, SIDCoP
from compressors.sparse import Sparse
from compressors import wire

_REGISTRY: dict[str, type[Compressor]] = {
    cls.name: cls
    for cls in (NoCompression, TopK, RandomK, DGC, GaussianK, RedSync, SIDCoE, SIDCoP, SIDCoGP, FP16, BF16,
                PowerSGD)
}

MESSAGES: tuple[str, ...] = ("sparse", "dense", "lowrank")
"""Kinds of message a compressor returns (``Compressor.message``)."""

__all__ = [
    "Compressor", "Sparse", "Dense", "LowRank", "Message", "MESSAGES", "Memory", "ErrorFeedback", "DGCMemory", "names", "create",
    "NoCompression", "TopK", "RandomK", "DGC", "GaussianK", "RedSync", "SIDCo", "SIDCoE",
    "SIDCoP", "SIDCoGP", "FP16", "BF16", "PowerSGD", "message_kind", "takes_density", "exchange",
]


def names(message: str | None = None) -> list[str]:
    """Names accepted by :func:`create`, in a stable order; only those returning ``message``
    (``"sparse"``, ``"dense"`` or ``"lowrank"``) when it is given."""
    if message is not None and message not in MESSAGES:
        raise ValueError(f"unknown message kind {message!r}; choose from {', '.join(MESSAGES)}")
    return [name for name, cls in _REGISTRY.items() if message is None or cls.message == message]


def message_kind(name: str) -> str:
    """The kind of message compressor ``name`` returns: ``"sparse"``, ``"dense"`` or ``"lowrank"``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[name].message


def takes_density(name: str) -> bool:
    """Whether compressor ``name`` sends the share of the gradient a density sets (the sparse
    selections); ``none``, the 16-bit casts and PowerSGD send what their dtype or rank sets."""
    return name != "none" and message_kind(name) == "sparse"


def exchange(name: str, **options: Any) -> str:
    """How workers combine compressor ``name``'s messages: ``"allreduce"`` (``none``, the dense
    casts, PowerSGD, Random-k with a shared ``seed``) or ``"allgather"`` (the sparse selections);
    the one rule is :func:`compressors.wire.collective`."""
    return wire.collective(name, options)


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
