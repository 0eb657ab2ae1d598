"""The Gaussian closure: exact moment ODEs for Gaussian data (euclidean.md §4).

If the field is affine for μ = N(α, Σ), Γ_μ(x) = Jx + c, the measure stays Gaussian and
α' = Jα + c, Σ' = JΣ + ΣJᵀ. Each function returns ``(dα/dt, dΣ/dt)`` with Σ' symmetric.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .params import evaluate


def _sym(m):
    return 0.5 * (m + m.T)


def _A(attn, Q, K):
    """A = β KᵀQ (scores ⟨βQx, Ky⟩ = yᵀ A x)."""
    return attn.beta * (K.T @ Q)


def softmax_moments(attn, mean, cov, t=0.0):
    """Softmax (euclidean.md §4a): α' = V(I + ΣA)α, Σ' = VΣAΣ + ΣAᵀΣVᵀ."""
    Q, K, V = (evaluate(p, t) for p in (attn.Q, attn.K, attn.V))
    A = _A(attn, Q, K)
    dmean = V @ (mean + cov @ (A @ mean))
    M = V @ cov @ A @ cov
    return dmean, _sym(M + M.T)


def multihead_moments(attn, mean, cov, t=0.0):
    """Multi-head (euclidean.md §4b): the sum over heads of W_h V_h times the softmax terms."""
    Q, K, V, W = (evaluate(p, t) for p in (attn.Q, attn.K, attn.V, attn.W))

    def head(Qh, Kh, Vh, Wh):
        A = attn.beta * (Kh.T @ Qh)
        WV = Wh @ Vh
        return WV @ (mean + cov @ (A @ mean)), WV @ cov @ A @ cov

    dm, M = jax.vmap(head)(Q, K, V, W)
    M = jnp.sum(M, axis=0)
    return jnp.sum(dm, axis=0), _sym(M + M.T)


def l2_moments(attn, mean, cov, t=0.0):
    """ℓ² (euclidean.md §4c) with kernel e^{-β|Qx-Ky|²}:
    J = V(I + 2βΣKᵀK)⁻¹ 2βΣKᵀQ, c = V(I + 2βΣKᵀK)⁻¹α."""
    Q, K, V = (evaluate(p, t) for p in (attn.Q, attn.K, attn.V))
    d = mean.shape[0]
    M = jnp.eye(d, dtype=cov.dtype) + 2.0 * attn.beta * cov @ (K.T @ K)
    J = V @ jnp.linalg.solve(M, 2.0 * attn.beta * cov @ (K.T @ Q))
    c = V @ jnp.linalg.solve(M, mean)
    JS = J @ cov
    return J @ mean + c, _sym(JS + JS.T)


def _sqrtm_psd(S):
    lam, U = jnp.linalg.eigh(_sym(S))
    return (U * jnp.sqrt(jnp.clip(lam, 0.0))) @ U.T


def sinkhorn_conditional_cov(cov, At):
    """P ≻ 0 solving P + P Ã Σ Ãᵀ P = Σ (euclidean.md §4d), in the form with no inverse of Ã:
    P = 2 Σ^{1/2} (I + (I + 4 Σ^{1/2} Ã Σ Ãᵀ Σ^{1/2})^{1/2})⁻¹ Σ^{1/2}."""
    d = cov.shape[0]
    eye = jnp.eye(d, dtype=cov.dtype)
    R = _sqrtm_psd(cov)
    inner = _sqrtm_psd(eye + 4.0 * R @ At @ cov @ At.T @ R)
    return _sym(2.0 * R @ jnp.linalg.solve(eye + inner, R))


def sinkhorn_moments(attn, mean, cov, t=0.0):
    """Sinkhorn (euclidean.md §4d): α' = Vα, Σ' = V P Ã Σ + Σ Ãᵀ P Vᵀ with Ã = βKᵀQ/ε."""
    Q, K, V = (evaluate(p, t) for p in (attn.Q, attn.K, attn.V))
    At = _A(attn, Q, K) / attn.epsilon
    P = sinkhorn_conditional_cov(cov, At)
    M = V @ P @ At @ cov
    return V @ mean, _sym(M + M.T)
