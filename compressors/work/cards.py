"""A compressor's card: every torch-free fact the testbed keeps about one compressor, in one place.

A card stands beside the compressor's declared work in its companion module
(``compressors/work/<module>.py`` for ``compressors/<module>.py``); the registry
(:data:`compressors.work.REGISTRY`) is one explicit list of cards, and every list the rest of the
testbed asks for (names, message kinds, which compressors take a density, keep error feedback, run
native kernels on a CPU, have data-dependent loop counts, are all-reduced, are dense baselines) is
derived from it. docs/extending.md, "Add a compressor", says how to write one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compressors.messages.wire import ALLGATHER, ALLREDUCE
from compressors.work.declare import Declared

MESSAGES: tuple[str, ...] = ("sparse", "dense", "lowrank", "quantized")
"""Kinds of message a compressor returns (its class's ``message``): values at indices
(``sparse``), the whole vector in a narrower dtype (``dense``), low-rank factors (``lowrank``),
or integer codes with per-block scales (``quantized``)."""

COLLECTIVES: tuple[str, ...] = (ALLREDUCE, ALLGATHER)
"""``allreduce``: messages of identical layout, summed elementwise by the network; ``allgather``:
every worker's message gathered by every worker, which decompresses each and sums them."""

SEED_STRIDE = 1_000_003
"""Offset between the shared seeds of consecutive DDP buckets (:meth:`Card.bucket_options`):
each bucket draws different indices, every rank the same ones."""

LoopReader = Callable[[Sequence[str], "int | None"], dict[str, Any]]
"""``(ops, stages) -> counts``: the data-dependent loop counts of one call read from the operations
it dispatched (:func:`compressors.work.counting.record_ops`), as :func:`compressors.work.work`
takes them; ``stages``: SIDCo's planned stage count when it was read, else ``None``."""


@dataclass(frozen=True)
class Card:
    """One compressor's facts (no torch)."""

    name: str
    """The registry name (the class's ``name``; what ``compressors.create`` takes)."""
    implementation: str
    """``"module:Class"``: the class that implements it, imported (with torch) on first use."""
    message: str
    """The kind of message it returns (:data:`MESSAGES`; the class's ``message``)."""
    declared: Declared
    """Its declared work, wire bytes and what is priced differently for it around its calls."""
    takes_density: bool = True
    """Whether it sends the share of the gradient a density sets (the sparse selections);
    ``False`` for what sends what its dtype, rank or block format sets."""
    error_feedback: bool = True
    """Whether training through :func:`compressors.ddp.comm_hook` with its default memory keeps a
    residual for it (what profiles and the cost model assume of its calls)."""
    native_on_cpu: bool = False
    """Whether its CPU float32 path runs the fused C kernels of :mod:`compressors.kernels.native`."""
    loops: LoopReader | None = None
    """How to read its data-dependent loop counts from a call's operations (:data:`LoopReader`);
    ``None``: its work depends on the size and density alone."""
    collective: str = ALLGATHER
    """The collective that carries its message (:data:`COLLECTIVES`) without options."""
    shared_seed: str | None = None
    """The option that, when given, makes every rank draw the same indices, so that only the values
    are all-reduced (Random-k's ``seed``); each DDP bucket's compressor gets it offset by
    :data:`SEED_STRIDE` times the bucket's index."""
    baseline: bool = False
    """Whether it is a dense baseline every comparison weighs the sparsifiers against."""
    always_compared: bool = False
    """Whether a comparison ranks it even when not asked for (a baseline)."""

    def __post_init__(self) -> None:
        if self.message not in MESSAGES:
            raise ValueError(f"card {self.name!r}: message {self.message!r} is not one of {', '.join(MESSAGES)}")
        if self.collective not in COLLECTIVES:
            raise ValueError(f"card {self.name!r}: collective {self.collective!r} is not one of "
                             f"{', '.join(COLLECTIVES)}")
        if ":" not in self.implementation:
            raise ValueError(f"card {self.name!r}: implementation must be 'module:Class', "
                             f"got {self.implementation!r}")
        if self.always_compared and not self.baseline:
            raise ValueError(f"card {self.name!r}: only a baseline is compared always")

    @property
    def module(self) -> str:
        """The module that implements it."""
        return self.implementation.split(":", 1)[0]

    @property
    def cls(self) -> str:
        """The name of the class that implements it."""
        return self.implementation.split(":", 1)[1]

    def shares_indices(self, options: Mapping[str, Any] | None = None) -> bool:
        """Whether, with ``options``, every rank sends the same indices (its :attr:`shared_seed` given)."""
        return self.shared_seed is not None and (options or {}).get(self.shared_seed) is not None

    def collective_for(self, options: Mapping[str, Any] | None = None) -> str:
        """The collective that carries its message with ``options`` (as for ``compressors.create``):
        an all-reduce of the values where the indices are shared, else :attr:`collective`."""
        return ALLREDUCE if self.shares_indices(options) else self.collective

    def bucket_options(self, options: Mapping[str, Any], index: int) -> dict[str, Any]:
        """``options`` for the compressor of DDP bucket ``index``: a shared seed offset by
        :data:`SEED_STRIDE` · ``index`` (the same on every rank), the others as given."""
        chosen = dict(options)
        if self.shares_indices(options):
            chosen[self.shared_seed] = options[self.shared_seed] + SEED_STRIDE * index
        return chosen
