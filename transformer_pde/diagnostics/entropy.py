r"""Relative entropy of the tokens' law to a target density (docs: math/mean_field.md#relative-entropy).

With log ρ_t carried along the tokens (``tp.WithLogDensity``), the relative entropy is an
expectation under μ_t = ρ_t dx, estimated on the tokens themselves:

$$\mathrm{KL}(\mu_t\,\|\,\nu)=\int\log\frac{\rho_t}{\nu}\,d\mu_t
\approx\sum_i w_i\big(\log\rho_t(X^i_t)-\log\nu(X^i_t)\big),$$

Monte Carlo for i.i.d. tokens of μ_0 (uniform weights, error O(n^{−1/2})), a quadrature rule for
weighted tokens (the rule's error on log(ρ_t/ν)∘Φ_t). No kernel density estimate is involved.

The target ν is a log-density function; it must be normalized (∫ν = 1), which
:func:`check_normalized` verifies by quadrature for d <= 3 (and reports a non-normalizable one).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_count, check_points, check_scalar, check_weights, is_concrete, runtime_check

__all__ = ["check_normalized", "relative_entropy"]


def relative_entropy(x, log_rho, log_target: Callable, weights=None):
    """KL(μ ‖ ν) = Σ_i w_i (log ρ(x_i) − log ν(x_i)) (module docstring).

    Args:
        x: tokens ``(n, d)`` of μ (i.i.d. samples, or the nodes of a quadrature rule).
        log_rho: log ρ at the tokens, ``(n,)`` (e.g. the ``log_rho`` of a
            ``tp.WithLogDensity`` solve).
        log_target: ``log_target(x) -> (n,)``, the normalized log-density of ν
            (:func:`check_normalized`), vectorized over rows.
        weights: ``(n,)`` non-negative, summing to one (None: uniform, Monte Carlo).

    Raises ValueError (``eqx.error_if`` under jit) where a token of positive weight sits where
    ν = 0 (log ν = −inf: μ is not absolutely continuous w.r.t. ν, KL = +inf), naming the token;
    or where log ν or log ρ is NaN or +inf.
    """
    if not callable(log_target):
        raise ValueError(f"log_target must be a function x -> log ν(x), got {log_target!r}")
    x = check_points(x, "x")  # a real floating (n, d) array, finite
    log_rho = as_float_array(log_rho, "log_rho")  # real: its NaN and +inf are checked below
    if log_rho.shape != x.shape[:1]:
        raise ValueError(f"relative_entropy: log_rho must have shape ({x.shape[0]},), got {log_rho.shape}")
    w = check_weights(weights, x.shape[0], x.dtype)
    log_nu = jnp.asarray(log_target(x))
    if log_nu.shape != x.shape[:1]:
        raise ValueError(f"log_target must map (n, d) tokens to (n,) log-densities, got shape {log_nu.shape}")
    carried = w > 0
    zero = carried & (log_nu == -jnp.inf)
    bad_nu = carried & (jnp.isnan(log_nu) | (log_nu == jnp.inf))
    bad_rho = carried & ~jnp.isfinite(log_rho)
    if all(is_concrete(a) for a in (zero, bad_nu, bad_rho)):
        for mask, what in ((zero, "the target has zero density (log ν = −inf) at token {i}, x = {x}, where "
                                  "the flow sends mass: KL(μ ‖ ν) = +inf (μ is not absolutely continuous "
                                  "w.r.t. ν); choose a target positive wherever the tokens go"),
                           (bad_nu, "log_target is {v} at token {i}, x = {x}: a log-density must be "
                                    "finite or −inf"),
                           (bad_rho, "log_rho is {r} at token {i}: the tokens must carry a finite "
                                     "log-density")):
            m = np.asarray(mask)
            if m.any():
                i = int(np.argmax(m))
                raise ValueError("relative_entropy: " + what.format(
                    i=i, x=np.asarray(x[i]).tolist(), v=float(log_nu[i]), r=float(log_rho[i])))
    else:
        log_nu = runtime_check(log_nu, jnp.any(zero), "relative_entropy: the target has zero density "
                               "(log ν = −inf) where the flow sends mass: KL = +inf")
        log_nu = runtime_check(log_nu, jnp.any(bad_nu | bad_rho), "relative_entropy: log_target or "
                               "log_rho is NaN or +inf at a token")
    terms = jnp.where(carried, log_rho - log_nu, 0.0)
    return jnp.sum(w * terms)


def _graded_rule(scale: float, levels: int, nodes: int):
    """1-D Gauss–Legendre rule on panels [±2^{k−1}s, ±2^k s] (k = 1..levels) and [−s, s]: nodes,
    weights and the level of each node's panel (0 for [−s, s])."""
    g, gw = np.polynomial.legendre.leggauss(nodes)
    edges = [scale * 2.0 ** k for k in range(levels + 1)]
    pts, wts, lev = [scale * g], [scale * gw], [np.zeros(nodes, int)]
    for k in range(1, levels + 1):
        lo, hi = edges[k - 1], edges[k]
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        for sign in (1, -1):
            pts.append(sign * (mid + half * g))
            wts.append(half * gw)
            lev.append(np.full(nodes, k))
    return np.concatenate(pts), np.concatenate(wts), np.concatenate(lev)


