r"""Equiangular starts and their reduced ODE for the common inner product (docs: math/sphere.md#equiangular-starts).

If the Gram matrix of the start is equiangular, ⟨x_i, x_j⟩ = ρ0 for all i ≠ j, symmetry keeps
it equiangular and ρ(t) solves (GLPR `thm: orthogonal`)

$$\text{SA: }\dot\rho=\frac{2e^{\beta\rho}(1-\rho)((n-1)\rho+1)}{e^\beta+(n-1)e^{\beta\rho}},\qquad
\text{USA: }\dot\rho=\tfrac2n e^{\beta\rho}(1-\rho)((n-1)\rho+1).$$

Scalar multi-head attention (head h: score matrix a_h I, value-output map w_h I; docs:
math/sphere.md#equiangular-multi-head-attention) keeps it too, with one SA term per head:

$$\dot\rho=2(1-\rho)((n-1)\rho+1)\sum_h\frac{w_h}{e^{\beta a_h(1-\rho)}+n-1}.$$
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_count, check_in_range, check_real, check_scalar, is_concrete
from ..solvers import AbstractODE, solve


def equiangular_start(key, n: int, d: int, rho0: float, dtype=None):
    """n unit vectors in R^d with ⟨x_i, x_j⟩ = rho0 (i ≠ j), randomly rotated.

    Rows of the symmetric square root of G = (1 − ρ0) I + ρ0 11ᵀ (positive semi-definite
    iff ρ0 >= −1/(n−1)), padded to d columns and rotated by a random orthogonal matrix.
    """
    n = check_count(n, "n", minimum=1)
    d = check_count(d, "d", minimum=n)
    check_in_range(rho0, "rho0", low=-1 / (n - 1) if n > 1 else -1.0, high=1.0,
                   meaning="a common inner product of n unit vectors")
    dtype = dtype or jnp.result_type(float)
    G = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    lam, U = np.linalg.eigh(G)
    X = (U * np.sqrt(np.clip(lam, 0, None))) @ U.T
    X = np.concatenate([X, np.zeros((n, d - n))], axis=1)
    R, _ = np.linalg.qr(np.asarray(jax.random.normal(key, (d, d)), dtype=np.float64))
    X = X @ R
    return jnp.asarray(X / np.linalg.norm(X, axis=1, keepdims=True), dtype)


class AbstractReducedODE(AbstractODE):
    r"""The gap u = 1 − ρ of an equiangular start, u' = −ρ'(1 − u) (relative accuracy in the gap,
    however small it gets); subclasses give ρ' (GLPR `thm: orthogonal`, docs: math/sphere.md#equiangular-starts)."""

    n: eqx.AbstractVar[int]
    beta: eqx.AbstractVar[jax.Array]

    def __check_init__(self):
        check_count(self.n, "n", minimum=1)
        if is_concrete(self.beta):  # a traced β is the caller's (checked where it was made)
            check_scalar(self.beta, "beta")

    @abc.abstractmethod
    def rho_rate(self, rho):
        """dρ/dt at the common inner product ρ."""

    def rhs(self, t, u):
        return -self.rho_rate(1 - u)


class SAReducedODE(AbstractReducedODE):
    r"""SA: $\dot\rho = 2e^{\beta\rho}(1-\rho)((n-1)\rho+1)/(e^\beta+(n-1)e^{\beta\rho})$."""

    n: int = eqx.field(static=True)
    beta: jax.Array

    def rho_rate(self, rho):
        b, n = self.beta, self.n
        return 2 * jnp.exp(b * rho) * (1 - rho) * ((n - 1) * rho + 1) / (jnp.exp(b) + (n - 1) * jnp.exp(b * rho))


class USAReducedODE(AbstractReducedODE):
    r"""USA: $\dot\rho = \tfrac2n e^{\beta\rho}(1-\rho)((n-1)\rho+1)$."""

    n: int = eqx.field(static=True)
    beta: jax.Array

    def rho_rate(self, rho):
        return 2 / self.n * jnp.exp(self.beta * rho) * (1 - rho) * ((self.n - 1) * rho + 1)


def _head_vector(x, name: str):
    """A 1-D array of per-head reals (at least one head), checked finite."""
    a = as_float_array(x, name)
    if a.ndim != 1 or a.shape[0] < 1:
        raise ValueError(f"{name} must be a 1-D array with one number per head, got shape {a.shape}")
    return check_real(a, name)


