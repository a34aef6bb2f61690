"""What the quantizers' tests share (tests/test_int8.py, tests/test_fp8.py, tests/test_int4.py): the
adversarial tensors hypothesis draws, and each message's codes and scales read back exactly."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

MAGNITUDES = st.sampled_from([0.0, 1e-45, 1e-40, 6e-8, 1e-30, 1e-5, 1.0, 3.0, 1e4, 65504.0, 1e30, 3e38])
"""Zero, float32 and float16 subnormals, ordinary values, each 16-bit dtype's largest, float32's."""

Ties = Callable[[int, torch.Generator, int], torch.Tensor]
"""``(n, generator, exponent) -> values``: ``n`` values whose quotients by the block scale lie at
(a float32 step below) the midpoints of the code grid, the first of each block the grid's largest,
all times ``2^exponent``."""


def dtype_tensor(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float64) clamped to ``dtype``'s finite range and cast to it (signs of zeros kept)."""
    return values.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)


@st.composite
def adversarial(draw, block: int, ties: Ties) -> torch.Tensor:
    """Zeros of both signs, huge and tiny magnitudes (subnormals included), one outlier per block,
    values at the code grid's midpoints (``ties``), sizes not a multiple of ``block`` (odd ones
    among them), in fp16, bf16 and fp32."""
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    n = draw(st.sampled_from([1, 2, 3, block - 1, block, block + 1, 3 * block + 17, 5 * block]))
    kind = draw(st.sampled_from(["zeros", "uniform", "outlier", "mixed", "ties", "signed zeros"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    base = draw(MAGNITUDES)
    if kind == "zeros":
        values = torch.zeros(n, dtype=torch.float64)
    elif kind == "signed zeros":  # −0 and +0 among a few values
        values = torch.randn(n, generator=gen, dtype=torch.float64) * base
        values[::2] = -0.0
        values[1::3] = 0.0
    elif kind == "uniform":
        values = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * base
    elif kind == "outlier":  # one huge element per block among small ones
        values = torch.randn(n, generator=gen, dtype=torch.float64) * draw(MAGNITUDES)
        values[::block] = draw(MAGNITUDES) * draw(st.sampled_from([1.0, -1.0]))
    elif kind == "ties":
        values = ties(n, gen, draw(st.integers(-30, 20)))
    else:
        values = torch.randn(n, generator=gen, dtype=torch.float64) * torch.tensor(
            [draw(MAGNITUDES) for _ in range(8)], dtype=torch.float64).repeat(-(-n // 8))[:n]
    return dtype_tensor(values, dtype)


def integer_ties(block: int, levels: int) -> Ties:
    """Half-integer quotients for integer codes in [−levels, levels]: the block's largest
    ``levels · 2^e``, the others ``j/2 · 2^e``."""
    def ties(n: int, gen: torch.Generator, exponent: int) -> torch.Tensor:
        values = (torch.randint(-2 * levels, 2 * levels + 1, (n,), generator=gen).double() / 2) * 2.0 ** exponent
        values[::block] = levels * 2.0 ** exponent
        return values
    return ties


def block_scales(message, n: int) -> torch.Tensor:
    """Each element's block scale (float64, exact)."""
    return message.scales.double().repeat_interleave(message.block)[:n]


def block_absmax(grad: torch.Tensor, block: int) -> torch.Tensor:
    """Each block's largest ``|g|`` (float64)."""
    n = grad.numel()
    padded = torch.zeros(-(-n // block) * block, dtype=torch.float64)
    padded[:n] = grad.double().abs()
    return padded.view(-1, block).amax(dim=1)
