r"""Exact transport distances in one dimension, for weighted atomic measures
(docs: math/mean_field.md#exact-distances-in-one-dimension).

* :func:`wasserstein_line`: W_p on R from the quantile functions,
  $W_p(\mu,\nu)^p=\int_0^1|F_\mu^{-1}(u)-F_\nu^{-1}(u)|^p\,du$.
* :func:`wasserstein_circle`: W_1 on the circle R/LZ (arc length) from the cumulative functions,
  $W_1(\mu,\nu)=\min_c\int_0^L|F_\mu(\theta)-F_\nu(\theta)-c|\,d\theta$ (F counted from a fixed
  origin; the minimising c is a median of F_μ − F_ν under dθ; Rabin, Delon & Gousseau,
  J. Math. Imaging Vis. 41 (2011); Cabrelli & Molter 1995).

Both are exact (no ε, no iteration): a sort of the n + m atoms and a sum, O((n + m) log(n + m));
jit-able and vmappable. The Sinkhorn divergence (:mod:`.distances`) remains the distance in
dimension >= 2.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import as_float_array, check_finite, check_scalar, check_weights, is_concrete


def _line_points(x, name):
    x = as_float_array(x, name)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError(f"{name} must hold points on a line, shape (n,) or (n, 1) with n >= 1, got "
                         f"shape {x.shape}")
    return check_finite(x, name)


def _cdf(w):
    """Cumulative weights, the last set to exactly 1 (the weights sum to 1 up to rounding)."""
    c = jnp.cumsum(w)
    return c.at[-1].set(1.0)


def wasserstein_line(x, y, a=None, b=None, *, p: float = 1.0) -> jax.Array:
    r"""Exact W_p(μ, ν) of μ = Σ a_i δ_{x_i}, ν = Σ b_j δ_{y_j} on R, p >= 1.

    The quantile functions are step functions; on the merged steps u_k of the two cumulative
    weight sequences, W_p^p = Σ_k (u_k − u_{k−1}) |x_{(i_k)} − y_{(j_k)}|^p. ``x``, ``y``:
    shapes ``(n,)`` or ``(n, 1)``; weights default to uniform and must sum to 1.
    """
    x = _line_points(x, "x")
    y = _line_points(y, "y")
    dtype = jnp.result_type(x.dtype, y.dtype)
    a = check_weights(a, x.shape[0], dtype, "a")
    b = check_weights(b, y.shape[0], dtype, "b")
    check_scalar(p, "p")
    if not float(p) >= 1:
        raise ValueError(f"p must be >= 1, got {p}")
    return _wasserstein_line(x.astype(dtype), y.astype(dtype), a, b, float(p))


@jax.jit
def _quantile_steps(x, y, a, b):
    ix, iy = jnp.argsort(x), jnp.argsort(y)
    xs, ys = x[ix], y[iy]
    ca, cb = _cdf(a[ix]), _cdf(b[iy])
    u = jnp.sort(jnp.concatenate([ca, cb]))
    du = jnp.diff(u, prepend=0.0)
    mid = u - 0.5 * du  # inside the step (u_{k-1}, u_k]: robust to ties and rounding
    i = jnp.clip(jnp.searchsorted(ca, mid, side="left"), 0, x.shape[0] - 1)
    j = jnp.clip(jnp.searchsorted(cb, mid, side="left"), 0, y.shape[0] - 1)
    return du, xs[i] - ys[j]


def _wasserstein_line(x, y, a, b, p):
    du, gap = _quantile_steps(x, y, a, b)
    if p == 1.0:
        return jnp.sum(du * jnp.abs(gap))
    g = jnp.abs(gap)
    direct = jnp.sum(du * g**p) ** (1.0 / p)
    # |gap|^p overflows (or underflows to 0) for large p: the same sum with the largest gap
    # factored out, M (Σ du (|gap|/M)^p)^{1/p}, wherever the direct one is not finite and positive
    big = jnp.max(jnp.where(du > 0, g, 0.0))
    safe = jnp.where(big > 0, big, 1.0)
    scaled = big * jnp.sum(du * (g / safe) ** p) ** (1.0 / p)
    return jnp.where(jnp.isfinite(direct) & ((direct > 0) | (big == 0)), direct, scaled)


def _angles(x, name):
    """``(angles, are_tokens)``: angles ``(n,)`` as given, or the angles of tokens ``(n, 2)``
    (nonzero: a zero token has no angle; arctan2 gave it 0)."""
    x = as_float_array(x, name)
    tokens = x.ndim == 2 and x.shape[1] == 2
    if tokens:  # tokens on S^1: their angles
        x = check_finite(x, name)
        zero = jnp.all(x == 0, axis=1)
        if is_concrete(zero):
            if bool(jnp.any(zero)):
                raise ValueError(f"{name}[{int(jnp.argmax(zero))}] is the zero vector: a token on S^1 "
                                 f"needs a direction (its angle)")
        else:
            x = eqx.error_if(x, jnp.any(zero), f"{name} holds a zero vector: a token on S^1 needs a "
                             f"direction (its angle)")
        x = jnp.arctan2(x[:, 1], x[:, 0])
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError(f"{name} must hold angles, shape (n,), or points on S^1, shape (n, 2), with "
                         f"n >= 1, got shape {x.shape}")
    return (x if tokens else check_finite(x, name)), tokens  # finite tokens have finite angles


def wasserstein_circle(x, y, a=None, b=None, *, period: float = 2 * math.pi) -> jax.Array:
    r"""Exact W_1(μ, ν) on the circle R/(period·Z) for the arc-length distance.

    ``x``, ``y``: angles ``(n,)`` (any real numbers, read modulo ``period``) or tokens on S^1,
    ``(n, 2)`` (their angles ``arctan2``: no zero token, and ``period`` must be 2π; a ValueError
    names either, ``eqx.error_if`` under jit). With the masses of both
    measures sorted around the circle, F_μ − F_ν is a step function with steps D_k on arcs of
    lengths ℓ_k, and W_1 = Σ_k ℓ_k |D_k − c*| with c* a weighted median of the D_k (weights ℓ_k):
    the minimum over the origin-dependent constant, computed exactly.
    """
    (x, x_tokens), (y, y_tokens) = _angles(x, "x"), _angles(y, "y")
    dtype = jnp.result_type(x.dtype, y.dtype)
    a = check_weights(a, x.shape[0], dtype, "a")
    b = check_weights(b, y.shape[0], dtype, "b")
    period = check_scalar(period, "period", positive=True)
    if x_tokens or y_tokens:  # their angles lie on a circle of length 2π: no other period
        which = "x and y are" if x_tokens and y_tokens else ("x is" if x_tokens else "y is")
        why = f"{which} tokens on S^1, whose angles have period 2π"
        if is_concrete(period):
            if not math.isclose(float(period), 2 * math.pi, rel_tol=1e-6):
                raise ValueError(f"period must be 2π when {why}, got {float(period)!r}")
        else:
            period = eqx.error_if(period, jnp.abs(period - 2 * math.pi) > 1e-6 * 2 * math.pi,
                                  f"period must be 2π when {why}")
    return _wasserstein_circle(x.astype(dtype), y.astype(dtype), a, b, jnp.asarray(period, dtype))


@jax.jit
def _wasserstein_circle(x, y, a, b, period):
    s = jnp.mod(jnp.concatenate([x, y]), period)
    m = jnp.concatenate([a, -b])
    order = jnp.argsort(s)
    s, m = s[order], m[order]
    D = jnp.cumsum(m)
    # arcs (s_k, s_{k+1}) carry D_k; the arc through the origin carries F_μ − F_ν = 0
    lengths = jnp.concatenate([jnp.diff(s), (period - s[-1] + s[0])[None]])
    values = D.at[-1].set(0.0)
    c = _weighted_median(values, lengths)
    return jnp.sum(lengths * jnp.abs(values - c))


def _weighted_median(values, weights):
    """A minimiser of c ↦ Σ w_k |v_k − c| (w_k >= 0): the first sorted value whose cumulative
    weight reaches half the total."""
    order = jnp.argsort(values)
    v, w = values[order], weights[order]
    cw = jnp.cumsum(w)
    k = jnp.searchsorted(cw, 0.5 * cw[-1], side="left")
    return v[jnp.clip(k, 0, v.shape[0] - 1)]


__all__ = ["wasserstein_circle", "wasserstein_line"]
