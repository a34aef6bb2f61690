"""The declared work of the 16-bit casts ``fp16`` and ``bf16`` (:mod:`compressors.casts`),
torch-free for the cost model (:mod:`compressors.work.declare`); tests/test_compressors_work.py holds it
to the code."""

from __future__ import annotations

import functools

from compressors.messages.wire import DENSE_ALLREDUCE
from compressors.work.declare import FINITE_OPS, ISFINITE_OPS, Declared, Work


def cast(n: int, density: float, itemsize: int, stages: int, rounds: int | None, backend: str,
         half: int = 2) -> tuple[Work, Work]:
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


def _wire(name: str, n: int, density: float, itemsize: int) -> float:
    """Bytes one worker sends for cast ``name``: the half-width values
    (:data:`compressors.messages.wire.DENSE_ALLREDUCE`)."""
    return float(n * DENSE_ALLREDUCE[name])


DECLARES: dict[str, Declared] = {name: Declared(cast, functools.partial(_wire, name), residual="decompressed")
                                 for name in ("fp16", "bf16")}
"""Each cast by name (the same work: both send 2 bytes per element)."""