class MultiHeadReducedODE(AbstractReducedODE):
    r"""Scalar multi-head SA (docs: math/sphere.md#equiangular-multi-head-attention): head h scores
    with β a_h⟨x, y⟩ and writes w_h times its softmax average (``tp.MultiHeadAttention.scalar``),

    $$\dot\rho=2(1-\rho)((n-1)\rho+1)\sum_h\frac{w_h}{e^{\beta a_h(1-\rho)}+n-1}.$$

    One head with a = w = 1 is :class:`SAReducedODE`.

    Args:
        n: the number of tokens.
        beta: the inverse temperature, shared by the heads.
        scores: the heads' score scales a_h, shape ``(H,)``.
        values: the heads' value scales w_h, shape ``(H,)`` (w_h < 0: a repulsive head).
    """

    n: int = eqx.field(static=True)
    beta: jax.Array
    scores: jax.Array
    values: jax.Array

    def __init__(self, n: int, beta, scores, values):
        self.n, self.beta = n, jnp.asarray(check_scalar(beta, "beta"), dtype=jnp.result_type(float))
        self.scores = _head_vector(scores, "scores")
        self.values = _head_vector(values, "values")
        if is_concrete(self.scores) and is_concrete(self.values) and self.scores.shape != self.values.shape:
            raise ValueError(f"scores and values must have one entry per head each, got shapes "
                             f"{self.scores.shape} and {self.values.shape}")

    def head_rates(self, rho):
        """Each head's w_h/(e^{βa_h(1−ρ)} + n − 1), shape ``(H,)`` (1/(e^x + n − 1) as
        e^{−logaddexp(x, log(n−1))}: no overflow at large β)."""
        x = self.beta * self.scores * (1 - rho)
        return self.values * jnp.exp(-jnp.logaddexp(x, jnp.log(self.n - 1.0)))

    def rho_rate(self, rho):
        return 2 * (1 - rho) * ((self.n - 1) * rho + 1) * jnp.sum(self.head_rates(rho))


class MultiHeadUSAReducedODE(AbstractReducedODE):
    r"""Scalar multi-head USA, the gradient flow of arXiv 2605.04279's energy
    Σ_h (2βn²)⁻¹ Σ_ij e^{β m_h⟨x_i, x_j⟩} (score and value matrices M_h = m_h I; docs:
    math/sphere.md#equiangular-multi-head-attention):

    $$\dot\rho=\tfrac2n(1-\rho)((n-1)\rho+1)\sum_h m_he^{\beta m_h\rho}.$$

    One head with m = 1 is :class:`USAReducedODE`.

    Args:
        n: the number of tokens.
        beta: the inverse temperature.
        scores: the heads' m_h, shape ``(H,)`` (m_h < 0: a repulsive head).
    """

    n: int = eqx.field(static=True)
    beta: jax.Array
    scores: jax.Array

    def __init__(self, n: int, beta, scores):
        self.n, self.beta = n, jnp.asarray(check_scalar(beta, "beta"), dtype=jnp.result_type(float))
        self.scores = _head_vector(scores, "scores")

    def rho_rate(self, rho):
        m = self.scores
        return 2 / self.n * (1 - rho) * ((self.n - 1) * rho + 1) * jnp.sum(m * jnp.exp(self.beta * m * rho))


def usa_critical_beta(score, repulsion, rho0):
    r"""The critical β of an equiangular start ρ0 > 0 under two USA heads m₁ = ``score`` > 0 and
    m₂ = −``repulsion`` < 0 (:class:`MultiHeadUSAReducedODE`; docs:
    math/sphere.md#equiangular-multi-head-attention):

    $$\beta_c=\frac{\ln(m/m_1)}{(m_1+m)\rho_0},\qquad m=|m_2|>m_1.$$

    Σ_h m_he^{βm_hρ} is increasing in ρ and vanishes at ρ* = ln(m/m₁)/(β(m₁ + m)): the start
    clusters (ρ → 1) iff ρ0 > ρ*, that is iff β > β_c, the reverse of the normalized case. Needs
    m > m₁ (else every β > 0 clusters).
    """
    score = check_scalar(score, "score", positive=True)
    repulsion = check_scalar(repulsion, "repulsion", positive=True)
    check_in_range(rho0, "rho0", low=0.0, high=1.0, low_open=True, high_open=True,
                   meaning="a positive common inner product, below 1")
    if not float(repulsion) > float(score):
        raise ValueError(f"repulsion must exceed score (|m2| > m1), else every β > 0 clusters; got score={score}, "
                         f"repulsion={repulsion}")
    return float(np.log(float(repulsion) / float(score)) / ((float(score) + float(repulsion)) * float(rho0)))


