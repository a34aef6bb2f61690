"""Gradient compressors: SIDCo-E/-P/-GP and their peers, error feedback, DGC momentum memory.

Roles compose as in GRACE: a *compressor* turns a 1-D gradient into a message
(``compress``: a :class:`Sparse` selection, or for ``fp16``/``bf16`` a :class:`Dense` cast, for
``powersgd`` a :class:`LowRank` pair of factors and for ``int8``, ``fp8``, ``int4`` a
:class:`Quantized` block format) and back (``decompress``); a *memory* (:class:`ErrorFeedback`, :class:`DGCMemory`) keeps per-key
state around any compressor. Each compressor's torch-free facts are on its card
(:func:`card`); :data:`compressors.work.REGISTRY` lists the cards.

>>> import torch, compressors
>>> c = compressors.create("sidco-e", density=0.01)
>>> s = c.compress(torch.randn(10_000))
>>> dense = c.decompress(s)
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from compressors.work import CARDS, REGISTRY
from compressors.work.cards import MESSAGES, Card

if TYPE_CHECKING:
    from compressors.base import Compressor

_PARTS: dict[str, str] = {
    "Compressor": "compressors.base", "SIDCo": "compressors.sidco", "Sparse": "compressors.messages.sparse",
    "Dense": "compressors.messages.kinds", "LowRank": "compressors.messages.kinds",
    "Quantized": "compressors.messages.kinds", "Message": "compressors.messages.kinds",
    "Memory": "compressors.memory", "ErrorFeedback": "compressors.memory", "DGCMemory": "compressors.memory",
}
"""The roles' classes exported here besides the compressors' own (those come from their cards),
imported (with torch) on first use: ``names()``, ``message_kind()`` and ``exchange()`` need none of
them, so the simulator can ask without loading torch."""

__all__ = [
    "Compressor", "SIDCo", "Sparse", "Dense", "LowRank", "Quantized", "Message", "MESSAGES", "Memory", "ErrorFeedback",
    "DGCMemory", "Card", "card", "names", "check_names", "create", "message_kind", "takes_density", "exchange",
    *(c.cls for c in REGISTRY),
]


def names(message: str | None = None) -> list[str]:
    """Names accepted by :func:`create`, in the registry's order (:data:`compressors.work.REGISTRY`);
    only those returning ``message`` (one of :data:`MESSAGES`) when it is given."""
    if message is not None and message not in MESSAGES:
        raise ValueError(f"unknown message kind {message!r}; choose from {', '.join(MESSAGES)}")
    return [c.name for c in REGISTRY if message is None or c.message == message]


def check_names(chosen: Iterable[str]) -> list[str]:
    """``chosen`` as a list if every one is a compressor of :func:`names`; ValueError naming the
    first unknown one and the choices otherwise (the one home of that rule)."""
    chosen = list(chosen)
    unknown = [n for n in chosen if n not in CARDS]
    if unknown:
        raise ValueError(f"unknown compressor {unknown[0]!r}; choose from {', '.join(CARDS)}")
    return chosen


def card(name: str) -> Card:
    """The card of compressor ``name`` (:class:`compressors.work.cards.Card`: every torch-free fact
    about it); ValueError for an unknown name."""
    check_names([name])
    return CARDS[name]


def message_kind(name: str) -> str:
    """The kind of message compressor ``name`` returns (one of :data:`MESSAGES`)."""
    return card(name).message


def takes_density(name: str) -> bool:
    """Whether compressor ``name`` sends the share of the gradient a density sets (the sparse
    selections; its card's ``takes_density``); ``none``, the casts, the quantizers and PowerSGD
    send what their dtype, block format or rank sets."""
    return card(name).takes_density


def exchange(name: str, **options: Any) -> str:
    """How workers combine compressor ``name``'s messages with ``options``: ``"allreduce"`` or
    ``"allgather"`` (its card's :meth:`~compressors.work.cards.Card.collective_for`)."""
    return card(name).collective_for(options)


def compressor_class(name: str) -> type[Compressor]:
    """The class implementing compressor ``name`` (its card's ``implementation``; imports it, and torch)."""
    found = card(name)
    return getattr(importlib.import_module(found.module), found.cls)


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
    if attr in _PARTS:
        return getattr(importlib.import_module(_PARTS[attr]), attr)
    implementing = next((c for c in REGISTRY if c.cls == attr), None)
    if implementing is not None:
        return getattr(importlib.import_module(implementing.module), attr)
    if attr == "ddp":
        return importlib.import_module("compressors.ddp")
    raise AttributeError(f"module 'compressors' has no attribute {attr!r}")
