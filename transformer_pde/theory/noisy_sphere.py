r"""Noisy self-attention on S^{d−1} at the uniform law: growth rates, K_#, β_*
(docs: math/noise.md#linear-stability-of-the-uniform-law).

Tokens follow dX = K·P⊥Γ dt + σ dB^S (independent spherical Brownian motions, generator
(σ²/2)Δ), with Γ the USA field ∫e^{β⟨x,y⟩} y dρ (GLPR's 1/n, no e^{−β}) or the SA field (the
same divided by Z = ∫e^{β⟨x,y⟩}dρ); K is the value matrix V = K·I. The mean field is
∂_tρ + div(ρ K Γ_ρ) = (σ²/2)Δρ. With σ = 1 this is the noisy USA of Mun–Rosenzweig (arXiv
2606.05140; circle: 2604.16288).

**Linearization.** Funk–Hecke: ∫e^{β⟨x,y⟩}Y_l(y)dσ_d(y) = c_l(β) Y_l(x) with
c_l(β) = Γ(d/2)(2/β)^{d/2−1} I_{l+d/2−1}(β) (:func:`funk_hecke`). USA: Γ = β^{-1}∇_S(G_βρ), with
G_β(1 + εY_l) = c_0 + εc_l Y_l; SA: Γ = β^{-1}∇_S log G_βρ, which divides by c_0. As
ΔY_l = −l(l+d−2)Y_l,

    λ_l = l(l+d−2)·(K g_l − σ²/2),   g_l = c_l/β (USA),  g_l = c_l/(β c_0) (SA).

σ = 0, K = 1, d = 2: λ_k = k² I_k(β)/β, the noiseless USA instability rate. I_ν(β) decreases in ν,
so l = 1 goes first: the uniform law is linearly stable iff K < K_# = σ²/(2g_1); for USA and σ = 1,
K_# = β^{d/2}/(2^{d/2}Γ(d/2)I_{d/2}(β)), the threshold of 2606.05140.

**Continuous or discontinuous [derived here].** Stationary states solve ρ ∝ exp((2K/σ²)Φ),
Φ = G_βρ/β (USA) or log(G_βρ)/β (SA). Expanding ρ ∝ e^{u t + v P} (t = ⟨x, e⟩, P = t² − 1/d) to
third order in the order parameter m = |∫x dρ| gives the branch through K_#:

    K/K_# − 1 = L m² + O(m⁴)                                     (:meth:`landau`)

USA: L = d/(d+2)·(1 − (d−1)a/(1−a)), a = c_2/c_1, so the branch turns forwards (continuous
transition) iff a < 1/d, i.e. β < β_*, the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d — the criterion of
2606.05140's abstract (β_*^{(2)} = 2.44692 on S¹: I_2/I_1 = 1/2; β_*^{(3)} = 1.81615).
SA: L = d²·D with b_l = c_l/c_0,
D = 2(d−1)/(d(d+2))·((b_2−1)(b_2−b_1²)/(2(b_1−b_2)) + b_2/2) + (1−d b_1²)/(d(d+2)).
L < 0 means a fold at some K_c < K_# and hysteresis.

Checked numerically on S¹ (the rest is derived, not checked): L against stationary states
solved on a grid with scipy (tests/theory/test_noisy_sphere.py; USA and SA, β = 1, 5, to 2 %)
and against the branches of the Newton continuation (tests/stationary/test_circle_branches.py:
the bifurcation sits at K_# to 1e-10, the slope matches L to 1–2 %, USA at β = 4 > β_* folds
at K_c = 0.1935 < K_# = 0.2049); λ_k, k = 1..6, against the spectral PDE solver (SA and USA,
σ = 0 and 0.8, to 1e-3; the `instability` experiment: 1.5e-5) and weighted deterministic
particles (noiseless, 1e-7). For SA, L stays positive for every β in (1e-3, 200) on S¹ and S²:
the SA transition is continuous there (:func:`critical_beta` says so with a ValueError).
"""

from __future__ import annotations

import abc
import math

import equinox as eqx
import numpy as np
from scipy import optimize, special

from .._checks import check_int, check_real, check_scalar


def funk_hecke(l, beta, d: int = 2):
    """c_l(β) = Γ(d/2)(2/β)^{d/2−1} I_{l+d/2−1}(β): the eigenvalue of ρ ↦ ∫e^{β⟨x,y⟩}ρ(y)dσ_d(y)
    on spherical harmonics of degree l (σ_d the uniform probability on S^{d−1}); c_l(0) = δ_{l0}."""
    check_int(d, "d", minimum=2)
    l = np.asarray(check_real(l, "l", nonnegative=True, integer=True), dtype=np.float64)
    beta = np.asarray(check_real(beta, "beta", nonnegative=True), dtype=np.float64)
    nu = l + d / 2 - 1
    b = np.where(beta > 0, beta, 1.0)
    out = math.gamma(d / 2) * (2 / b) ** (d / 2 - 1) * special.iv(nu, b)
    return np.where(beta > 0, out, (l == 0).astype(np.float64))


