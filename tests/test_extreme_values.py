"""Extreme values: every finite value bf16 can hold is sent by ``bf16``; Gaussian-k's threshold
beyond the dtype's range comes back into range, so it selects the same elements on ``g`` and on
``g·2^k`` (a power of two changes no comparison); links outside the physical range are refused in
one line and ``--json`` output is always valid JSON."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
from emulation.plan import TBF_MAX_BPS, TBF_MIN_BPS, check_shaping, tbf_parameters
from sidco.cli import main
from sidco.commands import dump_json
from units import MAX_BANDWIDTH_BPS, MIN_BANDWIDTH_BPS, parse_bandwidth

BF16_MAX = float(torch.finfo(torch.bfloat16).max)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-BF16_MAX, max_value=BF16_MAX, width=32), min_size=1, max_size=40))
def test_bf16_sends_every_value_inside_its_range(values):
    g = torch.tensor(values, dtype=torch.float32)
    message = compressors.create("bf16", density=1.0).compress(g)
    back = compressors.create("bf16", density=1.0).decompress(message)
    assert torch.equal(back, g.to(torch.bfloat16).float())  # exactly PyTorch's own cast
    assert bool(torch.isfinite(back).all())


def test_bf16_of_the_issue_and_beyond_its_range():
    back = compressors.create("bf16", density=1.0).compress(torch.tensor([3e38, -3e38]))
    assert back.values.float().tolist() == torch.tensor([3e38, -3e38]).to(torch.bfloat16).float().tolist()
    try:
        compressors.create("bf16", density=1.0).compress(torch.tensor([3.4e38, -1.0]))  # rounds to Inf in bf16
    except ValueError as exc:
        assert "beyond the range of torch.bfloat16" in str(exc)
    else:
        raise AssertionError("a value that bf16 rounds to Inf was sent")


def test_gaussiank_threshold_beyond_the_range_is_scale_invariant():
    """Uniform data on [-2, 2) at δ = 0.001: the normal fit's threshold (μ + 3.29σ ≈ 3.8) times
    2^127 is beyond fp32's largest value; it must select nothing (not clamp to the largest value,
    which made the corrections end elsewhere) and the corrections bring it back."""
    torch.manual_seed(0)
    g = torch.rand(100_000) * 4 - 2
    huge = g * 2.0 ** 127
    assert bool(torch.isfinite(huge).all())
    for density in (0.001, 0.01, 0.1):
        small = compressors.create("gaussiank", density=density).compress(g)
        large = compressors.create("gaussiank", density=density).compress(huge)
        assert torch.equal(small.indices, large.indices), density
        assert bool(torch.isfinite(large.threshold_tensor))


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_sidco_at_a_tiny_density_sends_its_target_from_the_first_call(name, backend):
    """δ = 1e-9 on 10⁶ half-normal magnitudes: k = 1. SIDCo-P's single Pareto fit has a bounded
    tail there (ξ < 0), so no tail mass moves its threshold past ~3σ (it sent ~3,500 elements on
    its first two calls); a stage added within the call fits the exceedances and reaches k."""
    c = compressors.create(name, density=1e-9, backend=backend)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        g = torch.randn(1_000_000, generator=gen).abs() * 0.01
        sent = c.compress(g).indices.numel()
        assert sent == 1, (name, backend, sent)


@settings(max_examples=100, deadline=None)
@given(mantissa=st.floats(min_value=1.0, max_value=9.99), exponent=st.integers(min_value=-400, max_value=400),
       unit=st.sampled_from(["bit", "Gbit", "kbit/s", "B/s", "TB/s"]))
def test_bandwidths_are_inside_the_physical_range_or_refused_in_one_line(mantissa, exponent, unit):
    text = f"{mantissa:.2f}e{exponent}{unit}"
    try:
        bps = parse_bandwidth(text)
    except ValueError as exc:
        assert "\n" not in str(exc) and text in str(exc)
        value = float(f"{mantissa:.2f}e{exponent}") * {"bit": 1, "Gbit": 1e9, "kbit/s": 1e3, "B/s": 8,
                                                         "TB/s": 8e12}[unit]
        assert not MIN_BANDWIDTH_BPS <= value <= MAX_BANDWIDTH_BPS
    else:
        assert MIN_BANDWIDTH_BPS <= bps <= MAX_BANDWIDTH_BPS


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.text(max_size=3) | st.none(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20))
def test_json_output_is_always_valid_json(value):
    def refuse(name):
        raise AssertionError(f"{name} in JSON output")

    text = dump_json(value)
    json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("option", [["--bandwidth", "1e-300bit"], ["--bandwidth", "1e400Gbit"],
                                    ["--latency", "1e9s"], ["--latency", "1e400s"]])
def test_simulate_refuses_unphysical_links_in_one_line(tmp_path, capsys, option):
    argv = ["simulate", "--layout", "resnet50", "--nodes", "8", "--bandwidth", "10Gbit", "--compressor", "topk",
            "--density", "0.01", "--fidelity", "analytic", "--json", *option, "--store", str(tmp_path / "r.sqlite")]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "physical range" in err or "too large" in err, err


def test_the_slowest_and_fastest_links_project_finite_json(tmp_path, capsys):
    for bandwidth in ("1kbit", "1000Tbit"):
        code = main(["simulate", "--layout", "resnet50", "--nodes", "8", "--bandwidth", bandwidth, "--compressor",
                     "topk", "--density", "0.01", "--fidelity", "analytic", "--json",
                     "--store", str(tmp_path / "r.sqlite")])
        assert code == 0
        result = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(name))
        assert math.isfinite(result["iteration_s"]) and result["iteration_s"] > 0


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1.0, max_value=1e15))
def test_every_shapeable_rate_gives_tbf_parameters_tc_takes(bps):
    try:
        check_shaping(bps)
    except ValueError as exc:
        assert not TBF_MIN_BPS <= bps <= TBF_MAX_BPS and "tc tbf takes" in str(exc)
        return
    burst, limit = tbf_parameters(bps)
    assert int(bps) >= 8 and 0 < burst < limit <= 2**32 - 1


@pytest.mark.parametrize("bandwidth", ["1Tbit", "400Gbit"])
def test_emulate_refuses_a_rate_tc_cannot_shape_before_building_anything(tmp_path, capsys, bandwidth):
    code = main(["emulate", "--workers", "2", "--bandwidth", f"10Mbit,{bandwidth}", "--compressors", "none",
                 "--store", str(tmp_path / "r.sqlite")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "tc tbf takes" in err, err
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.root
def test_tc_takes_the_extreme_rates(tmp_path):
    import subprocess

    ns = f"sidco-{os.getpid()}-tbfprobe"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "a0", "type", "veth", "peer", "name", "b0"], check=True)
        for bps in (TBF_MIN_BPS, TBF_MAX_BPS):
            burst, limit = tbf_parameters(bps)
            done = subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", "a0", "root", "tbf", "rate",
                                   f"{int(bps)}bit", "burst", str(burst), "limit", str(limit)],
                                  capture_output=True, text=True)
            assert done.returncode == 0, (bps, done.stderr)
    finally:
        subprocess.run(["ip", "netns", "delete", ns])
