r"""The spherical sliced Wasserstein distance on S^{d−1} (Bonet, Berg, Courty, Septier, Drumetz &
Pham, "Spherical Sliced-Wasserstein", ICLR 2023; docs: math/mean_field.md#sliced-wasserstein-on-the-sphere).

A great circle is a frame U = (u_1, u_2) of orthonormal vectors; the geodesic projection of x onto
it is P^U(x) = Uᵀx/|Uᵀx|, the angle arctan2(⟨u_2, x⟩, ⟨u_1, x⟩) on the circle of length 2π. Then

$$SSW_p(\mu,\nu)^p=\int_{V_{d,2}}W_p^p\big(P^U_\#\mu,P^U_\#\nu\big)\,d\sigma(U),$$

σ the uniform law on the Stiefel manifold V_{d,2}, W_p the exact arc-length distance of the circle
(:func:`~.distances_1d.wasserstein_circle`). The integral is the average over given frames
(:func:`random_great_circles` draws them): a Monte Carlo estimate of SSW_p with error
O(L^{-1/2}) in the number L of frames, and for a fixed set of frames an exact quantity.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_count, check_finite, check_key, check_weights, is_concrete, runtime_check
from ..models.sphere import check_unit_points
from .distances_1d import _check_p, _lp_norm, _wasserstein_circle, _wasserstein_circle_p


def random_great_circles(key, num: int, d: int, dtype=None) -> jax.Array:
    """``num`` frames (u_1, u_2) drawn from the uniform law on the Stiefel manifold V_{d,2},
    shape ``(num, d, 2)``: Gram–Schmidt on two independent standard Gaussian vectors (their law
    is invariant under rotations, so is the frame's). Each frame spans a uniformly random great
    circle of S^{d−1}, d >= 2."""
    key = check_key(key)
    num = check_count(num, "num", minimum=1)
    d = check_count(d, "d", minimum=2)
    g = jax.random.normal(key, (num, d, 2), dtype=dtype)
    u1 = g[..., 0] / jnp.linalg.norm(g[..., 0], axis=-1, keepdims=True)
    v = g[..., 1] - jnp.sum(g[..., 1] * u1, axis=-1, keepdims=True) * u1
    u2 = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    return jnp.stack([u1, u2], axis=-1)


def _check_frames(frames, d):
    """Frames ``(L, d, 2)`` with orthonormal columns (within 1e-6, 1e-3 in float32)."""
    frames = as_float_array(frames, "frames")
    if frames.ndim != 3 or frames.shape[1:] != (d, 2) or frames.shape[0] < 1:
        raise ValueError(f"frames must have shape (L, d, 2) = (L, {d}, 2) with L >= 1 (two orthonormal "
                         f"vectors spanning each great circle), got shape {frames.shape}")
    frames = check_finite(frames, "frames")
    gram = jnp.einsum("ldi,ldj->lij", frames, frames)
    dev = jnp.max(jnp.abs(gram - jnp.eye(2, dtype=frames.dtype)[None]), axis=(1, 2))
    tol = 1e-6 if jnp.finfo(frames.dtype).eps < 1e-10 else 1e-3
    if is_concrete(dev):
        bad = np.asarray(dev) > tol
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"frames[{i}] must have orthonormal columns (UᵀU = I within {tol:g}), but "
                             f"|UᵀU − I| = {float(dev[i]):.3g}; random_great_circles draws valid frames")
        return frames
    return runtime_check(frames, jnp.any(dev > tol), f"frames must have orthonormal columns (UᵀU = I "
                                                      f"within {tol:g})")


def sliced_wasserstein_sphere(x, y, a=None, b=None, *, frames, p: float = 2.0) -> jax.Array:
    r"""The spherical sliced Wasserstein distance SSW_p(μ, ν) over the great circles ``frames``,

    $$SSW_p(\mu,\nu)=\Big(\frac1L\sum_{l=1}^L W_p^p\big(P^{U_l}_\#\mu,P^{U_l}_\#\nu\big)\Big)^{1/p},$$

    μ = Σ a_i δ_{x_i}, ν = Σ b_j δ_{y_j} on S^{d−1}, P^U(x) = Uᵀx/|Uᵀx| the geodesic projection on
    the great circle of U, W_p the exact arc-length distance on that circle (length 2π;
    :func:`~transformer_pde.diagnostics.wasserstein_circle`). Bonet et al. (ICLR 2023); the
    linear slices x ↦ ⟨θ, x⟩ of the Euclidean sliced distance are not used: they see the sphere
    through its embedding (every point of a parallel around θ projects to one value, and the
    distance is the chordal one).

    Args:
        x, y: tokens on the unit sphere, shapes ``(n, d)``, ``(m, d)``, d >= 2 (ValueError naming
            a token off the sphere).
        a, b: weights, uniform by default, summing to 1.
        frames: great circles, shape ``(L, d, 2)`` with orthonormal columns
            (:func:`random_great_circles`; for a fixed set of frames the value is exact).
        p: the order, >= 1.

    A token orthogonal to a frame's plane has no projection on its circle (a set of frames of
    measure zero); it is placed at angle 0 there (arctan2(0, 0)). Jit-able; O(L (n + m) log(n + m)) for p = 1,
    with 64 bisection steps per circle for p > 1.
    """
    x = check_unit_points(x, "x", None)
    y = check_unit_points(y, "y", x.shape[1])
    dtype = jnp.result_type(x.dtype, y.dtype)
    a = check_weights(a, x.shape[0], dtype, "a")
    b = check_weights(b, y.shape[0], dtype, "b")
    frames = _check_frames(frames, x.shape[1]).astype(dtype)
    p = _check_p(p)
    return _sliced_sphere(x.astype(dtype), y.astype(dtype), a, b, frames, p)


def _angles_on(z, frames):
    """The angles of the projections of tokens ``z`` on every great circle, shape ``(L, n)``."""
    proj = jnp.einsum("nd,ldk->lnk", z, frames)
    return jnp.arctan2(proj[..., 1], proj[..., 0])


def _sliced_sphere(x, y, a, b, frames, p):
    period = jnp.asarray(2 * math.pi, x.dtype)
    if p == 1.0:
        one = lambda s, t: _wasserstein_circle(s, t, a, b, period)  # noqa: E731
    else:
        one = lambda s, t: _wasserstein_circle_p(s, t, a, b, period, p)  # noqa: E731
    w = jax.vmap(one)(_angles_on(x, frames), _angles_on(y, frames))
    # (mean_l W_l^p)^{1/p} with the largest W factored out where W^p would overflow
    return _lp_norm(jnp.full(w.shape, 1.0 / w.shape[0], w.dtype), w, p)


__all__ = ["random_great_circles", "sliced_wasserstein_sphere"]