def multihead_critical_beta(n: int, score, value, repulsion, rho0=0.0):
    r"""The critical β of an equiangular start under a selective head (score a > 0, value w > 0)
    and a uniform repulsive head (score 0, value −c, c > 0) (docs:
    math/sphere.md#equiangular-multi-head-attention):

    $$\beta_c=\frac{\ln\big(1+n(w/c-1)\big)}{a(1-\rho_0)}.$$

    Below β_c the common inner product ρ grows to 1 (one cluster); above it the selective head
    attends mostly to the token itself, the repulsive head wins and ρ falls to the simplex
    −1/(n − 1). Needs w > c: otherwise Σ_h w_h <= 0 and no β clusters.
    """
    n = check_count(n, "n", minimum=2)
    score = check_scalar(score, "score", positive=True)
    value = check_scalar(value, "value", positive=True)
    repulsion = check_scalar(repulsion, "repulsion", positive=True)
    check_in_range(rho0, "rho0", low=-1 / (n - 1), high=1.0, high_open=True,
                   meaning="a common inner product of n unit vectors, below 1")
    if not float(value) > float(repulsion):
        raise ValueError(f"value must exceed repulsion (w > c), else Σ_h w_h = w − c <= 0 and no β "
                         f"clusters; got value={value}, repulsion={repulsion}")
    return float(np.log1p(n * (float(value) / float(repulsion) - 1)) / (float(score) * (1 - float(rho0))))


def hitting_time(ode: AbstractReducedODE, rho0, rho1, num_nodes: int = 64):
    r"""The time T = ∫_{ρ0}^{ρ1} dρ/ρ̇ for ρ to go from ``rho0`` to ``rho1`` under ``ode``
    (Gauss–Legendre in ρ, ``num_nodes`` nodes; inf where ρ̇ <= 0 on the way): 1/T is the
    clustering rate of docs: math/sphere.md#equiangular-multi-head-attention, super-additive over
    heads."""
    if not isinstance(ode, AbstractReducedODE):
        raise ValueError(f"ode must be a reduced ODE such as MultiHeadReducedODE(...), got {type(ode).__name__}")
    num_nodes = check_count(num_nodes, "num_nodes", minimum=2, maximum=4096)
    check_in_range(rho0, "rho0", low=-1 / (ode.n - 1) if ode.n > 1 else -1.0, high=1.0, high_open=True,
                   meaning="a common inner product of n unit vectors, below 1")
    check_in_range(rho1, "rho1", low=float(rho0), high=1.0, low_open=True, high_open=True,
                   meaning="the target inner product, between rho0 and 1")
    t, w = np.polynomial.legendre.leggauss(num_nodes)
    half = (float(rho1) - float(rho0)) / 2
    rho = jnp.asarray(float(rho0) + half * (t + 1))
    rate = jax.vmap(ode.rho_rate)(rho)
    return float(jnp.where(jnp.all(rate > 0), half * jnp.sum(jnp.asarray(w) / rate), jnp.inf))


@eqx.filter_jit
def reduced_gap(ode: AbstractReducedODE, rho0, ts, controller):
    """The gap 1 − ρ(t) of ``ode`` at the times ``ts`` (adaptive steps by ``controller``)."""
    if not isinstance(ode, AbstractReducedODE):
        raise ValueError(f"ode must be a reduced ODE such as SAReducedODE(n, beta), got {type(ode).__name__}")
    rho0 = check_in_range(rho0, "rho0", low=-1 / (ode.n - 1) if ode.n > 1 else -1.0, high=1.0,
                          meaning="a common inner product of n unit vectors")
    if jnp.ndim(ts) != 1 or jnp.shape(ts)[0] < 2:
        raise ValueError(f"ts must be a vector of at least 2 times, got shape {jnp.shape(ts)}")
    ts = check_real(ts, "ts")
    if is_concrete(ts) and not np.all(np.diff(np.asarray(ts)) > 0):
        raise ValueError(f"ts must be strictly increasing, got {np.asarray(ts)!r}"[:300])
    return solve(ode, 1 - rho0, t0=ts[0], t1=ts[-1], dt0=1e-3, saveat=ts, stepsize_controller=controller,
                 max_steps=1_000_000).xs


__all__ = ["AbstractReducedODE", "MultiHeadReducedODE", "MultiHeadUSAReducedODE", "SAReducedODE", "USAReducedODE",
           "equiangular_start", "hitting_time", "multihead_critical_beta", "reduced_gap", "usa_critical_beta"]
