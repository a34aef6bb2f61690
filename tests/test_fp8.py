"""``fp8``: block-wise e4m3 quantization, each element within half an e4m3 spacing of its quotient
by the block scale, exactly, on adversarial tensors."""

from __future__ import annotations

import bisect
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import compressors
from compressors.fp8 import Fp8
from compressors.messages import wire
from compressors.work import fp8 as fp8_work
from quantized import adversarial, block_absmax, block_scales

BLOCK = fp8_work.BLOCK
E4M3 = torch.float8_e4m3fn


def _e4m3_numbers() -> list[Fraction]:
    """Every finite e4m3 number, ascending (−0 and +0 once), from all 256 bit patterns."""
    values = torch.arange(256, dtype=torch.uint8).view(E4M3).double().tolist()
    return sorted({Fraction(v) for v in values if v == v})


NUMBERS = _e4m3_numbers()
MIDPOINTS = [(a + b) / 2 for a, b in zip(NUMBERS, NUMBERS[1:])]


def _floor_log2(q: Fraction) -> int:
    """``⌊log₂ q⌋`` of a positive rational, exactly."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > q else e


def half_spacing(q: Fraction) -> Fraction:
    """Half the spacing of the e4m3 numbers at ``q``: ``2^(max(⌊log₂|q|⌋, −6) − 4)``."""
    return Fraction(2) ** (max(_floor_log2(abs(q)) if q else -6, -6) - 4)


def _nearest(q: Fraction) -> Fraction:
    """The e4m3 number nearest ``q`` (``|q| ≤ 448``), ties to the one with an even bit pattern (an
    even mantissa)."""
    i = bisect.bisect_left(NUMBERS, q)
    around = NUMBERS[max(i - 1, 0):i + 1]
    best = min(abs(q - x) for x in around)
    tied = [x for x in around if abs(q - x) == best]
    if len(tied) > 1:
        tied = [x for x in tied if int(torch.tensor(float(x)).to(E4M3).view(torch.uint8)) % 2 == 0]
    return tied[0]


def _e4m3_ties(n: int, gen: torch.Generator, exponent: int) -> torch.Tensor:
    """Midpoints of consecutive e4m3 numbers, either sign, times the scale their block gets (its
    largest is 448·2^e, so ``s = 2^e·(1 + 2⁻²³)``): once rounded to the gradient's dtype their
    quotients lie within a float32 rounding of a midpoint, where rounding through float32 twice
    breaks the tie the wrong way."""
    picks = torch.randint(0, len(MIDPOINTS), (n,), generator=gen).tolist()
    signs = torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1
    values = torch.tensor([float(MIDPOINTS[i]) for i in picks], dtype=torch.float64) * signs
    values *= 2.0 ** exponent * (1 + 2.0 ** -23)
    values[::BLOCK] = fp8_work.LEVELS * 2.0 ** exponent
    return values


def _check(grad: torch.Tensor) -> None:
    """Every code the e4m3 number nearest ``g / s`` and within half an e4m3 spacing of it, in exact
    rational arithmetic; no scale too small; the wire bytes; decompress rounding ``code · s`` once
    to the gradient's dtype (signs of zeros kept)."""
    comp = compressors.create("fp8")
    message = comp.compress(grad)
    n = grad.numel()
    assert message.codes.dtype == E4M3 and message.codes.numel() == message.numel == n
    assert message.scales.dtype == torch.float32 and message.scales.numel() == -(-n // BLOCK)
    assert bool((message.scales.double() * fp8_work.LEVELS >= block_absmax(grad, BLOCK)).all())  # none clipped
    codes = message.codes.double()
    scales = [Fraction(s) for s in message.scales.double().tolist()]
    for i, (g, c) in enumerate(zip(grad.double().tolist(), codes.tolist())):
        q = Fraction(g) / scales[i // BLOCK]
        assert abs(q - Fraction(c)) <= half_spacing(q), (i, g, c, scales[i // BLOCK])
        assert Fraction(c) == _nearest(q), (i, g, c, scales[i // BLOCK])
    assert message.wire_bytes() == wire.quantized_bytes(n, BLOCK) == compressors.work.wire_bytes("fp8", n, 1.0)
    out = comp.decompress(message)
    exact = (codes * block_scales(message, n)).to(grad.dtype)  # code · s is exact in float64
    assert out.dtype == grad.dtype and torch.equal(out, exact) and torch.equal(torch.signbit(out), torch.signbit(exact))
    kept = torch.empty_like(grad)
    assert torch.equal(comp.decompress(message, out=kept), out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial(BLOCK, _e4m3_ties))
def test_every_element_is_the_e4m3_number_nearest_its_quotient(grad: torch.Tensor) -> None:
    _check(grad)


def test_every_midpoint_and_its_neighbours_round_to_the_nearest_e4m3_number() -> None:
    """The encoder alone on quotients at every midpoint of consecutive e4m3 numbers and 2⁻⁴⁰
    (relative) either side of it, where torch's float64→float8 cast, rounding through float32,
    lands on the midpoint and breaks the tie (1.0625·(1 + 2⁻²⁸) must give 1.125)."""
    quotients = [float(m) * f for m in MIDPOINTS for f in (1.0, 1 + 2.0 ** -40, 1 - 2.0 ** -40)]
    quotients += [1.0625 * (1 + 2.0 ** -28), 0.0, -0.0]
    work = torch.tensor(quotients, dtype=torch.float64)
    codes = Fp8(1.0)._encode(work.clone(), work.numel())
    assert codes.dtype == E4M3
    got = [Fraction(c) for c in codes.double().tolist()]
    assert got == [_nearest(Fraction(q)) for q in quotients]
    assert got[-3] == Fraction(1.125) and torch.signbit(codes[-1].double()) and not torch.signbit(codes[-2].double())


def test_a_zero_block_sends_zeros_and_an_extreme_range_keeps_every_block_within_its_bound() -> None:
    grad = torch.zeros(BLOCK + 3)
    grad[BLOCK] = torch.finfo(torch.float32).max
    grad[BLOCK + 1] = torch.finfo(torch.float32).tiny / 8  # a subnormal beside the largest float32
    grad[BLOCK + 2] = -0.0
    message = compressors.create("fp8").compress(grad)
    assert float(message.codes[:BLOCK].double().abs().sum()) == 0 and float(message.codes[BLOCK].double()) == 448
    _check(grad)


def test_one_outlier_sends_its_block_s_small_values_at_the_subnormal_floor() -> None:
    """An outlier of 448 sets the scale to about 1: elements below 2⁻⁶ fall among e4m3's subnormals,
    spaced 2⁻⁹, so their error is at most s·2⁻¹⁰, not 2⁻⁴ of their size."""
    grad = torch.full((BLOCK,), 3e-3)
    grad[0] = 448.0
    message = compressors.create("fp8").compress(grad)
    s = float(message.scales[0])
    assert float(message.codes[1].double()) == 2 * 2.0 ** -9  # 3e-3 lies nearest 2·2⁻⁹
    assert abs(3e-3 - 2 * 2.0 ** -9 * s) <= s * 2.0 ** -10
    _check(grad)


def test_empty_nan_inf_and_the_float32_scale_range_are_refused_or_kept() -> None:
    comp = compressors.create("fp8")
    empty = comp.compress(torch.empty(0))
    assert empty.wire_bytes() == 0 and comp.decompress(empty).numel() == 0
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match="NaN"):
            comp.compress(torch.tensor([1.0, bad]))
    with pytest.raises(ValueError, match="float32 scales"):
        comp.compress(torch.tensor([1e300], dtype=torch.float64))
    grad = torch.randn(1000, dtype=torch.float64)
    message = comp.compress(grad)
    for i in range(0, 1000, 7):
        q = Fraction(float(grad[i])) / Fraction(float(message.scales[i // BLOCK]))
        assert abs(q - Fraction(float(message.codes[i].double()))) <= half_spacing(q) * (1 + Fraction(1, 2**40))
    assert torch.equal(comp.decompress(message), message.codes.double() * block_scales(message, 1000))


def test_the_card_says_how_it_travels_and_is_priced() -> None:
    card = compressors.card("fp8")
    assert card.message == compressors.message_kind("fp8") == compressors.Fp8.message == "quantized"
    assert not compressors.takes_density("fp8") and compressors.exchange("fp8") == "allgather"
    assert wire.allreduce_bytes("fp8", 4096, None) is None
    assert compressors.work.wire_bytes("fp8", 1000, 0.01) == 1000 + 4 * 4  # 4 blocks of 256, the last partial
    assert fp8_work.LEVELS == torch.finfo(E4M3).max and fp8_work.SMALLEST_NORMAL == torch.finfo(E4M3).smallest_normal
    work = compressors.work.work("fp8", 1 << 20, 1.0)
    assert work.compress.syncs == 1 and work.compress.passes > 0


def test_error_feedback_keeps_the_rounding_error() -> None:
    grad = torch.randn(3 * BLOCK + 5)
    comp = compressors.create("fp8")
    ef = compressors.ErrorFeedback(comp)
    message = ef.compress(grad)
    residual = grad - comp.decompress(message)
    again = ef.compress(torch.zeros_like(grad))
    assert torch.equal(comp.decompress(again), comp.decompress(comp.compress(residual)))
