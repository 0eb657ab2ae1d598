r"""The Gaussian closure: exact moment ODEs for Gaussian data (euclidean.md §4).

If the field of μ = N(α, Σ) is affine, Γ_μ(x) = Jx + c, the measure stays Gaussian and

$$\dot\alpha = J\alpha + c = \Gamma_\mu(\alpha),\qquad \dot\Sigma = J\Sigma + \Sigma J^\top$$

(euclidean.md §4, "Mechanism"). Each ``*_moments`` function returns ``(dα/dt, dΣ/dt)``
with dΣ/dt exactly symmetric, so every Runge–Kutta combination keeps Σ exactly symmetric.

Score convention (spec README): s(x, y) = β⟨Qx, Ky⟩ = yᵀAx with **A = β KᵀQ**, x the
query; for Sinkhorn Ã = A/ε = β KᵀQ/ε.

Also here: the closed form for V = I (euclidean.md §5.1) and its blow-up time, the
references the closure and the solver are tested against.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .params import evaluate


def symmetrize(m):
    """(M + Mᵀ)/2 over the last two axes."""
    return 0.5 * (m + jnp.swapaxes(m, -1, -2))


def _no_causal(attn):
    # euclidean.md §4f: with position-dependent data the causal field restricted to [0, s] is
    # a Gaussian mixture, not affine. Features independent of position reduce to causal=False.
    if getattr(attn, "causal", False):
        raise NotImplementedError(
            f"{type(attn).__name__}(causal=True) has no Gaussian closure: the field of token s "
            "averages over the tokens before s, and for Gaussian data with position-dependent "
            "law that restriction is a Gaussian mixture, so the field is not affine "
            "(euclidean.md §4f). When features are independent of position, "
            "μ0 = Unif[0,1] ⊗ N(α, Σ), the causal dynamics equal the non-causal ones: "
            "use causal=False.")


def score_matrix(attn, t=0.0):
    """A = β KᵀQ (so s(x, y) = yᵀAx) for softmax, ℓ² and Sinkhorn attention at time t.

    For multi-head attention returns the stack A_h = β K_hᵀQ_h, shape ``(H, d, d)``.
    """
    Q, K = evaluate(attn.Q, t), evaluate(attn.K, t)
    if Q.ndim == 3:
        return attn.beta * jnp.einsum("hkd,hke->hde", K, Q)
    return attn.beta * (K.T @ Q)


def softmax_moments(attn, mean, cov, t=0.0):
    r"""Softmax (euclidean.md §4a): Γ(x) = V(α + ΣAx), so

    $$\dot\alpha=V(I+\Sigma A)\alpha,\qquad\dot\Sigma=V\Sigma A\Sigma+\Sigma A^\top\Sigma V^\top.$$
    """
    _no_causal(attn)
    V = evaluate(attn.V, t)
    A = score_matrix(attn, t)
    dmean = V @ (mean + cov @ (A @ mean))
    M = V @ cov @ A @ cov
    return dmean, symmetrize(M + M.T)


def multihead_moments(attn, mean, cov, t=0.0):
    r"""Multi-head (euclidean.md §4b): Γ(x) = Σ_h W_hV_h(α + ΣA_hx), A_h = βK_hᵀQ_h, so

    $$\dot\alpha=\sum_hW_hV_h(I+\Sigma A_h)\alpha,\qquad
    \dot\Sigma=\sum_h W_hV_h\Sigma A_h\Sigma+(\cdot)^\top.$$
    """
    _no_causal(attn)
    V, W = evaluate(attn.V, t), evaluate(attn.W, t)
    A = score_matrix(attn, t)

    def head(Ah, Vh, Wh):
        WV = Wh @ Vh
        return WV @ (mean + cov @ (Ah @ mean)), WV @ cov @ Ah @ cov

    dm, M = jax.vmap(head)(A, V, W)
    M = jnp.sum(M, axis=0)
    return jnp.sum(dm, axis=0), symmetrize(M + M.T)


def l2_moments(attn, mean, cov, t=0.0):
    r"""ℓ² attention (euclidean.md §4c) with kernel e^{-β|Qx-Ky|²}. The key law tilted by the
    kernel has precision Σ⁻¹ + 2βKᵀK, so with M = I + 2βΣKᵀK

    $$\Gamma(x)=VM^{-1}(\alpha+2\beta\Sigma K^\top Qx),\qquad J = 2\beta VM^{-1}\Sigma K^\top Q,$$
    $$\dot\alpha = VM^{-1}(I+2\beta\Sigma K^\top Q)\alpha,\qquad \dot\Sigma=J\Sigma+\Sigma J^\top.$$
    """
    _no_causal(attn)
    Q, K, V = (evaluate(p, t) for p in (attn.Q, attn.K, attn.V))
    d = mean.shape[0]
    M = jnp.eye(d, dtype=cov.dtype) + 2.0 * attn.beta * cov @ (K.T @ K)
    # one factorization for both right-hand sides
    sol = jnp.linalg.solve(M, jnp.concatenate([2.0 * attn.beta * cov @ (K.T @ Q), mean[:, None]], 1))
    J = V @ sol[:, :d]
    c = V @ sol[:, d]
    JS = J @ cov
    return J @ mean + c, symmetrize(JS + JS.T)


def sqrtm_psd(S):
    """Symmetric square root of a positive semi-definite matrix (eigh; negative rounding clipped).
    Leading axes are batch axes."""
    lam, U = jnp.linalg.eigh(symmetrize(S))
    return (U * jnp.sqrt(jnp.clip(lam, 0.0))[..., None, :]) @ jnp.swapaxes(U, -1, -2)


def sinkhorn_conditional_cov(cov, At):
    r"""P ≻ 0 solving P + PÃΣÃᵀP = Σ (euclidean.md §4d), in the form with no inverse of Ã:

    $$P=2\,\Sigma^{1/2}\big(I+(I+4\Sigma^{1/2}\tilde A\Sigma\tilde A^\top\Sigma^{1/2})^{1/2}\big)^{-1}\Sigma^{1/2}.$$

    P is the covariance of y | x under the entropic self-coupling of N(α, Σ).
    """
    d = cov.shape[0]
    eye = jnp.eye(d, dtype=cov.dtype)
    R = sqrtm_psd(cov)
    inner = sqrtm_psd(eye + 4.0 * R @ At @ cov @ At.T @ R)
    return symmetrize(2.0 * R @ jnp.linalg.solve(eye + inner, R))


def sinkhorn_moments(attn, mean, cov, t=0.0):
    r"""Sinkhorn attention (euclidean.md §4d) with Ã = βKᵀQ/ε: y | x ~ N(α + PÃ(x − α), P), so

    $$\Gamma(x)=V(\alpha+P\tilde A(x-\alpha)),\qquad\dot\alpha=V\alpha,\qquad
    \dot\Sigma=VP\tilde A\Sigma+\Sigma\tilde A^\top PV^\top.$$

    Valid for every A (singular included) and every ε > 0.
    """
    V = evaluate(attn.V, t)
    At = score_matrix(attn, t) / attn.epsilon
    P = sinkhorn_conditional_cov(cov, At)
    M = V @ P @ At @ cov
    return V @ mean, symmetrize(M + M.T)


def affine_field(attn, mean, cov, t=0.0):
    """(J, c) with Γ_{N(mean, cov)}(x) = Jx + c, the affine field of euclidean.md §4.

    Used to check the closure pointwise against the particle field.
    """
    from .attention import (
        L2Attention,
        MultiHeadAttention,
        SinkhornAttention,
        SoftmaxAttention,
    )

    d = mean.shape[0]
    if isinstance(attn, SoftmaxAttention):
        _no_causal(attn)
        V, A = evaluate(attn.V, t), score_matrix(attn, t)
        return V @ cov @ A, V @ mean
    if isinstance(attn, MultiHeadAttention):
        _no_causal(attn)
        V, W, A = evaluate(attn.V, t), evaluate(attn.W, t), score_matrix(attn, t)
        WV = jnp.einsum("hdk,hke->hde", W, V)
        return jnp.einsum("hde,ef,hfg->dg", WV, cov, A), jnp.einsum("hde,e->d", WV, mean)
    if isinstance(attn, L2Attention):
        _no_causal(attn)
        Q, K, V = (evaluate(p, t) for p in (attn.Q, attn.K, attn.V))
        M = jnp.eye(d, dtype=cov.dtype) + 2.0 * attn.beta * cov @ (K.T @ K)
        return (V @ jnp.linalg.solve(M, 2.0 * attn.beta * cov @ (K.T @ Q)),
                V @ jnp.linalg.solve(M, mean))
    if isinstance(attn, SinkhornAttention):
        V = evaluate(attn.V, t)
        At = score_matrix(attn, t) / attn.epsilon
        J = V @ sinkhorn_conditional_cov(cov, At) @ At
        return J, V @ mean - J @ mean
    # the attention's own error says why there is no closure
    if hasattr(attn, "gaussian_velocity"):
        attn.gaussian_velocity(mean, cov, t)
    raise NotImplementedError(f"{type(attn).__name__} has no affine Gaussian field")


def identity_value_cov(cov0, A, t):
    r"""Closed form for softmax with V = I (euclidean.md §5.1): Σ' = Σ(A + Aᵀ)Σ, hence

    $$\Sigma(t)=\big(\Sigma_0^{-1}-t(A+A^\top)\big)^{-1},\qquad t < t^*.$$
    """
    B = A + A.T
    return symmetrize(jnp.linalg.inv(jnp.linalg.inv(cov0) - t * B))


def identity_value_blowup_time(cov0, A):
    r"""Blow-up time of softmax with V = I (euclidean.md §5.1):

    $$t^*=1/\lambda_{\max}\big(\Sigma_0^{1/2}(A+A^\top)\Sigma_0^{1/2}\big),$$

    ``inf`` when A + Aᵀ ⪯ 0 (no blow-up: Σ converges, to a matrix of rank dim ker(A + Aᵀ)).
    """
    R = sqrtm_psd(cov0)
    lam = jnp.linalg.eigvalsh(symmetrize(R @ (A + A.T) @ R))[-1]
    return jnp.where(lam > 0, 1.0 / jnp.where(lam > 0, lam, 1.0), jnp.inf)


__all__ = [
    "affine_field",
    "identity_value_blowup_time",
    "identity_value_cov",
    "l2_moments",
    "multihead_moments",
    "score_matrix",
    "sinkhorn_conditional_cov",
    "sinkhorn_moments",
    "softmax_moments",
    "sqrtm_psd",
    "symmetrize",
]
