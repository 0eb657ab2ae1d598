"""Noisy attention at the uniform law (sphere.md §12): Funk–Hecke, K_#, β_*, the branch slope."""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, special

from transformer_pde.theory import noisy_sphere as ns


@pytest.mark.parametrize("d", [2, 3, 4])
@pytest.mark.parametrize("l", [0, 1, 3])
def test_funk_hecke_against_quadrature(d, l):
    # ∫ e^{βt} P_l(t) dσ_d over the zonal variable t, density ∝ (1 - t²)^{(d-3)/2},
    # P_l the Gegenbauer polynomial normalized to P_l(1) = 1
    beta = 1.7
    lam = d / 2 - 1
    if d == 2:
        P = lambda t: np.cos(l * np.arccos(t))  # noqa: E731
    else:
        P = lambda t: special.eval_gegenbauer(l, lam, t) / special.eval_gegenbauer(l, lam, 1.0)  # noqa: E731
    w = lambda t: (1 - t * t) ** ((d - 3) / 2)  # noqa: E731
    num = integrate.quad(lambda t: np.exp(beta * t) * P(t) * w(t), -1, 1, limit=200)[0]
    den = integrate.quad(w, -1, 1, limit=200)[0]
    assert ns.funk_hecke(l, beta, d) == pytest.approx(num / den, rel=1e-9)


def test_rates_and_thresholds():
    # noiseless USA on S¹: k² I_k(β)/β (sphere.md §8); K_# of 2606.05140; SA divides by I_0
    beta = 3.0
    usa = ns.NoisyUSA(beta=beta, sigma=0.0)
    k = np.arange(1, 7)
    np.testing.assert_allclose(usa.growth_rate(k), k**2 * special.iv(k, beta) / beta, rtol=1e-13)
    for d in (2, 3, 5):
        K = ns.NoisyUSA(beta=beta, d=d).critical_coupling()
        assert K == pytest.approx(beta ** (d / 2) / (2 ** (d / 2) * math.gamma(d / 2) * special.iv(d / 2, beta)))
        assert ns.NoisyUSA(beta=beta, d=d).growth_rate(1, K) == pytest.approx(0, abs=1e-12)
        assert ns.critical_coupling(beta, d) == pytest.approx(K)
    sa = ns.NoisySA(beta=beta, sigma=0.5)
    assert sa.critical_coupling() == pytest.approx(0.25 * beta * special.iv(0, beta) / (2 * special.iv(1, beta)))
    # l = 1 loses stability first: at K_# every other mode decays
    assert np.all(sa.growth_rate(np.arange(2, 10), sa.critical_coupling()) < 0)
    assert ns.NoisyUSA(beta=50.0, sigma=0.0).most_unstable_mode() == pytest.approx(np.sqrt(100), abs=1)


def test_critical_beta_is_the_bessel_root():
    for d in (2, 3):
        ref = optimize.brentq(lambda b: special.iv(d / 2 + 1, b) / special.iv(d / 2, b) - 1 / d, 0.1, 50)
        assert ns.critical_beta(ns.NoisyUSA, d) == pytest.approx(ref, rel=1e-10)
    assert ns.critical_beta(ns.NoisyUSA, 2) == pytest.approx(2.44692, abs=1e-5)
    with pytest.raises(ValueError, match="no critical beta"):
        ns.critical_beta(ns.NoisySA, 2)


def _stationary_order(beta, K, normalized, r0=0.2, n=128):
    """A stationary density of the noisy (σ = 1) USA/SA on S¹ solved on a grid with scipy:
    ρ ∝ exp(2K Φ), Φ = G/β or log(G)/β, G = e^{β cos} * ρ (an independent reference)."""
    th = 2 * np.pi * np.arange(n) / n
    kh = np.fft.fft(np.exp(beta * np.cos(th))) / n

    def F(rho):
        g = np.real(np.fft.ifft(np.fft.fft(rho) * kh))
        phi = np.log(g) / beta if normalized else g / beta
        r = np.exp(2 * K * (phi - phi.max()))
        return r / r.mean() - rho

    rho = optimize.fsolve(F, 1 + 2 * r0 * np.cos(th), xtol=1e-13)
    return abs(np.mean(rho * np.exp(1j * th)))


@pytest.mark.parametrize("model", [ns.NoisyUSA, ns.NoisySA])
@pytest.mark.parametrize("beta", [1.0, 5.0])
def test_branch_slope(model, beta):
    # K/K_# - 1 = L m² + O(m⁴): two amplitudes, Richardson-extrapolated in m²
    th = model(beta=beta)
    Ks, L = th.critical_coupling(), th.landau()
    pts = []
    for eps in (2e-3, 8e-3):
        K = Ks * (1 + eps * np.sign(L))
        m = _stationary_order(beta, K, model is ns.NoisySA, r0=np.sqrt(eps / abs(L)))
        assert m > 0.5 * np.sqrt(eps / abs(L))  # not the uniform law
        pts.append((m**2, (K / Ks - 1) / m**2))
    (x1, y1), (x2, y2) = pts
    assert y1 - x1 * (y2 - y1) / (x2 - x1) == pytest.approx(L, rel=0.02)


def test_bad_input():
    with pytest.raises(ValueError, match="sigma"):
        ns.NoisyUSA(beta=1.0, sigma=-1.0)
    with pytest.raises(ValueError, match="beta"):
        ns.NoisySA(beta=float("nan"))
