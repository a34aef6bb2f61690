"""Seeded gradient-like vectors, for benchmarks, measured device profiles and tests that need
data shaped like real gradients without a training run."""

from __future__ import annotations

import torch


def gradient_like(size: int, seed: int = 0, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A seeded gradient-like vector: 70 % Laplace(0, 1e-3) and 30 % Student-t(3)·1e-3 elements,
    interleaved at random positions (heavier tail than Laplace, like real gradients)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(size, generator=gen) - 0.5
    laplace = -torch.sign(u) * torch.log1p(-(2.0 * u.abs()).clamp_max(1.0 - 2.0**-24))
    chi2 = torch.distributions.Chi2(torch.tensor(3.0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        student = torch.randn(size, generator=gen) / torch.sqrt(chi2.sample((size,)).clamp_min(1e-12) / 3.0)
    heavy = torch.rand(size, generator=gen) < 0.3
    return (torch.where(heavy, student, laplace) * 1e-3).to(device=device, dtype=dtype)
