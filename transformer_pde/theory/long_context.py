r"""A fixed query against n i.i.d. uniform keys on S^{d−1}: the laws of its attention weights
(docs: math/attention.md#long-context-critical-temperature).

With u = 1 − ⟨q, k⟩ the distance of a key to the query, u/2 ~ Beta((d−1)/2, (d−1)/2), so
P(u ≤ t) = A_d t^α (1 + O(t)) with α = (d−1)/2 (:func:`distance_constant`). The weights are
w_i ∝ e^{−βu_i}; Bruno–Rigollet–Chen–Polyanskiy–Lin (arXiv 2605.08505) put the critical β at
n^{2/(d−1)}. Here, written λ = β/(A_d n)^{1/α} (:func:`critical_scale`):

- sub-critically (λ → 0) the entropy follows the law of large numbers, H ≈ log n + log m(β) +
  β m₁(β)/m(β) with m(β) = E e^{−βu}, m₁(β) = E u e^{−βu} (:func:`mean_field_entropy`), and the
  normaliser Z = Σe^{−βu_i} has Gaussian fluctuations of relative variance v(β)/n,
  v = m(2β)/m(β)² − 1 (:func:`partition_variance`);
- at λ fixed, the points A_d n u_i^α tend to a unit-rate Poisson process Γ_1 < Γ_2 < ..., and the
  weights to e^{−λΓ_i^{1/α}}/Σ_j e^{−λΓ_j^{1/α}}: a finite random set of keys keeps the mass
  (:func:`critical_limit`, Monte Carlo of that limit).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from .._checks import check_count, check_int, check_real


def distance_constant(d: int) -> float:
    """A_d with P(1 − ⟨q, k⟩ ≤ t) = A_d t^{(d−1)/2}(1 + O(t)) for k uniform on S^{d−1}:
    A_d = c_d 2^{(d−1)/2}/(d−1), c_d = Γ(d/2)/(√π Γ((d−1)/2)) (A_2 = √2/π, A_3 = 1/2, exact on [0, 2]
    for d = 3)."""
    d = check_int(d, "d", minimum=2)
    c = math.gamma(d / 2) / (math.sqrt(math.pi) * math.gamma((d - 1) / 2))
    return c * 2 ** ((d - 1) / 2) / (d - 1)


def critical_scale(n, d: int):
    """(A_d n)^{2/(d−1)}: 1/(the typical distance of the nearest of n keys), the scale of the
    critical β of arXiv 2605.08505 (β_n* ≍ n^{2/(d−1)}) with its constant."""
    d = check_int(d, "d", minimum=2)
    n = np.asarray(check_real(n, "n", positive=True), dtype=np.float64)
    return (distance_constant(d) * n) ** (2.0 / (d - 1))


def _moments(beta, d):
    """m(β) = E e^{−βu} and m₁(β) = E u e^{−βu} for u = 1 − ⟨q, k⟩: from E e^{βs} =
    Γ(d/2)(2/β)^ν I_ν(β), ν = d/2 − 1, and its derivative Γ(d/2)(2/β)^ν I_{ν+1}(β), scaled by
    e^{−β} (``ive``), so β up to ~1e12 keeps m₁ to 1e-4 relative."""
    nu = d / 2 - 1
    b = np.where(beta > 0, beta, 1.0)
    pre = math.gamma(d / 2) * (2 / b) ** nu
    m = np.where(beta > 0, pre * special.ive(nu, b), 1.0)
    m1 = np.where(beta > 0, pre * (special.ive(nu, b) - special.ive(nu + 1, b)), 1.0)
    return m, m1


def mean_partition(beta, d: int):
    """m(β) = E e^{−β(1 − ⟨q, k⟩)} = e^{−β}Γ(d/2)(2/β)^{d/2−1}I_{d/2−1}(β), k uniform on S^{d−1}:
    the normaliser Σ_i e^{−βu_i} of n keys is n m(β) on average."""
    d = check_int(d, "d", minimum=2)
    beta = np.asarray(check_real(beta, "beta", nonnegative=True), dtype=np.float64)
    return _moments(beta, d)[0]


def mean_field_entropy(n, beta, d: int):
    """The law-of-large-numbers entropy of the weights of n keys, log n + log m(β) + β m₁(β)/m(β)
    (m, m₁ as in the module docstring): the sub-critical limit of the measured entropy."""
    d = check_int(d, "d", minimum=2)
    n = np.asarray(check_real(n, "n", positive=True), dtype=np.float64)
    beta = np.asarray(check_real(beta, "beta", nonnegative=True), dtype=np.float64)
    m, m1 = _moments(beta, d)
    return np.log(n) + np.log(m) + beta * m1 / m


def partition_variance(beta, d: int):
    """v(β) = Var(e^{−βu})/m(β)² = m(2β)/m(β)² − 1: Z/(n m(β)) has variance v(β)/n, and is
    Gaussian in the limit while λ → 0 (the Lyapunov condition fails at λ ≍ 1)."""
    d = check_int(d, "d", minimum=2)
    beta = np.asarray(check_real(beta, "beta", nonnegative=True), dtype=np.float64)
    m2, _ = _moments(2 * beta, d)
    m, _ = _moments(beta, d)
    return m2 / m**2 - 1


def critical_limit(lam, d: int, *, samples: int = 4000, points: int = 1000, seed: int = 0,
                   self_key: bool = False):
    """Monte Carlo of the critical limit at β = λ (A_d n)^{2/(d−1)}, n → ∞: the weights
    e^{−λΓ_i^{1/α}}/Σ_j e^{−λΓ_j^{1/α}} of a unit-rate Poisson process (α = (d−1)/2), the first
    ``points`` points drawn and the rest replaced by their mean (an incomplete-gamma integral).

    ``self_key``: the query is also a key, at distance 0 (a row of self-attention: the other
    n − 1 tokens are i.i.d. uniform around it), one more point at 0.

    Returns ``(entropy, max_weight)``, each of shape ``(samples, len(lam))``: one row per draw of
    the process, so a statistic of the limit law (its mean, the crossing of a level) is taken as
    on the measured draws."""
    d = check_int(d, "d", minimum=2)
    lam = np.atleast_1d(np.asarray(check_real(lam, "lam", positive=True), dtype=np.float64))
    samples = check_count(samples, "samples", minimum=1)
    points = check_count(points, "points", minimum=2)
    seed = check_int(seed, "seed", minimum=0, maximum=None)
    if not isinstance(self_key, bool):
        raise ValueError(f"self_key must be True or False, got {self_key!r}")
    alpha = (d - 1) / 2
    rng = np.random.default_rng(seed)
    gam = np.cumsum(rng.exponential(size=(samples, points)), axis=1)
    t = gam ** (1 / alpha)  # β u_i / λ
    if self_key:
        t = np.concatenate([np.zeros((samples, 1)), t], axis=1)
    ent = np.empty((samples, lam.size))
    wmax = np.empty((samples, lam.size))
    for j, lj in enumerate(lam):
        x = lj * t  # β u_i
        x0 = x[:, :1]
        e = np.exp(-(x - x0))
        # the points beyond the last drawn: ∫_{Γ_K}^∞ e^{−λ t^{1/α}} dt = α λ^{−α} Γ(α, x_K), and the
        # same with the factor x: α λ^{−α} Γ(α + 1, x_K), both times e^{x0} for the shift
        xk = x[:, -1]
        with np.errstate(divide="ignore"):  # a tail below the smallest float is 0
            log_scale = math.log(alpha) - alpha * math.log(lj) + x0[:, 0]
            tail0 = np.exp(log_scale + special.gammaln(alpha) + np.log(special.gammaincc(alpha, xk)))
            tail1 = np.exp(log_scale + special.gammaln(alpha + 1) + np.log(special.gammaincc(alpha + 1, xk)))
        a = e.sum(axis=1) + tail0
        b = ((x - x0) * e).sum(axis=1) + tail1 - x0[:, 0] * tail0
        ent[:, j] = np.log(a) + b / a
        wmax[:, j] = 1 / a
    return ent, wmax


__all__ = ["critical_limit", "critical_scale", "distance_constant", "mean_field_entropy", "mean_partition",
           "partition_variance"]
