"""``int8``: block-wise INT8 quantization, exact to half a scale per element, on adversarial tensors."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compressors
from compressors.messages import wire
from compressors.work import int8 as int8_work

BLOCK = int8_work.BLOCK
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _blockwise_error_bound(grad: torch.Tensor, message) -> None:
    """Every code is the nearest integer to ``g / s`` of its block: ``|g − code·s| ≤ s/2``, checked
    in exact rational arithmetic on a sample (every element of small vectors), and in float64 on all
    of them (``code·s`` is exact there; ``g − code·s`` rounds once, towards the bound)."""
    n = grad.numel()
    assert message.codes.dtype == torch.int8 and message.codes.numel() == n
    assert message.scales.dtype == torch.float32 and message.scales.numel() == -(-n // BLOCK)
    assert int(message.codes.abs().max()) <= int8_work.LEVELS if n else True
    scale = message.scales.double().repeat_interleave(BLOCK)[:n]
    error = (grad.double() - message.codes.double() * scale).abs()
    assert bool((error <= scale / 2).all()), float((error / scale).max())
    step = max(1, n // 512)
    for i in range(0, n, step):
        g, c, s = Fraction(float(grad[i])), int(message.codes[i]), Fraction(float(message.scales[i // BLOCK]))
        assert abs(g - c * s) <= s / 2, (i, g, c, s)
    absmax = grad.double().abs()
    padded = torch.zeros(len(message.scales) * BLOCK, dtype=torch.float64)
    padded[:n] = absmax
    top = padded.view(-1, BLOCK).amax(dim=1)
    assert bool((message.scales.double() * int8_work.LEVELS >= top).all())  # no code clipped


def _check(grad: torch.Tensor) -> None:
    comp = compressors.create("int8")
    message = comp.compress(grad)
    _blockwise_error_bound(grad, message)
    assert message.wire_bytes() == wire.quantized_bytes(grad.numel(), BLOCK) == compressors.work.wire_bytes(
        "int8", grad.numel(), 1.0)
    out = comp.decompress(message)
    exact = message.codes.double() * message.scales.double().repeat_interleave(BLOCK)[:grad.numel()]
    assert out.dtype == grad.dtype and torch.equal(out, exact.to(grad.dtype))  # rounded once to the dtype
    kept = torch.empty_like(grad)
    assert torch.equal(comp.decompress(message, out=kept), out)


def _tensor(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    finite = torch.tensor(values, dtype=torch.float64).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)
    return finite.to(dtype)


magnitudes = st.sampled_from([0.0, 1e-45, 1e-40, 6e-8, 1e-30, 1e-5, 1.0, 3.0, 1e4, 65504.0, 1e30, 3e38])


@st.composite
def adversarial(draw) -> torch.Tensor:
    """Zeros, huge and tiny magnitudes (subnormals included), one outlier per block, sizes not a
    multiple of the block, in fp16, bf16 and fp32."""
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    n = draw(st.sampled_from([1, 2, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17, 5 * BLOCK]))
    kind = draw(st.sampled_from(["zeros", "uniform", "outlier", "mixed", "ties"]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    base = draw(magnitudes)
    if kind == "zeros":
        values = torch.zeros(n, dtype=torch.float64)
    elif kind == "uniform":
        values = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * base
    elif kind == "outlier":  # one huge element per block among small ones
        values = torch.randn(n, generator=gen, dtype=torch.float64) * draw(magnitudes)
        values[::BLOCK] = draw(magnitudes) * draw(st.sampled_from([1.0, -1.0]))
    elif kind == "ties":  # the largest 127 times a power of two: others on exact half-steps
        values = (torch.randint(-254, 255, (n,), generator=gen).double() / 2) * 2.0 ** draw(st.integers(-30, 20))
        values[::BLOCK] = 127 * 2.0 ** draw(st.integers(-30, 20))
    else:
        values = torch.randn(n, generator=gen, dtype=torch.float64) * torch.tensor(
            [draw(magnitudes) for _ in range(8)], dtype=torch.float64).repeat(-(-n // 8))[:n]
    return _tensor(values.tolist(), dtype)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial())
def test_every_element_is_within_half_a_scale_of_its_block(grad: torch.Tensor) -> None:
    _check(grad)


def test_a_block_of_zeros_sends_zeros_and_an_extreme_range_keeps_every_block_exact() -> None:
    grad = torch.zeros(BLOCK + 3)
    grad[BLOCK] = torch.finfo(torch.float32).max
    grad[BLOCK + 1] = torch.finfo(torch.float32).tiny / 8  # a subnormal beside the largest float32
    message = compressors.create("int8").compress(grad)
    assert int(message.codes[:BLOCK].abs().sum()) == 0 and int(message.codes[BLOCK]) == 127
    _check(grad)


def test_empty_nan_and_the_float32_scale_range_are_refused_or_kept() -> None:
    comp = compressors.create("int8")
    empty = comp.compress(torch.empty(0))
    assert empty.wire_bytes() == 0 and comp.decompress(empty).numel() == 0
    with pytest.raises(ValueError, match="NaN"):
        comp.compress(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="float32 scales"):
        comp.compress(torch.tensor([1e300], dtype=torch.float64))
    grad = torch.randn(1000, dtype=torch.float64)
    message = comp.compress(grad)
    scale = message.scales.double().repeat_interleave(BLOCK)[:1000]
    assert bool(((grad - message.codes.double() * scale).abs() <= scale / 2).all())


def test_the_card_says_how_it_travels_and_is_priced() -> None:
    card = compressors.card("int8")
    assert card.message == compressors.message_kind("int8") == compressors.Int8.message == "quantized"
    assert not compressors.takes_density("int8") and compressors.exchange("int8") == "allgather"
    assert wire.allreduce_bytes("int8", 4096, None) is None
    assert compressors.work.wire_bytes("int8", 1000, 0.01) == 1000 + 4 * 4  # 4 blocks of 256, the last partial
    work = compressors.work.work("int8", 1 << 20, 1.0)
    assert work.compress.syncs == 1 and work.compress.passes > 0


def test_error_feedback_keeps_the_rounding_error() -> None:
    grad = torch.randn(3 * BLOCK + 5)
    comp = compressors.create("int8")
    ef = compressors.ErrorFeedback(comp)
    message = ef.compress(grad)
    residual = grad - comp.decompress(message)
    again = ef.compress(torch.zeros_like(grad))
    scale = again.scales.double().repeat_interleave(BLOCK)[: grad.numel()]
    assert bool(((residual.double() - again.codes.double() * scale).abs() <= scale / 2).all())
