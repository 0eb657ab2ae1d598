r"""Closed forms of the Gaussian closure (docs: math/gaussian.md).

The moment ODEs themselves are written once, in
:meth:`transformer_pde.models.AbstractGaussianClosure.gaussian_velocity`; each variant gives its
affine field (J, c). Here: the closed-form solution for softmax with V = I
(docs: math/gaussian.md#long-time-behaviour) and its blow-up time, the references the closure and the solver are
tested against, and the Sinkhorn conditional covariance (docs: math/gaussian.md#moment-equations).
"""

from __future__ import annotations

import jax.numpy as jnp

from .._linalg import sqrtm_psd, symmetrize
from ..models.attention.sinkhorn import sinkhorn_conditional_cov


def identity_value_cov(cov0, A, t):
    r"""Closed form for softmax with V = I (docs: math/gaussian.md#long-time-behaviour): Σ' = Σ(A + Aᵀ)Σ, hence

    $$\Sigma(t)=\big(\Sigma_0^{-1}-t(A+A^\top)\big)^{-1},\qquad t < t^*.$$
    """
    B = A + A.T
    return symmetrize(jnp.linalg.inv(jnp.linalg.inv(cov0) - t * B))


def identity_value_blowup_time(cov0, A):
    r"""Blow-up time of softmax with V = I (docs: math/gaussian.md#long-time-behaviour):

    $$t^*=1/\lambda_{\max}\big(\Sigma_0^{1/2}(A+A^\top)\Sigma_0^{1/2}\big),$$

    ``inf`` when A + Aᵀ ⪯ 0 (no blow-up: Σ converges, to a matrix of rank dim ker(A + Aᵀ)).
    """
    R = sqrtm_psd(cov0)
    lam = jnp.linalg.eigvalsh(symmetrize(R @ (A + A.T) @ R))[-1]
    return jnp.where(lam > 0, 1.0 / jnp.where(lam > 0, lam, 1.0), jnp.inf)


__all__ = ["identity_value_blowup_time", "identity_value_cov", "sinkhorn_conditional_cov"]
