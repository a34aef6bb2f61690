"""``int4``: block-wise 4-bit quantization, exact to half a scale per element, two codes a byte, on
adversarial tensors."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compressors
from compressors.int4 import Int4
from compressors.messages import wire
from compressors.messages.kinds import Quantized
from compressors.work import int4 as int4_work
from quantized import adversarial, block_absmax, block_scales, integer_ties

BLOCK = int4_work.BLOCK


def unpacked(message) -> list[int]:
    """The codes of ``message`` read off its bytes here, independently of the compressor: every
    byte's lower nibble (the first half), then every byte's upper one (the second), less 8."""
    packed = message.codes.tolist()
    return ([(byte & 0xF) - 8 for byte in packed] + [(byte >> 4) - 8 for byte in packed])[:message.numel]


def _check(grad: torch.Tensor) -> None:
    """Every code the nearest integer to ``g / s`` (``|g − code·s| ≤ s/2``) in exact rational
    arithmetic, within [−7, 7], no scale too small, the packing, the wire bytes, and decompress
    rounding ``code · s`` once to the gradient's dtype."""
    comp = compressors.create("int4")
    message = comp.compress(grad)
    n = grad.numel()
    assert message.codes.dtype == torch.uint8 and message.codes.numel() == -(-n // 2) and message.numel == n
    assert message.scales.dtype == torch.float32 and message.scales.numel() == -(-n // BLOCK)
    assert bool((message.scales.double() * int4_work.LEVELS >= block_absmax(grad, BLOCK)).all())  # none clipped
    codes = unpacked(message)
    if n % 2:
        assert message.codes[-1] >> 4 == int4_work.OFFSET  # the last byte's empty half: a zero code
    scales = [Fraction(s) for s in message.scales.double().tolist()]
    for i, (g, c) in enumerate(zip(grad.double().tolist(), codes)):
        s = scales[i // BLOCK]
        assert -int4_work.LEVELS <= c <= int4_work.LEVELS and abs(Fraction(g) - c * s) <= s / 2, (i, g, c, s)
    assert message.wire_bytes() == wire.quantized_bytes(n, BLOCK, 4) == compressors.work.wire_bytes("int4", n, 1.0)
    assert message.wire_bytes() == message.codes.numel() + 4 * message.scales.numel()
    out = comp.decompress(message)
    exact = torch.tensor(codes, dtype=torch.float64) * block_scales(message, n)
    assert out.dtype == grad.dtype and torch.equal(out, exact.to(grad.dtype))  # rounded once to the dtype
    kept = torch.empty_like(grad)
    assert torch.equal(comp.decompress(message, out=kept), out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial(BLOCK, integer_ties(BLOCK, int4_work.LEVELS)))
def test_every_element_is_within_half_a_scale_of_its_block(grad: torch.Tensor) -> None:
    _check(grad)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-7, 7), max_size=300))
def test_packing_round_trips_every_code_exactly(codes: list[int]) -> None:
    """Any codes in [−7, 7], odd counts included: packed into bytes ``(code[i] + 8) + 16·(code[i +
    h] + 8)``, ``h = ⌈n/2⌉``, and unpacked by the compressor, each comes back as it was."""
    n = len(codes)
    comp = Int4(1.0)
    work = torch.zeros(-(-n // BLOCK) * BLOCK, dtype=torch.float64)
    work[:n] = torch.tensor(codes, dtype=torch.float64)
    packed = comp._encode(work, n)
    half = -(-n // 2)
    padded = codes + [0] * (n % 2)
    assert packed.tolist() == [(lo + 8) + 16 * (hi + 8) for lo, hi in zip(padded[:half], padded[half:])]
    message = Quantized(packed, torch.ones(-(-n // BLOCK)), BLOCK, torch.float32, n, int4_work.BITS)
    assert comp._codes(message)[0].tolist() == codes
    assert comp.decompress(message).tolist() == [float(c) for c in codes]


def test_a_zero_block_sends_zeros_and_an_extreme_range_keeps_every_block_exact() -> None:
    grad = torch.zeros(BLOCK + 3)
    grad[BLOCK] = torch.finfo(torch.float32).max
    grad[BLOCK + 1] = torch.finfo(torch.float32).tiny / 8  # a subnormal beside the largest float32
    message = compressors.create("int4").compress(grad)
    codes = unpacked(message)
    assert all(c == 0 for c in codes[:BLOCK]) and codes[BLOCK] == 7
    _check(grad)


def test_empty_nan_inf_and_the_float32_scale_range_are_refused_or_kept() -> None:
    comp = compressors.create("int4")
    empty = comp.compress(torch.empty(0))
    assert empty.wire_bytes() == 0 and comp.decompress(empty).numel() == 0
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="NaN"):
            comp.compress(torch.tensor([1.0, bad]))
    with pytest.raises(ValueError, match="float32 scales"):
        comp.compress(torch.tensor([1e300], dtype=torch.float64))
    grad = torch.randn(1001, dtype=torch.float64)
    message = comp.compress(grad)
    scale = block_scales(message, 1001)
    decoded = comp.decompress(message)
    assert torch.equal(decoded, torch.tensor(unpacked(message), dtype=torch.float64) * scale)
    assert bool(((grad - decoded).abs() <= scale / 2).all())


def test_the_card_says_how_it_travels_and_is_priced() -> None:
    card = compressors.card("int4")
    assert card.message == compressors.message_kind("int4") == compressors.Int4.message == "quantized"
    assert not compressors.takes_density("int4") and compressors.exchange("int4") == "allgather"
    assert wire.allreduce_bytes("int4", 4096, None) is None
    assert compressors.work.wire_bytes("int4", 1001, 0.01) == 501 + 4 * 16  # 16 blocks of 64, the last partial
    assert wire.quantized_packed_bytes(1001, BLOCK, 4) == 568  # 565 bytes and the flag, to a multiple of 4
    work = compressors.work.work("int4", 1 << 20, 1.0)
    assert work.compress.syncs == 1 and work.compress.passes > 0


def test_error_feedback_keeps_the_rounding_error() -> None:
    grad = torch.randn(3 * BLOCK + 5)
    comp = compressors.create("int4")
    ef = compressors.ErrorFeedback(comp)
    message = ef.compress(grad)
    residual = grad - comp.decompress(message)
    again = ef.compress(torch.zeros_like(grad))
    assert torch.equal(comp.decompress(again), comp.decompress(comp.compress(residual)))
