"""A fixed query against uniform keys (docs: math/attention.md#long-context-critical-temperature):
the distance law's constant, the mean-field moments against quadrature, the Poisson limit's
two ends."""

import math

import numpy as np
import pytest
from scipy import integrate, special

from transformer_pde.theory import long_context as lc


def _beta_density(d):
    """The density of u = 1 − ⟨q, k⟩ on [0, 2]: u/2 ~ Beta(α, α), α = (d − 1)/2."""
    a = (d - 1) / 2
    return lambda u: (u / 2) ** (a - 1) * (1 - u / 2) ** (a - 1) / (2 * special.beta(a, a))


def test_distance_constant_closed_forms_and_the_beta_law():
    assert lc.distance_constant(2) == pytest.approx(math.sqrt(2) / math.pi, rel=1e-14)  # arccos(1 − t)/π
    assert lc.distance_constant(3) == pytest.approx(0.5, rel=1e-14)  # Archimedes: u uniform on [0, 2]
    for d in (4, 5, 8, 16):
        a = (d - 1) / 2
        t = 1e-9
        assert special.betainc(a, a, t / 2) / (lc.distance_constant(d) * t**a) == pytest.approx(1.0, abs=1e-6)
    assert lc.critical_scale(100, 3) == pytest.approx(50.0)
    assert lc.critical_scale(100, 2) == pytest.approx((math.sqrt(2) / math.pi * 100) ** 2)


@pytest.mark.parametrize("d", [2, 3, 4, 8])
@pytest.mark.parametrize("beta", [0.3, 4.0, 60.0])
def test_moments_against_quadrature(d, beta):
    p = _beta_density(d)
    opts = dict(limit=400, points=[min(1.0, 10 / beta)])
    m = integrate.quad(lambda u: np.exp(-beta * u) * p(u), 0, 2, **opts)[0]
    m1 = integrate.quad(lambda u: u * np.exp(-beta * u) * p(u), 0, 2, **opts)[0]
    m2 = integrate.quad(lambda u: np.exp(-2 * beta * u) * p(u), 0, 2, **opts)[0]
    assert lc.mean_partition(beta, d) == pytest.approx(m, rel=1e-7)
    assert lc.partition_variance(beta, d) == pytest.approx(m2 / m**2 - 1, rel=1e-6)
    n = 1000
    assert lc.mean_field_entropy(n, beta, d) == pytest.approx(np.log(n) + np.log(m) + beta * m1 / m, rel=1e-7)
    assert lc.mean_field_entropy(n, 0.0, d) == pytest.approx(np.log(n))


def test_critical_limit_ends():
    """λ → 0: the Poisson law of large numbers, E H = log Γ(α+1) − α log λ + α; λ → ∞: one key."""
    for d in (2, 3, 8):
        a = (d - 1) / 2
        lam = np.array([1e-4, 1e3])
        ent, wmax = lc.critical_limit(lam, d, samples=300, points=400, seed=1)
        assert ent.shape == wmax.shape == (300, 2)
        assert ent[:, 0].mean() == pytest.approx(special.gammaln(a + 1) - a * np.log(1e-4) + a, abs=0.02)
        assert np.median(wmax[:, 1]) > 0.99
        assert np.all((wmax > 0) & (wmax <= 1)) and np.all(ent >= -1e-12)
    # the tail integral stands in for the points not drawn: 50 points or 2000 give one law at λ = 0.05
    few = lc.critical_limit([0.05], 3, samples=2000, points=50, seed=2)[0].mean()
    many = lc.critical_limit([0.05], 3, samples=2000, points=2000, seed=2)[0].mean()
    assert few == pytest.approx(many, abs=0.02)
