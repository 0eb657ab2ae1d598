r"""Closed forms of the Gaussian closure (docs: math/gaussian.md).

The moment ODEs themselves are written once, in
:meth:`transformer_pde.models.AbstractGaussianClosure.gaussian_velocity`; each variant gives its
affine field (J, c). Here: the closed-form solution for softmax with V = I
(docs: math/gaussian.md#long-time-behaviour) and its blow-up time, the references the closure and the solver are
tested against, and the Sinkhorn conditional covariance (docs: math/gaussian.md#moment-equations).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_covariance, check_int, check_scalar, is_concrete
from .._linalg import sqrtm_psd, symmetrize
from ..models.attention.sinkhorn import sinkhorn_conditional_cov


def _check_matrices(cov0, A, definite: bool = True):
    """Concrete cov0 and A (traced ones are the caller's): square (d, d), finite; cov0 symmetric
    (to 4√eps) and positive definite (``definite``) or semi-definite."""
    for name, M in (("cov0", cov0), ("A", A)):
        if not is_concrete(M):
            continue
        a = np.asarray(M)
        if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
            raise ValueError(f"{name} must be a real matrix, got dtype {a.dtype}")
        if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape != np.shape(cov0):
            raise ValueError(f"{name} must be a square (d, d) matrix matching cov0 {np.shape(cov0)}, got shape {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"{name} must be finite, got {a!r}")
        if name == "cov0":
            check_covariance(a, "cov0", definite=definite)


def identity_value_cov(cov0, A, t):
    r"""Closed form for softmax with V = I (docs: math/gaussian.md#long-time-behaviour): Σ' = Σ(A + Aᵀ)Σ, hence

    $$\Sigma(t)=\big(\Sigma_0^{-1}-t(A+A^\top)\big)^{-1},\qquad t < t^*.$$
    """
    _check_matrices(cov0, A)
    if is_concrete(t):
        check_scalar(t, "t")
    B = A + A.T
    return symmetrize(jnp.linalg.inv(jnp.linalg.inv(cov0) - t * B))


def identity_value_blowup_time(cov0, A):
    r"""Blow-up time of softmax with V = I (docs: math/gaussian.md#long-time-behaviour):

    $$t^*=1/\lambda_{\max}\big(\Sigma_0^{1/2}(A+A^\top)\Sigma_0^{1/2}\big),$$

    ``inf`` when A + Aᵀ ⪯ 0 (no blow-up: Σ converges, to a matrix of rank dim ker(A + Aᵀ)).
    """
    _check_matrices(cov0, A, definite=False)
    R = sqrtm_psd(cov0)
    lam = jnp.linalg.eigvalsh(symmetrize(R @ (A + A.T) @ R))[-1]
    return jnp.where(lam > 0, 1.0 / jnp.where(lam > 0, lam, 1.0), jnp.inf)


def low_rank_distance(cov, rank: int):
    r"""The W₂ distance from N(m, Σ) to the nearest Gaussian whose covariance has rank <= r
    (docs: math/gaussian.md#the-rank-is-an-invariant):

    $$\min_{m',\ \mathrm{rank}\,\Sigma'\le r} W_2ig(\mathcal N(m', \Sigma'), \mathcal N(m, \Sigma)ig)
    = \Big(\sum_{i>r}\lambda_i(\Sigma)\Big)^{1/2},$$

    λ₁ >= ... >= λ_d the eigenvalues of Σ: a Gaussian of rank r lives on an affine r-plane S,
    every coupling has E|X − Y|² >= E dist(Y, S)², at least the sum of the d − r smallest
    eigenvalues (Ky Fan), with equality for the projection of Y onto its top r principal axes.
    The moment flow keeps the rank (Σ(t) = M(t)Σ₀M(t)ᵀ), so from a start of rank r no control
    comes closer than this to a target N(m, Σ) of higher rank. 0 when r >= rank Σ.

    Args:
        cov: ``(d, d)``, symmetric positive semi-definite.
        rank: r, an integer in [0, d].
    """
    cov = as_float_array(cov, "cov")
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"cov must be a square (d, d) matrix, got shape {cov.shape}")
    cov = check_covariance(cov, "cov")
    d = cov.shape[0]
    rank = check_int(rank, "rank", minimum=0, maximum=d)
    lam = jnp.linalg.eigvalsh(symmetrize(cov))  # ascending: the d - r smallest come first
    return jnp.sqrt(jnp.sum(jnp.clip(lam[: d - rank], 0.0)))


__all__ = ["identity_value_blowup_time", "identity_value_cov", "low_rank_distance", "sinkhorn_conditional_cov"]
