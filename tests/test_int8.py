"""``int8``: block-wise INT8 quantization, exact to half a scale per element, on adversarial tensors."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import compressors
from compressors.messages import wire
from compressors.work import int8 as int8_work
from quantized import adversarial, integer_ties

BLOCK = int8_work.BLOCK


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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial(BLOCK, integer_ties(BLOCK, int8_work.LEVELS)))
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
