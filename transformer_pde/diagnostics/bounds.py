r"""The a-priori bounds (support radius, stability; docs: math/attention.md#support-and-stability-bounds): functions
of the model and the time, not of a state, which the measured radius and Wasserstein ratios are checked against.

* :func:`value_norm_integral`, :func:`support_radius_bound`: ∫‖V‖ and R(t) ≤ R₀ exp(∫‖V‖)
  (docs: math/attention.md#support-and-stability-bounds).
* :func:`lipschitz_rate`, :func:`stability_bound`: the Lipschitz rate L and the Dobrushin bound
  W_p(μ_t, ν_t) ≤ exp(∫L) W_p(μ_0, ν_0) (docs: math/attention.md#support-and-stability-bounds).

The measured counterparts (:func:`~.distances.support_radius`, :func:`~.distances.stability_ratio`)
are in :mod:`.distances`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._checks import check_finite, check_int, check_scalar
from ..models.attention.base import AbstractNormalizedAttention
from ..models.attention.softmax import MultiHeadAttention, SoftmaxAttention
from ..params import PiecewiseConstant


def _cumulative_integral(f, ts, t0, substeps):
    """∫_{t0}^{t} f for t in ts by the midpoint rule on ``substeps`` cells per save interval.

    Exact for constant f; for piecewise-constant parameters the error is confined to the
    cells that contain a jump.
    """
    ts = jnp.asarray(ts)
    edges = jnp.concatenate([jnp.asarray([t0], ts.dtype), ts])
    frac = (jnp.arange(substeps, dtype=ts.dtype) + 0.5) / substeps
    mids = edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * frac[None, :]
    vals = jax.vmap(jax.vmap(f))(mids)
    return jnp.cumsum(jnp.mean(vals, axis=1) * (edges[1:] - edges[:-1]))


def _check_times(ts):
    """Save times: a finite 1-D array (ValueError naming ts; ``eqx.error_if`` under jit)."""
    ts = jnp.asarray(ts, dtype=jnp.result_type(float))
    if ts.ndim != 1:
        raise ValueError(f"ts must be a 1-D array of times, got shape {ts.shape}")
    return check_finite(ts, "ts")


def _check_normalized(attn, what: str):
    if not isinstance(attn, AbstractNormalizedAttention):
        raise ValueError(f"{what} holds for normalized attention (softmax, ℓ², Sinkhorn, multi-head: "
                         f"the field averages V y; docs/math/attention.md#support-and-stability-bounds), "
                         f"got {type(attn).__name__}")


def value_norm_integral(attn, ts, t0=0.0, substeps: int = 64) -> jax.Array:
    """∫_{t0}^{t} ‖V(τ)‖ dτ at each t of ``ts`` (Σ_h‖W_hV_h‖ for multi-head;
    docs: math/attention.md#support-and-stability-bounds), for a normalized attention
        (:meth:`AbstractNormalizedAttention.value_norm`)."""
    _check_normalized(attn, "the support bound R(t) <= R0 exp(∫‖V‖)")
    substeps = check_int(substeps, "substeps", minimum=1)
    ts = _check_times(ts)
    values = (attn.V, attn.W) if isinstance(attn, MultiHeadAttention) else (attn.V,)
    if not any(callable(v) for v in values):
        return (ts - t0) * attn.value_norm(t0)
    if isinstance(attn.V, PiecewiseConstant) and not isinstance(attn, MultiHeadAttention):
        substeps = max(substeps, 256)
    return _cumulative_integral(attn.value_norm, ts, t0, substeps)


def support_radius_bound(attn, R0, ts, t0=0.0) -> jax.Array:
    r"""R(t) ≤ R₀ exp(∫_{t0}^t ‖V(τ)‖ dτ) (docs: math/attention.md#support-and-stability-bounds),
    for softmax, ℓ², Sinkhorn and multi-head attention (with Σ_h‖W_hV_h‖), at each t of ``ts``."""
    R0 = check_scalar(R0, "R0", nonnegative=True)  # traced: its check is the value used
    return R0 * jnp.exp(value_norm_integral(attn, ts, t0))


def lipschitz_rate(attn, R, t=0.0) -> jax.Array:
    r"""L = ‖V‖‖A‖R² + ‖V‖(1 + 2‖A‖R²) e^{2‖A‖R²}: the Lipschitz constant of the softmax
    field in x plus its Lipschitz constant in μ (for W₁), for supports in B(0, R)
    (docs: math/attention.md#support-and-stability-bounds). Single-head softmax attention only.
    """
    if not isinstance(attn, SoftmaxAttention):
        raise ValueError(f"the Lipschitz bounds (docs/math/attention.md#support-and-stability-bounds) "
                         f"are stated for SoftmaxAttention, "
                         f"got {type(attn).__name__}")
    R = check_scalar(R, "R", nonnegative=True)
    nv, na = attn.value_norm(t), jnp.linalg.norm(attn.score_matrix(t), ord=2)
    r2 = na * jnp.asarray(R) ** 2
    return nv * r2 + nv * (1.0 + 2.0 * r2) * jnp.exp(2.0 * r2)


def stability_bound(attn, R0, ts, t0=0.0, substeps: int = 64) -> jax.Array:
    r"""exp(∫_{t0}^t L(τ) dτ) with L of :func:`lipschitz_rate` and R(τ) = R₀exp(∫‖V‖): the
    stability bound (docs: math/attention.md#support-and-stability-bounds),
    W_p(μ_t, ν_t) ≤ exp(∫L) W_p(μ_0, ν_0), for two softmax solutions supported in B(0, R₀).

    The integral uses right-endpoint sums on ``substeps`` cells per interval: L(R(τ)) is
    non-decreasing in τ, so the result is an upper bound of the exact expression.
    """
    R0 = check_scalar(R0, "R0", nonnegative=True)  # traced: its check is the value used
    substeps = check_int(substeps, "substeps", minimum=1)
    ts = _check_times(ts)
    edges = jnp.concatenate([jnp.asarray([t0], ts.dtype), ts])
    frac = (jnp.arange(substeps, dtype=ts.dtype) + 1.0) / substeps
    right = edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * frac[None, :]
    R = support_radius_bound(attn, R0, right.ravel(), t0).reshape(right.shape)
    L = jax.vmap(jax.vmap(lambda tau, r: lipschitz_rate(attn, r, tau)))(right, R)
    return jnp.exp(jnp.cumsum(jnp.mean(L, axis=1) * (edges[1:] - edges[:-1])))


__all__ = [
    "lipschitz_rate",
    "stability_bound",
    "support_radius_bound",
    "value_norm_integral",
]
