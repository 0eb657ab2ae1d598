r"""Wasserstein distances and the support radius of measures (docs: math/attention.md#support-and-stability-bounds).

* :func:`bures_wasserstein`: W₂ between Gaussians (closed form).
* :func:`sinkhorn_wasserstein`: W_p between weighted empirical measures through ott-jax's
  debiased Sinkhorn divergence with an explicit ε (jit-able, differentiable).
* :func:`exact_wasserstein`: exact W_p for small n (assignment or linear program, on the host).
* :func:`support_radius`: R = max|x_i| over the support (docs: math/attention.md#support-and-stability-bounds).
* :func:`stability_ratio`: W_p(μ_t, ν_t)/W_p(μ_0, ν_0) along two trajectories
  (docs: math/attention.md#support-and-stability-bounds, "Stability").

The a-priori bounds these are checked against are in :mod:`.bounds`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (as_float_array, check_block_size, check_covariance, check_finite, check_int, check_points,
                       check_scalar, check_weights, check_weights_of, is_concrete, runtime_check)
from .._linalg import sqrtm_psd


def bures_wasserstein(mean1, cov1, mean2, cov2) -> jax.Array:
    r"""W₂ between N(m₁, Σ₁) and N(m₂, Σ₂) (Bures–Wasserstein):

    $$W_2^2=|m_1-m_2|^2+\operatorname{tr}\Big(\Sigma_1+\Sigma_2-2\big(\Sigma_1^{1/2}\Sigma_2\Sigma_1^{1/2}\big)^{1/2}\Big).$$

    Accepts batches (leading axes broadcast between the two Gaussians; a mean has no more leading
    axes than its covariance). Covariances may be singular (PSD); an indefinite, asymmetric or
    non-finite one, or a non-finite mean, is an error (ValueError, ``eqx.error_if`` under jit),
    not a clipped answer.

    Computed without cancellation, as the residual of orthogonal Procrustes: the trace term is
    $\min_U\|\Sigma_1^{1/2} - \Sigma_2^{1/2}U\|_F^2$ over orthogonal U, attained at U = PRᵀ for the
    SVD $\Sigma_2^{1/2}\Sigma_1^{1/2} = PDR^\top$, and the residual matrix is summed entry by entry.
    The trace formula above subtracts numbers of size tr Σ, so its rounding is eps·tr Σ in W₂²
    (W₂ ≈ 1e-7 between two equal 4 x 4 covariances in float64); the residual's is eps² in W₂²
    (W₂ ≈ 1e-15 there): distances down to 1e-8 and below can be read (docs:
    math/gaussian.md#control-of-gaussians). At a singular covariance the square root itself is
    the limit: a zero eigenvalue computed as eps·|Σ| has root (eps·|Σ|)^{1/2}, so W₂ is then
    accurate to ~1e-8 only.
    """
    mean1, mean2 = _check_mean(mean1, cov1, "mean1", "cov1"), _check_mean(mean2, cov2, "mean2", "cov2")
    mean1, mean2 = jnp.broadcast_arrays(mean1, mean2)
    cov1, cov2 = jnp.broadcast_arrays(jnp.asarray(cov1), jnp.asarray(cov2))
    cov1, cov2 = check_covariance(cov1, "cov1"), check_covariance(cov2, "cov2")
    r1, r2 = sqrtm_psd(cov1), sqrtm_psd(cov2)
    P, _, Rt = jnp.linalg.svd(r2 @ r1)
    residual = r1 - r2 @ (P @ Rt)
    w2 = jnp.sum((mean1 - mean2) ** 2, axis=-1) + jnp.sum(residual ** 2, axis=(-2, -1))
    return jnp.sqrt(w2)


def _check_mean(mean, cov, name, cov_name):
    """A finite mean of shape (..., d) matching its covariance (..., d, d), no more leading axes."""
    mean, cov_shape = jnp.asarray(mean), jnp.shape(cov)
    if mean.ndim < 1 or len(cov_shape) < 2 or mean.shape[-1] != cov_shape[-1] or mean.ndim > len(cov_shape) - 1:
        raise ValueError(f"{name} must have shape (..., d) matching {cov_name} (..., d, d) with no more "
                         f"leading axes, got {name} {mean.shape} and {cov_name} {cov_shape}")
    return check_finite(mean, name)


def _cost(p):
    from ott.geometry import costs

    return costs.SqEuclidean() if p == 2 else costs.EuclideanP(p)


def sinkhorn_divergence(x, y, a=None, b=None, *, epsilon, p: float = 2.0, threshold: float = 1e-6,
                        max_iterations: int = 2000, batch_size: int | None = None,
                        throw: bool = True) -> jax.Array:
    r"""Debiased Sinkhorn divergence of μ = Σ a_i δ_{x_i} and ν = Σ b_j δ_{y_j} (ott-jax):

    $$S_\varepsilon=\mathrm{OT}_\varepsilon(\mu,\nu)-\tfrac12\mathrm{OT}_\varepsilon(\mu,\mu)
    -\tfrac12\mathrm{OT}_\varepsilon(\nu,\nu)\ \xrightarrow[\varepsilon\to0]{}\ W_p^p(\mu,\nu),$$

    for the cost |x − y|^p: zero iff μ = ν, differentiable (ott's implicit differentiation),
    vmappable. The one Sinkhorn divergence of the package: losses (interpolation), W₂
    estimates (convergence, stability) all call it. ``epsilon`` is required (ott's default
    scales with the data, STYLE.md). ``batch_size`` (p = 2 only) streams the cost in blocks of
    that many points instead of storing it (memory O(n · batch_size),
    :class:`transformer_pde.kernels.point_clouds.StreamingSqEuclideanCloud`).

    ``throw``: a divergence whose three Sinkhorn solves did not all reach ``threshold`` within
    ``max_iterations`` raises (``eqx.error_if``) instead of returning an unconverged value;
    losses inside gradient descent may pass False.
    """
    div, converged = _checked_divergence(x, y, a, b, epsilon, p, threshold, max_iterations, batch_size)
    if throw:
        div = runtime_check(div, ~converged, f"Sinkhorn divergence did not converge within "
                            f"max_iterations={max_iterations} (threshold={threshold}); raise "
                            "max_iterations or epsilon, or pass throw=False")
    return div


def _checked_divergence(x, y, a, b, epsilon, p, threshold, max_iterations, batch_size):
    """The arguments checked, then ``(S_ε, converged)``: the one path of the public functions."""
    x = check_points(x, "x")
    y = check_points(y, "y", x.shape[1])
    a = check_weights(a, x.shape[0], x.dtype, "a")
    b = check_weights(b, y.shape[0], y.dtype, "b")
    epsilon = check_scalar(epsilon, "epsilon", positive=True)  # traced: its check is the value used
    check_scalar(p, "p")
    if not float(p) >= 1:
        raise ValueError(f"p must be >= 1, got {p}")
    batch_size = check_block_size(batch_size, "batch_size")
    if batch_size is not None and float(p) != 2:
        raise ValueError(f"batch_size streams the squared Euclidean cost only (p = 2), got p={p}")
    max_iterations = check_int(max_iterations, "max_iterations", minimum=1)
    check_scalar(threshold, "threshold", positive=True)
    return _sinkhorn_divergence(x, y, a, b, jnp.asarray(epsilon, x.dtype), float(p),
                                float(threshold), max_iterations, batch_size)


def _wasserstein_of(div, p):
    """W_p from a Sinkhorn divergence: max(S_ε, 0)^{1/p}."""
    div = jnp.clip(div, 0.0)
    return jnp.sqrt(div) if float(p) == 2 else div ** (1.0 / float(p))


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8))
def _sinkhorn_divergence(x, y, a, b, epsilon, p, threshold, max_iterations, batch_size):
    from ott.geometry import pointcloud  # ott (and scipy.stats) only where a divergence is computed
    from ott.tools import sinkhorn_divergence as _sd

    from ..kernels.point_clouds import StreamingSqEuclideanCloud

    cloud = pointcloud.PointCloud if batch_size is None else StreamingSqEuclideanCloud
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    with jax.numpy_rank_promotion("allow"):  # ott broadcasts implicitly inside
        div, out = _sd.sinkhorn_divergence(
            cloud, x, y, a=a, b=b, cost_fn=_cost(p), epsilon=epsilon, **kwargs,
            solve_kwargs={"threshold": threshold, "max_iterations": max_iterations})
    return div, jnp.all(jnp.asarray(out.converged))


def sinkhorn_wasserstein(x, y, a=None, b=None, *, epsilon, p: float = 2.0, threshold: float = 1e-6,
                         max_iterations: int = 2000, batch_size: int | None = None,
                         throw: bool = True) -> jax.Array:
    r"""W_p(μ, ν) estimated as ``max(S_ε, 0)^{1/p}`` from :func:`sinkhorn_divergence`.

    Take ε small against the squared scale of the data for a W_p estimate (bias O(ε²) for
    smooth data at p = 2). For p = 2 a translation is reproduced exactly:
    S_ε(μ, μ(· − c)) = |c|² for every ε.
    """
    return _wasserstein_of(sinkhorn_divergence(x, y, a, b, epsilon=epsilon, p=p, threshold=threshold,
                                               max_iterations=max_iterations, batch_size=batch_size,
                                               throw=throw), p)


def sinkhorn_wasserstein_status(x, y, a=None, b=None, *, epsilon, p: float = 2.0, threshold: float = 1e-6,
                                max_iterations: int = 2000,
                                batch_size: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``(W_p estimate, converged)``: :func:`sinkhorn_wasserstein` without the error, with the
    convergence flag of its three Sinkhorn solves returned instead (a study reports unconverged
    values rather than stopping)."""
    div, converged = _checked_divergence(x, y, a, b, epsilon, p, threshold, max_iterations, batch_size)
    return _wasserstein_of(div, p), converged


def exact_wasserstein(x, y, a=None, b=None, *, p: float = 2.0) -> float:
    r"""Exact W_p(μ, ν) for small empirical measures (host computation, not jit-able).

    Uniform weights with equal sizes: the optimal plan is a permutation (Birkhoff), found by
    ``scipy.optimize.linear_sum_assignment``. Otherwise the transport linear program is solved
    with HiGHS (``scipy.optimize.linprog``); keep n·m below ~10⁴.
    """
    from scipy.optimize import linear_sum_assignment, linprog

    x = np.asarray(check_points(x, "x"), dtype=np.float64)
    y = np.asarray(check_points(y, "y", x.shape[1]), dtype=np.float64)
    p = float(check_scalar(p, "p"))
    if not p >= 1:
        raise ValueError(f"p must be >= 1, got {p}")
    n, m = x.shape[0], y.shape[0]
    C = np.linalg.norm(x[:, None, :] - y[None, :, :], axis=-1) ** p
    if a is None and b is None and n == m:
        rows, cols = linear_sum_assignment(C)
        return float(np.mean(C[rows, cols]) ** (1.0 / p))
    a = np.asarray(check_weights(a, n, jnp.float64, "a"), dtype=np.float64)
    b = np.asarray(check_weights(b, m, jnp.float64, "b"), dtype=np.float64)
    # marginals: row sums = a, column sums = b (one equality is redundant; HiGHS copes)
    A_eq = np.concatenate([np.kron(np.eye(n), np.ones((1, m))), np.kron(np.ones((1, n)), np.eye(m))])
    res = linprog(C.ravel(), A_eq=A_eq, b_eq=np.concatenate([a, b]), bounds=(0, None),
                  method="highs")
    if not res.success:  # pragma: no cover - the LP is always feasible and bounded
        raise RuntimeError(f"transport linear program failed: {res.message}")
    return float(max(res.fun, 0.0) ** (1.0 / p))


def support_radius(x, weights=None) -> jax.Array:
    """R = max{|x_i| : w_i > 0}, the radius of the support of μ = Σ w_i δ_{x_i}
    (docs: math/attention.md#support-and-stability-bounds).

    ``x`` may carry leading time axes, ``(..., n, d)``; jit-able (usable in ``stats=``).
    """
    x = as_float_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., n, d) (tokens are rows), got shape {x.shape}")
    if is_concrete(x):
        check_finite(x, "x")
    r = jnp.linalg.norm(x, axis=-1)
    if weights is not None:
        w = check_weights_of(weights, x.dtype, x.shape[-2])
        r = jnp.where(w > 0, r, 0.0)
    R = jnp.max(r, axis=-1)
    if is_concrete(R):
        return R
    # under jit (stats=, per save): one O(1) check of the answer, not of every token
    return runtime_check(R, ~jnp.all(jnp.isfinite(R)), "x must be finite (a token of positive weight is NaN or inf)")


def stability_ratio(xs, ys, weights_x=None, weights_y=None, *, p: float = 2.0,
                    epsilon=None) -> np.ndarray:
    r"""W_p(μ_t, ν_t) / W_p(μ_0, ν_0) along two saved trajectories ``xs, ys`` of shape ``(T, n, d)``.

    Exact W_p (:func:`exact_wasserstein`) when ``epsilon`` is None, else the Sinkhorn estimate
    with that ε. Returns a NumPy array ``(T,)`` (first entry 1).
    """
    xs = np.asarray(check_finite(as_float_array(xs, "xs"), "xs"))
    ys = np.asarray(check_finite(as_float_array(ys, "ys"), "ys"))
    if xs.ndim != 3 or ys.ndim != 3 or xs.shape[0] != ys.shape[0]:
        raise ValueError(f"xs and ys must have shapes (T, n, d) and (T, m, d) with the same T, got "
                         f"{xs.shape} and {ys.shape}")
    if epsilon is None:
        w = np.array([exact_wasserstein(a, b, weights_x, weights_y, p=p) for a, b in zip(xs, ys)])
    else:
        w = np.array([float(sinkhorn_wasserstein(a, b, weights_x, weights_y, epsilon=epsilon, p=p))
                      for a, b in zip(xs, ys)])
    if not w[0] > 0:
        raise ValueError("the two initial measures coincide (W_p(μ_0, ν_0) = 0): no ratio")
    return w / w[0]


__all__ = [
    "bures_wasserstein",
    "exact_wasserstein",
    "sinkhorn_divergence",
    "sinkhorn_wasserstein",
    "sinkhorn_wasserstein_status",
    "stability_ratio",
    "support_radius",
]