class AbstractNoisyAttention(eqx.Module):
    """An attention with independent noise σ at the uniform law on S^{d−1}: its linear gains
    g_l (λ_l = l(l+d−2)(K g_l − σ²/2)) and the branch coefficient L (K/K_# − 1 = L m²)."""

    beta: float
    d: int = 2
    sigma: float = 1.0

    def __check_init__(self):
        check_scalar(self.beta, "beta", positive=True)
        check_int(self.d, "d", minimum=2)
        check_scalar(self.sigma, "sigma", nonnegative=True)

    @abc.abstractmethod
    def gain(self, l):
        """g_l: the field of ρ = 1 + εY_l is εK g_l ∇Y_l + O(ε²)."""

    @abc.abstractmethod
    def landau(self):
        """L with K/K_# − 1 = L m² + O(m⁴) on the branch of stationary states through K_#
        (m = |∫x dρ|): L > 0 continuous transition, L < 0 discontinuous (a fold below K_#)."""

    def growth_rate(self, l, K=1.0):
        """λ_l = l(l+d−2)(K g_l − σ²/2): ρ = 1 + εY_l grows like e^{λ_l t} (Y_l of degree l >= 1)."""
        l = np.asarray(l, dtype=np.float64)
        return l * (l + self.d - 2) * (K * self.gain(l) - self.sigma**2 / 2)

    def critical_coupling(self):
        """K_# = σ²/(2 g_1): the uniform law is linearly stable iff K < K_# (inf when σ = 0 is
        replaced by 0: noiseless, every mode grows for K > 0)."""
        return self.sigma**2 / (2 * self.gain(1))

    def most_unstable_mode(self, K=1.0, l_max: int = 10_000):
        """argmax_l λ_l over 1..l_max (noiseless USA on S¹: ≈ √(2β),
        docs: math/noise.md#linear-stability-of-the-uniform-law)."""
        ls = np.arange(1, l_max + 1)
        return int(ls[np.argmax(self.growth_rate(ls, K))])


class NoisyUSA(AbstractNoisyAttention):
    """USA (1/n average, no e^{−β}; the K-scaled noisy USA, docs: math/noise.md#nonlinear-fokker-planck-equation):
    g_l = c_l/β."""

    def gain(self, l):
        return funk_hecke(l, self.beta, self.d) / self.beta

    def landau(self):
        d = self.d
        a = float(funk_hecke(2, self.beta, d) / funk_hecke(1, self.beta, d))
        return d / (d + 2) * (1 - (d - 1) * a / (1 - a))


class NoisySA(AbstractNoisyAttention):
    """SA (softmax, field divided by Z): g_l = c_l/(β c_0)."""

    def gain(self, l):
        return funk_hecke(l, self.beta, self.d) / (self.beta * funk_hecke(0, self.beta, self.d))

    def landau(self):
        d = self.d
        c0, c1, c2 = (float(funk_hecke(l, self.beta, d)) for l in (0, 1, 2))
        b1, b2 = c1 / c0, c2 / c0
        D = (2 * (d - 1) / (d * (d + 2)) * ((b2 - 1) * (b2 - b1**2) / (2 * (b1 - b2)) + b2 / 2)
             + (1 - d * b1**2) / (d * (d + 2)))
        return d**2 * D


def critical_coupling(beta, d: int = 2, sigma: float = 1.0):
    """K_#^{(d)}(β) of the noisy USA: σ²β^{d/2}/(2^{d/2}Γ(d/2)I_{d/2}(β)) (σ = 1: 2606.05140)."""
    check_int(d, "d", minimum=2)
    beta = np.asarray(check_real(beta, "beta", positive=True), dtype=np.float64)
    check_scalar(sigma, "sigma", nonnegative=True)
    return sigma**2 * beta ** (d / 2) / (2 ** (d / 2) * math.gamma(d / 2) * special.iv(d / 2, beta))


def critical_beta(model: type[AbstractNoisyAttention] = NoisyUSA, d: int = 2) -> float:
    """β_*^{(d)}: the β where :meth:`~AbstractNoisyAttention.landau` changes sign (σ does not
    enter). USA: the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d. ValueError if no sign change in
    (1e-3, 200)."""
    check_int(d, "d", minimum=2)
    f = lambda b: model(beta=float(b), d=d).landau()  # noqa: E731
    grid = np.geomspace(1e-3, 200.0, 200)
    vals = np.array([f(b) for b in grid])
    change = np.nonzero(np.sign(vals[:-1]) != np.sign(vals[1:]))[0]
    if change.size == 0:
        raise ValueError(f"{model.__name__} on S^{d - 1}: the branch coefficient keeps its sign on "
                         "beta in (1e-3, 200); no critical beta there")
    i = int(change[0])
    return float(optimize.brentq(f, grid[i], grid[i + 1], xtol=1e-14, rtol=1e-14))


__all__ = ["AbstractNoisyAttention", "NoisySA", "NoisyUSA", "critical_beta", "critical_coupling",
           "funk_hecke"]
