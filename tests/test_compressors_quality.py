"""Threshold quality of SIDCo against oracles and a float64 SciPy reference; adaptive stages."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
from compressors import sidco
from compressors.numerics import estimators
from compressors.sidco import stage_probabilities

RNG_SEED = 20210125


def signed(x: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Magnitudes ``x`` with random signs, as fp32."""
    return torch.from_numpy((x * rng.choice([-1.0, 1.0], size=x.size)).astype(np.float32))


def ratio(name: str, g: torch.Tensor, density: float, **options) -> float:
    s = compressors.create(name, density=density, **options).compress(g)
    return s.selected / (density * g.numel())


@pytest.fixture(scope="module")
def laplace_4m() -> torch.Tensor:
    rng = np.random.default_rng(RNG_SEED)
    return signed(rng.exponential(size=4_000_000), rng)


@pytest.mark.parametrize("density", [0.1, 0.01, 0.001])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_sidco_e_is_exact_on_laplace(laplace_4m, density, stages):
    assert 0.97 <= ratio("sidco-e", laplace_4m, density, stages=stages) <= 1.03


@pytest.mark.parametrize("alpha", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("density", [0.1, 0.01, 0.001])
def test_sidco_gp_on_gamma(alpha, density):
    rng = np.random.default_rng(int(alpha * 10) + RNG_SEED)
    g = signed(rng.gamma(alpha, 2.0, size=2_000_000), rng)
    for stages in (1, 4):
        assert 0.9 <= ratio("sidco-gp", g, density, stages=stages) <= 1.1, stages


@pytest.mark.parametrize("xi", [-0.2, 0.1, 0.3])
@pytest.mark.parametrize("density", [0.1, 0.01, 0.001])
def test_sidco_p_on_generalized_pareto(xi, density):
    rng = np.random.default_rng(int(xi * 100) + RNG_SEED)
    g = signed(scipy.stats.genpareto.rvs(xi, scale=0.01, size=2_000_000, random_state=rng), rng)
    for stages in (1, 2, 4):
        assert 0.9 <= ratio("sidco-p", g, density, stages=stages) <= 1.1, stages


def test_gamma_threshold_is_the_fitted_gammas_upper_quantile():
    """The gamma threshold is the true upper quantile of the fitted law (SciPy's), at shapes from
    the clamp's lower end to nearly constant data, not the closed form exact only at α = 1."""
    for mu, mean_log in ((1.0, -3.0), (1.0, -0.9), (2.0, 0.5), (0.01, -4.7), (1.0, -1e-9)):
        alpha = estimators.gamma_shape(mu, mean_log)
        for p in (0.25, 1e-2, 1e-3, 1e-5):
            want = scipy.stats.gamma.isf(p, alpha, scale=mu / alpha)
            assert estimators.gamma_threshold(mu, mean_log, p) == pytest.approx(want, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-30, 1e30), st.floats(-60.0, 60.0), st.floats(1e-300, 1.0))
def test_gamma_quantile_is_the_threshold_of_its_shape(mu, mean_log, p):
    """The shape computed once per fit and the quantile of each try give, bit for bit, the
    threshold computed whole, and SciPy's ufunc ``gammainccinv`` gives the same ``Q⁻¹``;
    SIDCo-GP's per-fit quantile is its threshold at every tail mass."""
    alpha = estimators.gamma_shape(mu, mean_log)
    want = float(mu) / alpha * float(scipy.special.gammainccinv(alpha, p))
    got = estimators.gamma_quantile(mu, alpha, p)
    assert got == want or (np.isnan(got) and np.isnan(want))
    assert estimators.gamma_threshold(mu, mean_log, p) == got or np.isnan(got)
    gp, moments = compressors.create("sidco-gp", 0.01), sidco.Moments(mu, 0.0, mean_log)
    assert gp.first_quantile(moments)(p) == gp.first_threshold(moments, p) or np.isnan(got)


