"""The declared work of the 16-bit casts ``fp16`` and ``bf16`` (:mod:`compressors.casts`),
torch-free for the cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it
to the code."""

from __future__ import annotations

from compressors.messages.wire import ALLREDUCE
from compressors.work.cards import Card
from compressors.work.declare import FINITE_OPS, ISFINITE_OPS, Declared, Work

HALF = 2
"""Bytes per element of a 16-bit cast on the wire."""


def cast(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
         half: int = HALF) -> tuple[Work, Work]:
    """fp16/bf16: the cast into a fresh buffer; off the GPU then ``aminmax`` of the half-width
    values (the finiteness check, and a second check that nothing overflowed the narrower range:
    one sync each); on a GPU (``backend="cuda"``) the cast alone, as PyTorch's hook."""
    c = Work().stream(n, itemsize, half, full=True).allocate(n * half)
    if backend == "cuda":
        return c, Work().stream(n, half, itemsize, full=True)
    c.stream(n, half, 0, "minmax", full=True)
    c.scalars(5)  # max/2 − min/2 in fp32: two widenings, two halvings and the subtraction
    c.scalars(FINITE_OPS).sync().scalars(ISFINITE_OPS).sync()
    return c, Work().stream(n, half, itemsize, full=True)


def wire(n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends: the half-width values (:data:`HALF` bytes each, whatever the
    gradient's dtype)."""
    return float(n * HALF)


FP16 = Card("fp16", "compressors.casts:FP16", "dense", Declared(cast, wire, residual="decompressed"),
            takes_density=False, error_feedback=False, collective=ALLREDUCE, baseline=True, always_compared=True)
"""``fp16``: PyTorch's ``fp16_compress_hook``, no residual."""

BF16 = Card("bf16", "compressors.casts:BF16", "dense", Declared(cast, wire, residual="decompressed"),
            takes_density=False, error_feedback=False, collective=ALLREDUCE, baseline=True)
"""``bf16``: PyTorch's ``bf16_compress_hook``, no residual (the same work and wire as ``fp16``,
so a comparison ranks it when asked for)."""
