r"""Energies, attention matrices and moments of a token configuration
(docs: math/sphere.md#energy-and-gradient-structure).

Pure functions of the state, usable inside ``tp.solve(..., stats=lambda t, x: ...)`` and
under ``jit``/``vmap``. Tokens are rows ``x`` of shape ``(n, d)``; ``weights`` (default
uniform 1/n) give the measure μ = Σ_j w_j δ_{x_j}.

Normalizations differ across papers (docs: math/sphere.md#normalizations-across-papers); the ones used here:

* :func:`interaction_energy` — GLPR's E_β[μ] = (1/2β) ∬ e^{β⟨x, D y⟩} dμ dμ
  (docs: math/sphere.md#energy-and-gradient-structure; D = I by default; Burger et al.'s energy for a symmetric D,
  docs: math/sphere.md#gradient-flows-of-the-interaction-energy).
* :func:`normalized_energy` — φ = 2β e^{-β} E_β = ∬ e^{β(⟨x,y⟩−1)} dμ dμ ∈ (0, 1] on the
  sphere: the quantity of GKPR's staircase after their erratum (docs: math/sphere.md#metastability), finite for
  every β, equal to 1 exactly at a Dirac mass, and to Σ_k (m_k)^2 for well-separated
  point clusters of masses m_k.
* :func:`perceptron_energy`, :func:`stationarity_residual` — the perceptron block's energy
  E_{β,ϑ} and the residual of its critical points, for an atomic measure
  (docs: math/sphere.md#perceptron-block-and-interpolation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._checks import (as_float_array, check_finite, check_in_range, check_points, check_scalar, check_weights,
                       check_weights_of, is_concrete, runtime_check)
from .._types import PointsLike, WeightsLike
from ..models.perceptron import AbstractPotentialActivation, PerceptronBlock
from ..models.sphere import unchecked_tangent_projection


def _weights(x, weights):
    # one check for every diagnostic: shape (n,), finite, non-negative, summing to one
    return check_weights(weights, x.shape[0], x.dtype)


def _log_weights(w):
    return jnp.where(w > 0, jnp.log(jnp.where(w > 0, w, 1.0)), -jnp.inf)


def _check_beta(beta, positive=False):
    return check_scalar(beta, "beta", positive=positive, nonnegative=not positive)


def _gram(x, D):
    return x @ x.T if D is None else x @ jnp.asarray(D, x.dtype) @ x.T


def log_interaction_energy(x: PointsLike, beta, weights: WeightsLike | None = None, D=None) -> jax.Array:
    """log E_β, computed by log-sum-exp (finite even where E_β overflows, e.g. β > 700)."""
    x = check_points(x, "x")
    beta = _check_beta(beta, positive=True)
    lw = _log_weights(_weights(x, weights))
    logits = beta * _gram(x, D) + lw[:, None] + lw[None, :]
    return jax.nn.logsumexp(logits) - jnp.log(2 * beta)


def interaction_energy(x: PointsLike, beta, weights: WeightsLike | None = None, D=None) -> jax.Array:
    r"""E_β = (1/2β) Σ_{i,j} w_i w_j e^{β⟨x_i, D x_j⟩} (docs: math/sphere.md#energy-and-gradient-structure; D = I
    unless given).

    Non-decreasing along SA and USA (and along Burger's ascent flow with Qᵀ K = V = D): its
    time derivative is the dissipation identity (docs: math/sphere.md#energy-and-gradient-structure).
    Requires β > 0.
    """
    return jnp.exp(log_interaction_energy(x, beta, weights, D))


def normalized_energy(x: PointsLike, beta, weights: WeightsLike | None = None) -> jax.Array:
    r"""φ = Σ_{i,j} w_i w_j e^{β(⟨x_i,x_j⟩−1)} = 2β e^{-β} E_β, in (0, 1] for unit tokens.

    GKPR's staircase quantity with their erratum's normalization (docs: math/sphere.md#metastability): the printed
    (2β e^β n²)^{-1} Σ e^{β⟨x_i,x_j⟩} tends to 0 with β; this one plateaus at Σ_k (m_k)^2
    while the tokens sit in well-separated clusters of masses m_k. Defined for every real β: for
    β < 0 (repulsive attention, docs: math/attention.md#negative-temperature) it lies in
    [1, e^{2|β|}] for unit tokens, 1 exactly at a single cluster.
    """
    x = check_points(x, "x")
    beta = check_scalar(beta, "beta")
    w = _weights(x, weights)
    k = jnp.exp(beta * (x @ x.T - 1.0))
    phi = w @ k @ w
    # β < 0: φ <= e^{2|β|} overflows for |β| beyond the dtype's range (~354 in float64)
    why = "e^{β(⟨x_i, x_j⟩ − 1)} exceeds the dtype's range (β < 0 with |β| too large for it)"
    if is_concrete(phi):
        if not bool(jnp.isfinite(phi)):
            raise ValueError(f"normalized_energy overflowed at beta={float(beta):g}: {why}")
        return phi
    return runtime_check(phi, ~jnp.isfinite(phi), f"normalized_energy overflowed: {why}")


def attention_matrix(x: PointsLike, beta=1.0, *, Q=None, K=None, weights: WeightsLike | None = None,
                     causal: bool = False) -> jax.Array:
    r"""P_ij = w_j e^{β⟨Q x_i, K x_j⟩} / Σ_k w_k e^{β⟨Q x_i, K x_k⟩}, shape ``(n, n)``.

    Rows are probability vectors (query i, key j; docs: math/attention.md#conventions); Q, K default to
    the identity. With ``causal=True`` only keys j <= i count (docs: math/causal.md#causal-attention).
    """
    x = check_points(x, "x")
    beta = check_scalar(beta, "beta")
    q = x if Q is None else x @ jnp.asarray(Q, x.dtype).T
    k = x if K is None else x @ jnp.asarray(K, x.dtype).T
    logits = beta * (q @ k.T) + _log_weights(_weights(x, weights))[None, :]
    if causal:
        n = x.shape[0]
        logits = jnp.where(jnp.tril(jnp.ones((n, n), bool)), logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


def numerical_rank(P, rtol=1e-3) -> jax.Array:
    """Number of singular values above ``rtol`` times the largest (0 for the zero matrix).

    The attention matrix of the unnormalized R^d model falls to rank <= 3 as it converges to
    a Boolean matrix (docs: math/attention.md#the-rescaled-model-and-the-spectrum-of-v);
    ``rtol`` sets what counts as numerically zero.
    """
    rtol = check_in_range(rtol, "rtol", low=0.0, high=1.0, high_open=True,
                          meaning="relative to the largest singular value")
    P = as_float_array(P, "P")
    if P.ndim != 2:
        raise ValueError(f"P must be a matrix (2-D), got shape {P.shape}")
    s = jnp.linalg.svd(check_finite(P, "P"), compute_uv=False)
    return jnp.sum(s > rtol * s[0]) * (s[0] > 0)


def mean_token(x: PointsLike, weights: WeightsLike | None = None) -> jax.Array:
    """The barycenter Σ_i w_i x_i (its norm is 1 exactly at a Dirac on the sphere; the
    β = 0 dynamics is ẋ_i = P⊥_{x_i} of it, docs: math/sphere.md#the-projected-flow)."""
    x = check_points(x, "x")
    return _weights(x, weights) @ x


def perceptron_energy(block: PerceptronBlock, x, weights=None):
    r"""Energy of a :class:`~transformer_pde.models.PerceptronBlock`
    (docs: math/sphere.md#perceptron-block-and-interpolation): E_{β,ϑ}(μ) = (1/2β) Σ_{ij} w_i w_j e^{β⟨x_i,x_j⟩} + ½
    Σ_i w_i v_ϑ(x_i), v_ϑ = Σ_j ω_j φ(a_j·x) with the activation's potential φ (ReLU: φ = s_+²); a ValueError for an
    activation without one."""
    if not isinstance(block.activation, AbstractPotentialActivation):
        raise ValueError(f"no closed-form energy for activation {block.activation!r} (its potential φ, "
                         "φ' = 2σ, has none)")
    x = check_points(x, "x")
    w = jnp.full((x.shape[0],), 1.0 / x.shape[0], x.dtype) if weights is None else \
        check_weights_of(weights, x.dtype, x.shape[0])
    inter = w @ jnp.exp(block.beta * (x @ x.T)) @ w / (2 * block.beta)
    v = block.activation.potential(x @ block.a.T) @ block.omega
    return inter + 0.5 * jnp.sum(w * v)


def stationarity_residual(block: PerceptronBlock, positions, masses):
    r"""max_k |P⊥_{z_k}(Σ_l m_l e^{β⟨z_k,z_l⟩} z_l + Σ_j ω_j σ(a_j·z_k) a_j)| for μ = Σ_k m_k δ_{z_k}.

    Zero exactly when the atomic measure is a critical point of E_{β,ϑ}
    (docs: math/sphere.md#perceptron-block-and-interpolation). ``positions``: the atoms z_k,
    shape ``(K, d)``; ``masses``: m_k, shape ``(K,)``, non-negative, summing to one.
    """
    z = check_points(positions, "positions", block.a.shape[1])
    m = check_weights_of(masses, z.dtype, z.shape[0], "masses").astype(z.dtype)
    v = unchecked_tangent_projection(z, block.raw_field(z, m))
    return float(jnp.max(jnp.linalg.norm(v, axis=-1)))


__all__ = ["attention_matrix", "interaction_energy", "log_interaction_energy", "mean_token",
           "normalized_energy", "numerical_rank", "perceptron_energy", "stationarity_residual"]
