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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from compressors.messages import wire
from compressors.rules import CATALOG

if TYPE_CHECKING:
    from compressors.base import Compressor

_LAZY: dict[str, str] = {
    "Compressor": "compressors.base", "NoCompression": "compressors.reference", "TopK": "compressors.reference",
    "RandomK": "compressors.randomk", "DGC": "compressors.dgc", "GaussianK": "compressors.gaussiank",
    "RedSync": "compressors.redsync", "SIDCo": "compressors.sidco", "SIDCoE": "compressors.sidco",
    "SIDCoP": "compressors.sidco", "SIDCoGP": "compressors.sidco", "FP16": "compressors.casts",
    "BF16": "compressors.casts", "PowerSGD": "compressors.powersgd", "Sparse": "compressors.messages.sparse",
    "Dense": "compressors.messages.kinds", "LowRank": "compressors.messages.kinds", "Message": "compressors.messages.kinds",
    "Memory": "compressors.memory", "ErrorFeedback": "compressors.memory", "DGCMemory": "compressors.memory",
}
"""Classes exported here, imported (with torch) on first use: ``names()``, ``message_kind()``
and ``exchange()`` need none of them, so the simulator can ask without loading torch."""

MESSAGES: tuple[str, ...] = ("sparse", "dense", "lowrank")
"""Kinds of message a compressor returns (``Compressor.message``)."""

__all__ = [
    "Compressor", "Sparse", "Dense", "LowRank", "Message", "MESSAGES", "Memory", "ErrorFeedback", "DGCMemory", "names", "check_names", "create",
    "NoCompression", "TopK", "RandomK", "DGC", "GaussianK", "RedSync", "SIDCo", "SIDCoE",
    "SIDCoP", "SIDCoGP", "FP16", "BF16", "PowerSGD", "message_kind", "takes_density", "exchange",
]


def names(message: str | None = None) -> list[str]:
    """Names accepted by :func:`create`, in a stable order; only those returning ``message``
    (``"sparse"``, ``"dense"`` or ``"lowrank"``) when it is given."""
    if message is not None and message not in MESSAGES:
        raise ValueError(f"unknown message kind {message!r}; choose from {', '.join(MESSAGES)}")
    return [name for name, (_, _, kind) in CATALOG.items() if message is None or kind == message]


def check_names(chosen: Iterable[str]) -> list[str]:
    """``chosen`` as a list if every one is a compressor of :func:`names`; ValueError naming the
    first unknown one and the choices otherwise (the one home of that rule)."""
    chosen = list(chosen)
    unknown = [n for n in chosen if n not in CATALOG]
    if unknown:
        raise ValueError(f"unknown compressor {unknown[0]!r}; choose from {', '.join(CATALOG)}")
    return chosen


def message_kind(name: str) -> str:
    """The kind of message compressor ``name`` returns: ``"sparse"``, ``"dense"`` or ``"lowrank"``."""
    check_names([name])
    return CATALOG[name][2]


def takes_density(name: str) -> bool:
    """Whether compressor ``name`` sends the share of the gradient a density sets (the sparse
    selections); ``none``, the 16-bit casts and PowerSGD send what their dtype or rank sets."""
    return name != "none" and message_kind(name) == "sparse"


def exchange(name: str, **options: Any) -> str:
    """How workers combine compressor ``name``'s messages: ``"allreduce"`` (``none``, the dense
    casts, PowerSGD, Random-k with a shared ``seed``) or ``"allgather"`` (the sparse selections);
    the one rule is :func:`compressors.messages.wire.collective`."""
    return wire.collective(name, options)


def compressor_class(name: str) -> type[Compressor]:
    """The class implementing compressor ``name`` (imports it, and torch)."""
    check_names([name])
    module, cls, _ = CATALOG[name]
    return getattr(importlib.import_module(module), cls)


def create(name: str, density: float = 1.0, **options: Any) -> Compressor:
    """A new compressor ``name`` with target ``density`` in (0, 1] and its ``options``.

    Raises ``ValueError`` for an unknown name, a bad density or an unknown/bad option.
    """
    cls = compressor_class(name)
    try:
        return cls(density, **options)
    except TypeError as exc:
        raise ValueError(f"bad options for compressor {name!r}: {exc}") from None


def __getattr__(attr: str) -> Any:
    if attr in _LAZY:
        return getattr(importlib.import_module(_LAZY[attr]), attr)
    if attr == "ddp":
        return importlib.import_module("compressors.ddp")
    raise AttributeError(f"module 'compressors' has no attribute {attr!r}")