def reference_threshold(name: str, g: torch.Tensor, density: float, stages: int, adapt: str = "paper") -> float:
    """SIDCo's threshold recomputed in float64 with NumPy/SciPy from the same data and stage logic
    (``adapt="count"``: each later stage aims at what is left of k, no in-call correction)."""
    a = np.abs(g.numpy()).astype(np.float64)

    def gpareto(x: np.ndarray, p: float) -> float:
        mu, var = x.mean(), x.var()
        r = mu * mu / var
        xi, sigma = 0.5 * (1 - r), 0.5 * mu * (r + 1)
        return sigma * np.log(1 / p) if abs(xi) < 1e-8 else sigma / xi * (p ** (-xi) - 1)

    def first(x: np.ndarray, p: float) -> float:
        if name == "sidco-e":
            return x.mean() * np.log(1 / p)
        if name == "sidco-p":
            return gpareto(x, p)
        mu = x.mean()
        s = np.log(mu) - np.log(x[x > 0]).mean()
        alpha = (3 - s + np.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
        return mu / alpha * scipy.special.gammainccinv(alpha, p)

    probs = stage_probabilities(density, stages, 0.25)
    k = max(1, round(density * a.size))
    eta = np.float32(first(a, probs[0]))
    for m, p in enumerate(probs[1:], start=1):
        x = a[a > eta] - eta
        if adapt == "count":
            p = min(1.0, k / x.size) ** (1.0 / (len(probs) - m))
        eta = np.float32(eta + (x.mean() * np.log(1 / p) if name == "sidco-e" else gpareto(x, p)))
    return float(eta)


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("kind", ["laplace", "gamma", "student_t"])
def test_thresholds_match_float64_scipy_reference(name, kind):
    rng = np.random.default_rng(RNG_SEED + len(kind))
    n = 400_000
    magnitudes = {
        "laplace": lambda: rng.exponential(size=n),
        "gamma": lambda: rng.gamma(0.5, 1.0, size=n),
        "student_t": lambda: np.abs(rng.standard_t(3, size=n)),
    }[kind]()
    g = signed(magnitudes, rng)
    for density in (0.1, 0.01, 0.001):
        for stages in (1, 2, 3):
            for adapt in ("paper", "count"):
                s = compressors.create(name, density=density, stages=stages, adapt=adapt,
                                       corrections=0).compress(g)
                assert s.stages == len(stage_probabilities(density, stages, 0.25))
                want = reference_threshold(name, g, density, stages, adapt)
                assert s.threshold == pytest.approx(want, rel=1e-4), (density, stages, adapt)
                assert torch.all(s.values.abs() > s.threshold)


def test_tie_rule_is_strictly_greater():
    # A quarter of the elements are 1, the rest 0: mean |g| = 1/4 exactly, and with
    # δ = e^-4 the one-stage exponential threshold is 1/4 · ln(e^4) = 1: every 1 ties with it.
    g = torch.zeros(40_000)
    g[::4] = 1.0
    c = compressors.create("sidco-e", density=float(np.exp(-4.0)), stages=1, corrections=0)
    s = c.compress(g)
    # strict ">" selects nothing above the threshold 1: the count guard sends the exact top-k (733 of the ties)
    assert c.last.estimated == 0 and s.fallback and s.selected == 733 and s.threshold == 1.0
    g[8] = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    s = c.compress(g)
    assert c.last.estimated == 1 and s.fallback and 8 in s.indices.tolist()


def test_dgc_tie_rule_is_greater_or_equal():
    g = torch.ones(100_000)
    g[:50] = 2.0
    s = compressors.create("dgc", density=0.001, seed=1).compress(g)
    assert torch.all(s.values.abs() >= s.threshold)
    assert s.selected == 100  # 50 at 2.0 plus ties at 1.0 cut back to exactly k by hierarchical top-k


def settle(c, draw, calls: int = 20) -> float:
    """Windowed achieved/target ratio after ``calls`` calls (mean of the last five)."""
    ratios = []
    for _ in range(calls):
        g = draw()
        ratios.append(c.compress(g).selected / (c.density * g.numel()))
    return sum(ratios[-5:]) / 5


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
@pytest.mark.parametrize("kind", ["student_t3", "gaussian"])
@pytest.mark.parametrize("density", [0.01, 0.001])
def test_adaptive_stages_settle(name, kind, density):
    gen = torch.Generator().manual_seed(RNG_SEED)

    def draw() -> torch.Tensor:
        if kind == "gaussian":
            return torch.randn(200_000, generator=gen)
        chi2 = torch.distributions.Chi2(3.0).sample((200_000,))
        return torch.randn(200_000, generator=gen) / torch.sqrt(chi2 / 3.0)

    torch.manual_seed(RNG_SEED)
    assert 0.8 <= settle(compressors.create(name, density=density), draw) <= 1.25


def test_adaptive_moves_the_right_way_on_both_tails():
    gen = torch.Generator().manual_seed(1)
    e = compressors.create("sidco-e", density=0.001, adapt="paper")  # the stage controller alone
    settle(e, lambda: torch.randn(200_000, generator=gen))
    assert e.stages >= 3  # Gaussian under-selects with one exponential stage: more stages fix it
    assert 1 <= e.stages <= 10


@pytest.fixture(scope="module")
def training_gradients() -> list[torch.Tensor]:
    """Flat gradients of 20 SGD steps of a small MLP classifying a synthetic dataset."""
    torch.manual_seed(RNG_SEED)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x = torch.randn(2048, 64)
    y = (x[:, :10].argmax(dim=1) + (x[:, 10] > 0).long()) % 10
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grads = []
    for step in range(20):
        batch = slice((step * 128) % 2048, (step * 128) % 2048 + 128)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())
        opt.step()
    return grads


@pytest.mark.parametrize("name", ["sidco-e", "sidco-p", "sidco-gp"])
def test_adaptive_stages_settle_on_real_gradients(name, training_gradients):
    c = compressors.create(name, density=0.01)
    it = iter(training_gradients)
    assert training_gradients[0].numel() > 80_000
    assert 0.8 <= settle(c, lambda: next(it)) <= 1.25
