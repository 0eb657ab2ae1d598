r"""Exact transport distances in one dimension, for weighted atomic measures
(docs: math/mean_field.md#exact-distances-in-one-dimension).

* :func:`wasserstein_line`: W_p on R from the quantile functions,
  $W_p(\mu,\nu)^p=\int_0^1|F_\mu^{-1}(u)-F_\nu^{-1}(u)|^p\,du$.
* :func:`wasserstein_circle`: W_p on the circle R/LZ (arc length), p >= 1. For p = 1 from the
  cumulative functions, $W_1(\mu,\nu)=\min_c\int_0^L|F_\mu(\theta)-F_\nu(\theta)-c|\,d\theta$
  (F counted from a fixed origin; the minimising c is a median of F_μ − F_ν under dθ; Cabrelli &
  Molter 1995). For every p from the quantile functions and the best cut,
  $W_p^p=\min_\theta\int_0^1|F_\mu^{-1}(u)-F_\nu^{-1}(u+\theta)|^p\,du$ with $F_\nu^{-1}$ extended
  by $F_\nu^{-1}(u+1)=F_\nu^{-1}(u)+L$ (Delon, Salomon & Sobolevski, SIAM J. Appl. Math. 70 (2010);
  Rabin, Delon & Gousseau, J. Math. Imaging Vis. 41 (2011)). The cost is convex and piecewise
  linear in θ, with its minimum in [−1, 1] (docs: math/mean_field.md#exact-distances-in-one-dimension):
  found by bisection on the sign of its slope.

W_p on R and W_1 on S¹ are a sort of the n + m atoms and a sum, O((n + m) log(n + m)); W_p on S¹
for p > 1 adds 64 bisection steps of O(m log n) each. All are exact to rounding (no ε), jit-able and
vmappable. The Sinkhorn divergence (:mod:`.distances`) remains the distance in dimension >= 2;
:mod:`.sliced` builds the sliced distance on the sphere from the circle's.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from .._checks import as_float_array, check_finite, check_scalar, check_weights, is_concrete, runtime_check


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
    return _wasserstein_line(x.astype(dtype), y.astype(dtype), a, b, _check_p(p))


def _check_p(p) -> float:
    """The order p of W_p: a real number >= 1 (p = inf is not computed here), as a float."""
    check_scalar(p, "p")
    if not float(p) >= 1:
        raise ValueError(f"p must be >= 1, got {p}")
    return float(p)


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
    return _lp_norm(du, gap, p)


def _lp_norm(du, gap, p):
    """(Σ_k du_k |gap_k|^p)^{1/p}, du_k >= 0, safe against |gap|^p overflowing or underflowing."""
    if p == 1.0:
        return jnp.sum(du * jnp.abs(gap))
    g = jnp.abs(gap)
    direct = jnp.sum(du * g**p) ** (1.0 / p)
    # |gap|^p overflows (or underflows to 0) for large p: the same sum with the largest gap
    # factored out, M (Σ du (|gap|/M)^p)^{1/p}, wherever the direct one is not finite and positive
    big = jnp.max(jnp.where(du > 0, g, 0.0))
    safe = jnp.where(big > 0, big, 1.0)
    scaled = big * jnp.sum(jnp.where(du > 0, du * (g / safe) ** p, 0.0)) ** (1.0 / p)  # no 0·inf
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
            x = runtime_check(x, jnp.any(zero), f"{name} holds a zero vector: a token on S^1 needs a "
                              f"direction (its angle)")
        x = jnp.arctan2(x[:, 1], x[:, 0])
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError(f"{name} must hold angles, shape (n,), or points on S^1, shape (n, 2), with "
                         f"n >= 1, got shape {x.shape}")
    return (x if tokens else check_finite(x, name)), tokens  # finite tokens have finite angles


def wasserstein_circle(x, y, a=None, b=None, *, p: float = 1.0, period: float = 2 * math.pi) -> jax.Array:
    r"""Exact W_p(μ, ν) on the circle R/(period·Z) for the arc-length distance, p >= 1.

    ``x``, ``y``: angles ``(n,)`` (any real numbers, read modulo ``period``) or tokens on S^1,
    ``(n, 2)`` (their angles ``arctan2``: no zero token, and ``period`` must be 2π; a ValueError
    names either, ``eqx.error_if`` under jit); weights default to uniform and must sum to 1.

    p = 1: with the masses of both measures sorted around the circle, F_μ − F_ν is a step
    function with steps D_k on arcs of lengths ℓ_k, and W_1 = Σ_k ℓ_k |D_k − c*| with c* a
    weighted median of the D_k (weights ℓ_k): the minimum over the origin-dependent constant.

    p > 1: W_p^p = min_θ C(θ), C(θ) = ∫_0^1 |F_μ^{-1}(u) − F_ν^{-1}(u + θ)|^p du with the quantile
    function of ν extended by F_ν^{-1}(u + 1) = F_ν^{-1}(u) + period (θ shifts the cut of the
    circle). C is convex and linear between the θ at which a step of F_ν^{-1}(· + θ) meets one
    of F_μ^{-1}, and its minimum lies in [−1, 1]; 64 bisection steps on the sign of its slope
    (a sum over the steps of ν) leave a bracket of width 2^{-63}, and the smaller end value is
    returned: above the minimum by at most |slope| · 2^{-63}, i.e. exact to rounding
    (docs: math/mean_field.md#exact-distances-in-one-dimension).
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
            period = runtime_check(period, jnp.abs(period - 2 * math.pi) > 1e-6 * 2 * math.pi,
                                   f"period must be 2π when {why}")
    p = _check_p(p)
    x, y, period = x.astype(dtype), y.astype(dtype), jnp.asarray(period, dtype)
    if p == 1.0:
        return _wasserstein_circle(x, y, a, b, period)
    return _wasserstein_circle_p(x, y, a, b, period, p)


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


def _unit_positions(x, period):
    """Positions on the circle of length 1, in [0, 1) (x read modulo ``period``)."""
    u = x / period
    u = u - jnp.floor(u)
    return jnp.where(u >= 1, 0.0, u)  # u − floor(u) rounds to 1 for tiny negative u


def _circle_quantiles(x, y, a, b, period):
    """The sorted positions in [0, 1) and cumulative weights of both measures on the unit circle."""
    s, t = _unit_positions(x, period), _unit_positions(y, period)
    ix, iy = jnp.argsort(s), jnp.argsort(t)
    return s[ix], _cdf(a[ix]), t[iy], _cdf(b[iy])


def _quantile(values, cdf, u):
    """F^{-1}(u) for u in (0, 1] (the step of ``cdf`` holding u: left-continuous)."""
    return values[jnp.clip(jnp.searchsorted(cdf, u, side="left"), 0, values.shape[0] - 1)]


def _shifted_quantile(values, cdf, s):
    """The extended F^{-1}(s) = F^{-1}(s − k) + k, k = ⌈s⌉ − 1, for any real s."""
    k = jnp.ceil(s) - 1.0
    return _quantile(values, cdf, s - k) + k


def _cut_cost(xs, A, ys, B, theta, p, steps=None):
    """C(θ)^{1/p} on the unit circle: the merged steps of F_μ^{-1} and F_ν^{-1}(· + θ) on [0, 1];
    ``steps``: where those of F_ν^{-1}(· + θ) lie, B − θ mod 1 by default."""
    steps = jnp.mod(B - theta, 1.0) if steps is None else steps
    u = jnp.sort(jnp.concatenate([A, steps]))
    du = jnp.diff(u, prepend=0.0)
    mid = u - 0.5 * du  # inside the step: robust to ties
    return _lp_norm(du, _quantile(xs, A, mid) - _shifted_quantile(ys, B, mid + theta), p)


def _cut_slope_sign(xs, A, ys, B, theta, p):
    """The sign of C's right derivative at θ. As θ grows, the step of F_ν^{-1}(· + θ) at
    τ_j = B_j − θ (mod 1, in (0, 1]) moves left: on [τ_j − dθ, τ_j] the value y_j gives way to
    y_{j+1} against F_μ^{-1}(τ_j), so C' = Σ_j |F_μ^{-1}(τ_j) − y_{j+1}|^p − |F_μ^{-1}(τ_j) − y_j|^p
    (lifted values; y_{m+1} = y_1 + 1). Each term is divided by the largest gap^p: the sign
    is kept where the powers would overflow or underflow."""
    tau = 1.0 - jnp.mod(theta - B, 1.0)
    k = jnp.round(tau + theta - B)  # the lift: τ_j + θ = B_j + k
    before = ys + k
    after = jnp.concatenate([ys[1:], ys[:1] + 1.0]) + k
    q = _quantile(xs, A, tau)
    g_after, g_before = jnp.abs(q - after), jnp.abs(q - before)
    big = jnp.maximum(jnp.max(g_after), jnp.max(g_before))
    big = jnp.where(big > 0, big, 1.0)
    return jnp.sign(jnp.sum((g_after / big) ** p - (g_before / big) ** p))


_BISECTION_STEPS = 64  # from [−1, 1] to a bracket of width 2^{-63}


@functools.partial(jax.jit, static_argnames="p")
def _wasserstein_circle_p(x, y, a, b, period, p):
    xs, A, ys, B = _circle_quantiles(x, y, a, b, period)
    dtype = xs.dtype

    def step(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        rising = _cut_slope_sign(xs, A, ys, B, mid, p) > 0
        return jnp.where(rising, lo, mid), jnp.where(rising, mid, hi)

    # C is non-increasing on (−∞, −1] and non-decreasing on [1, ∞): the minimum is in [−1, 1]
    lo, hi = jax.lax.fori_loop(0, _BISECTION_STEPS, step, (jnp.asarray(-1.0, dtype), jnp.asarray(1.0, dtype)))
    # For large p, C is so steep beside its minimum that C(lo) exceeds it visibly even 2^{-63}
    # away: C is also evaluated at the kink nearest the bracket, θ = B_j − A_i + k, with the
    # steps B_l − B_j + A_i (mod 1) written so that step j meets A_i exactly (no sliver of
    # width ~1e-17 carrying a large gap^p). Each value is the cost of a transport plan: the
    # smallest is returned.
    mid = 0.5 * (lo + hi)
    A0 = jnp.concatenate([jnp.zeros(1, dtype), A])
    tau = 1.0 - jnp.mod(mid - B, 1.0)
    dist = jnp.abs(tau[:, None] - A0[None, :])
    j, i = jnp.unravel_index(jnp.argmin(dist), dist.shape)
    k = jnp.round(mid - (B[j] - A0[i]))
    kink = _cut_cost(xs, A, ys, B, B[j] - A0[i] + k, p, steps=jnp.mod(B - B[j] + A0[i], 1.0))
    cost = jnp.minimum(jnp.minimum(_cut_cost(xs, A, ys, B, lo, p), _cut_cost(xs, A, ys, B, hi, p)), kink)
    return period * cost


def _weighted_median(values, weights):
    """A minimiser of c ↦ Σ w_k |v_k − c| (w_k >= 0): the first sorted value whose cumulative
    weight reaches half the total."""
    order = jnp.argsort(values)
    v, w = values[order], weights[order]
    cw = jnp.cumsum(w)
    k = jnp.searchsorted(cw, 0.5 * cw[-1], side="left")
    return v[jnp.clip(k, 0, v.shape[0] - 1)]


__all__ = ["wasserstein_circle", "wasserstein_line"]