def check_normalized(log_density: Callable, dim: int, *, scale: float = 1.0, levels: int = 8,
                     tol: float = 1e-3, center=None) -> float:
    """∫ν over R^dim by quadrature, checked to be 1: returns the mass, raises ValueError otherwise.

    The boxes B_k = center + [−2^k s, 2^k s]^d (k = 0..``levels``) carry a graded tensor
    Gauss–Legendre rule (one panel per dyadic shell, per axis). The mass outside the largest
    box is estimated by the last shell's, M(B_K) − M(B_{K−1}):

    - a last shell above ``tol`` (with the masses growing): ν is not normalizable (log ν = 0,
      tails like |x|^{−d}), or its mass lies beyond 2^K s (raise ``scale`` or ``levels``);
    - |M(B_K) − 1| > ``tol``: ν is not normalized (subtract log M from log ν).

    Args:
        log_density: ``f(x (m, d)) -> (m,)`` log ν (−inf where ν = 0).
        dim: d, 1 to 3.
        scale: s, the size of the innermost box (the target's spread).
        levels: K, dyadic shells (the largest box has half-width 2^K s).
        tol: tolerance on the mass and on the last shell.
        center: the boxes' centre (default 0).
    """
    dim = check_count(dim, "dim", minimum=1)
    if dim not in (1, 2, 3):
        raise ValueError(f"check_normalized: quadrature needs dim 1, 2 or 3, got {dim}")
    check_scalar(scale, "scale", positive=True)
    check_scalar(tol, "tol", positive=True)
    levels = check_count(levels, "levels", minimum=2, maximum=64)  # 2**levels nodes per axis
    d = int(dim)
    nodes = {1: 32, 2: 16, 3: 8}[d]
    p, w, lev = _graded_rule(float(scale), int(levels), nodes)
    grids = np.meshgrid(*([p] * d), indexing="ij")
    pts = np.stack([g.ravel() for g in grids], axis=-1)
    if center is not None:
        c = np.asarray(center, dtype=np.float64)
        if c.shape != (d,):
            raise ValueError(f"check_normalized: center must have shape ({d},), got {c.shape}")
        pts = pts + c
    wts = np.ones(pts.shape[0])
    level = np.zeros(pts.shape[0], int)
    for ws, ls in zip(np.meshgrid(*([w] * d), indexing="ij"), np.meshgrid(*([lev] * d), indexing="ij")):
        wts = wts * ws.ravel()
        level = np.maximum(level, ls.ravel())
    log_nu = np.asarray(jax.jit(log_density)(jnp.asarray(pts)), dtype=np.float64)
    if log_nu.shape != (pts.shape[0],):
        raise ValueError(f"log_density must map (m, {d}) points to (m,) values, got shape {log_nu.shape}")
    if np.any(np.isnan(log_nu) | (log_nu == np.inf)):
        raise ValueError("check_normalized: log_density is NaN or +inf somewhere (a log-density is finite "
                         "or −inf)")
    dens = np.exp(log_nu) * wts
    shells = np.array([dens[level == k].sum() for k in range(int(levels) + 1)])
    masses = np.cumsum(shells)
    total, last = float(masses[-1]), float(shells[-1])
    if not np.isfinite(total):
        raise ValueError(f"check_normalized: the density overflows (mass {total}): not a normalized density")
    if last > tol * max(1.0, total):
        box = float(scale) * 2.0 ** int(levels)
        raise ValueError(
            f"the density is not normalizable (or its mass lies beyond the box [−{box:g}, {box:g}]^{d}): "
            f"the mass over the boxes [−2^k s, 2^k s]^{d}, k = {int(levels) - 2}..{int(levels)}, is "
            f"{masses[-3]:.6g}, {masses[-2]:.6g}, {masses[-1]:.6g}, the last shell adding {last:.3g} > tol = "
            f"{tol:g}; a log-density like 0 or −d·log|x| has infinite mass. Pass a larger scale if the "
            "target is merely wide")
    if abs(total - 1.0) > tol:
        raise ValueError(f"the density is not normalized: its mass is {total:.6g}, not 1 (within tol = {tol:g});"
                         f" subtract log({total:.6g}) = {np.log(total):.6g} from the log-density")
    return total
