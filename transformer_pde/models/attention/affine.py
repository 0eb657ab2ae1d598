r"""An attention with an affine feed-forward, and the moment ODEs of a degenerate Gaussian
(Alcalde–Ji–Zuazua, arXiv 2606.07600; docs: math/gaussian.md#control-of-gaussians).

:class:`AffineFeedForward` is the mean-field Transformer of the paper: ẋ = Γ_μ(x) + Wx + b, the
attention and an affine feed-forward in parallel (the h → 0 limit of ``tp.Block(attn, mlp, h)``
with an affine MLP). For a Gaussian μ = N(α, Σ) an attention with a Gaussian closure has an
affine field Jx + c, so the sum is affine, (J + W)x + (c + b): Gaussians stay Gaussian, and with
(Q, K, V, W, b) as controls the moments follow a bilinear control system.

:class:`GaussianFactorFlow` integrates those moment ODEs in factor form, Σ = FFᵀ with F of r
columns, Ḟ = JF, α̇ = Jα + c: for a Gaussian of rank r < d, which ``tp.Gaussian`` refuses (its
samples and densities need Σ⁻¹). The rank of F, hence of Σ, is kept at every finite time
(F(t) = M(t)F(0) with M the fundamental matrix of J).
"""

from __future__ import annotations

import jax.numpy as jnp

from ..._types import Param
from ...params import as_param, evaluate, param_shape
from ..base import AbstractDynamics
from .base import AbstractGaussianClosure


class AffineFeedForward(AbstractGaussianClosure):
    r"""An attention and an affine feed-forward in parallel: ẋ = Γ_μ(x) + W(t)x + b(t).

    Args:
        attention: an attention with a Gaussian closure (softmax, multi-head, ℓ², Sinkhorn:
            :class:`~transformer_pde.models.AbstractGaussianClosure`).
        W: shape ``(d, d)``, or a callable ``t -> (d, d)`` (per-layer weights,
            :class:`~transformer_pde.PiecewiseConstant`).
        b: shape ``(d,)``, or a callable.

    For a Gaussian, Γ_{N(α, Σ)}(x) = Jx + c gives the field (J + W)x + c + b
    (:meth:`affine_field`), so ``tp.solve(AffineFeedForward(...), tp.Gaussian(...), ...)``
    integrates the moment ODEs, and ``tp.solve(..., tp.Particles(x))`` the tokens.

    Example:
        ```python
        import jax.numpy as jnp, transformer_pde as tp

        attn = tp.SoftmaxAttention.identity(d=2, beta=0.5)
        model = tp.AffineFeedForward(attn, W=-0.5 * jnp.eye(2), b=jnp.ones(2))
        sol = tp.solve(model, tp.Gaussian(jnp.zeros(2), jnp.eye(2)), t1=1.0, dt0=0.1)
        sol.covs.shape                                          # (1, 2, 2)
        ```
    """

    attention: AbstractGaussianClosure
    W: Param
    b: Param

    def __init__(self, attention, W, b):
        if not isinstance(attention, AbstractGaussianClosure):
            raise ValueError(f"AffineFeedForward.attention must be an attention with a Gaussian closure "
                             f"(softmax, multi-head, L2, Sinkhorn), got {type(attention).__name__}")
        self.attention = attention
        self.W, self.b = as_param(W, "AffineFeedForward.W"), as_param(b, "AffineFeedForward.b")
        sw, sb = param_shape(self.W), param_shape(self.b)
        d = attention.dim
        if len(sw) != 2 or sw[0] != sw[1] or (d is not None and sw[0] != d):
            raise ValueError(f"AffineFeedForward.W must have shape (d, d) with d = {d} (the attention's), "
                             f"got {sw}")
        if sb != sw[:1]:
            raise ValueError(f"AffineFeedForward.b must have shape ({sw[0]},) to match W, got {sb}")

    @property
    def dim(self):
        return param_shape(self.W)[0]

    def query_field(self, queries, x, weights, t, query_offset=0):
        W, b = evaluate(self.W, t), evaluate(self.b, t)
        return self.attention.query_field(queries, x, weights, t) + queries @ W.T + b[None, :]

    def divergence(self, queries, x, weights, t):
        """div Γ_μ + tr W (the attention's own divergence, closed form where it has one)."""
        return self.attention.divergence(queries, x, weights, t) + jnp.trace(evaluate(self.W, t))

    def affine_field(self, mean, cov, t=0.0):
        J, c = self.attention.affine_field(mean, cov, t)
        return J + evaluate(self.W, t), c + evaluate(self.b, t)


class GaussianFactorFlow(AbstractDynamics):
    r"""The moment ODEs of a Gaussian closure in factor form, as r + 1 tokens: token 0 is the
    mean α, tokens 1..r the columns f_k of F with Σ = FFᵀ = Σ_k f_k f_kᵀ; with (J, c) the closure's
    affine field of N(α, Σ) (module docstring),

    $$\dot\alpha = J\alpha + c,\qquad \dot f_k = Jf_k .$$

    Args:
        closure: a dynamics with a Gaussian closure (an attention, :class:`AffineFeedForward`).

    ``tp.solve(GaussianFactorFlow(closure), tp.Particles(jnp.vstack([mean, F.T])), ...)``: the
    token weights play no part. Σ = FFᵀ has the rank of F at every finite time, so a degenerate
    Gaussian (rank r < d, which ``tp.Gaussian`` refuses) is a state; for r = d it is the same
    flow as ``tp.solve(closure, tp.Gaussian(α, FFᵀ))`` (tests/models/test_affine.py).
    """

    closure: AbstractGaussianClosure

    def __init__(self, closure):
        if not isinstance(closure, AbstractGaussianClosure):
            raise ValueError(f"GaussianFactorFlow.closure must be a dynamics with a Gaussian closure, got "
                             f"{type(closure).__name__}")
        self.closure = closure

    @property
    def dim(self):
        return self.closure.dim

    def check_state(self, x, name: str = "x"):
        x = super().check_state(x, name)
        if x.shape[0] < 2:
            raise ValueError(f"{name}: GaussianFactorFlow needs the mean and at least one factor column "
                             f"(>= 2 tokens), got {x.shape[0]}")
        return x

    def vector_field(self, x, weights, t):
        mean, F = x[0], x[1:]  # F holds the columns f_k as rows
        J, c = self.closure.affine_field(mean, F.T @ F, t)
        return jnp.concatenate([(J @ mean + c)[None, :], F @ J.T], axis=0)

