"""Softmax and multi-head attention (euclidean.md §2a–b; sphere.md §1 "General SA")."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import as_float_array, check_block_size, check_scalar, is_concrete
from ..._types import Param
from ...kernels import softmax_average
from ...params import as_param, evaluate, param_shape
from .base import (
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractNormalizedAttention,
    bilinear_fields,
    log_weights,
    scalar_param,
)


class SoftmaxAttention(AbstractBilinearAttention, AbstractNormalizedAttention, AbstractGaussianClosure):
    r"""Softmax self-attention (euclidean.md §2a):

    $$\Gamma_\mu(x)=\frac{\int e^{\beta\langle Qx,Ky\rangle}\,Vy\,d\mu(y)}
    {\int e^{\beta\langle Qx,Ky\rangle}\,d\mu(y)}.$$

    Args:
        Q, K: shape ``(k, d)``, or callables ``t -> (k, d)`` (time-dependent weights).
        V: shape ``(d, d)``, or a callable.
        beta: inverse temperature β (scores are β⟨Qx, Ky⟩ = β yᵀ A x with A = KᵀQ).
        causal: token i attends to tokens j <= i in their given order (euclidean.md §2f).
        alibi: λ >= 0, ALiBi-type position weights e^{−λ(i−j)/N} of causal attention
            (sphere.md §4, CSA): after the per-row constant −λi/N cancels in the softmax, a
            per-key bias +λj/N, so the model streams and shards like any causal attention.
            Needs ``causal=True``.
        include_self: with ``causal=True``, False masks j < i (the LitM model): the first
            token then sees no key and does not move.
        block_size: kernel path, see :func:`transformer_pde.kernels.lse_average`.

    Many papers use A = KᵀQ/√d: pass ``Q / sqrt(d)`` (sphere.md §9). Token weights are the
    masses of the causal measure too (uniform: the authors' CSA).
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    alibi: jax.Array
    causal: bool = eqx.field(static=True)
    include_self: bool = eqx.field(static=True)
    block_size: int | None = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, causal: bool = False, alibi=0.0, include_self: bool = True,
                 block_size: int | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta, self.causal, self.block_size = bilinear_fields(
            name, Q, K, V, beta, causal, block_size)
        check_scalar(alibi, f"{name}.alibi", nonnegative=True)
        if not self.causal and (not include_self or is_concrete(alibi) and float(alibi) != 0):
            raise ValueError(f"{name}: alibi={alibi} and include_self={include_self} are position "
                             "weights of causal attention; pass causal=True")
        self.alibi = scalar_param(alibi)
        self.include_self = bool(include_self)

    def _field(self, queries, x, weights, t, query_offset=0):
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        # Average the tokens and apply V after: Σ p_ij V x_j = V Σ p_ij x_j. With Q, K of
        # full rank (k >= d), fold them too: β⟨Q q_i, K x_j⟩ = ⟨q_i, β QᵀK x_j⟩. Only one
        # (n, d) projection is then held next to the output, instead of three.
        if Q.shape[0] >= Q.shape[1]:
            q, k = queries, self.beta * (x @ (K.T @ Q))
        else:
            q, k = self.beta * (queries @ Q.T), x @ K.T
        bias = log_weights(weights)
        if self.causal:
            # ALiBi: e^{−λ(i−j)/N} = e^{−λi/N} e^{λj/N}; the first factor cancels in the softmax
            bias = bias + self.alibi * jnp.arange(x.shape[0], dtype=x.dtype) / x.shape[0]
            if not self.include_self:
                query_offset = query_offset - 1  # query i sees keys j <= i - 1
        avg = softmax_average(q, k, x, bias, causal=self.causal, query_offset=query_offset,
                              block_size=self.block_size)
        return avg @ V.T

    def _affine_field(self, mean, cov, t):
        r"""Softmax (euclidean.md §4a): Γ(x) = V(α + ΣAx), so J = VΣA, c = Vα and

        $$\dot\alpha=V(I+\Sigma A)\alpha,\qquad\dot\Sigma=V\Sigma A\Sigma+\Sigma A^\top\Sigma V^\top.$$
        """
        V = evaluate(self.V, t)
        return V @ cov @ self.score_matrix(t), V @ mean


class MultiHeadAttention(AbstractNormalizedAttention, AbstractGaussianClosure):
    r"""Multi-head attention (euclidean.md §2b):

    $$\Gamma_\mu(x)=\sum_{h=1}^H W_h\,\frac{\int e^{\beta\langle Q_hx,K_hy\rangle}\,V_hy\,d\mu(y)}
    {\int e^{\beta\langle Q_hx,K_hy\rangle}\,d\mu(y)}.$$

    Args:
        Q, K: shape ``(H, k, d)``.
        V: shape ``(H, k, d)`` (head values V_h: R^d -> R^k).
        W: shape ``(H, d, k)`` (output maps W_h: R^k -> R^d).
        beta: inverse temperature.
        causal: causal masking, as in :class:`SoftmaxAttention`.
    """

    Q: Param
    K: Param
    V: Param
    W: Param
    beta: jax.Array
    causal: bool = eqx.field(static=True)
    block_size: int | None = eqx.field(static=True)

    def __init__(self, Q, K, V, W, beta=1.0, *, causal: bool = False, block_size: int | None = None):
        name = type(self).__name__
        self.Q, self.K = as_param(Q, f"{name}.Q"), as_param(K, f"{name}.K")
        self.V, self.W = as_param(V, f"{name}.V"), as_param(W, f"{name}.W")
        sq, sk, sv, sw = (param_shape(p) for p in (self.Q, self.K, self.V, self.W))
        if len(sq) != 3 or sq != sk:
            raise ValueError(f"{name}: Q and K must both have shape (H, k, d), got Q {sq} and K {sk}")
        H, _, d = sq
        if len(sv) != 3 or sv[0] != H or sv[2] != d:
            raise ValueError(f"{name}: V must have shape (H, k_v, d) = ({H}, k_v, {d}), got {sv}")
        if sw != (H, d, sv[1]):
            raise ValueError(f"{name}: W must have shape (H, d, k_v) = ({H}, {d}, {sv[1]}), got {sw}")
        check_scalar(beta, f"{name}.beta")
        self.beta = scalar_param(beta)
        self.causal = bool(causal)
        self.block_size = check_block_size(block_size, f"{type(self).__name__}.block_size")

    @classmethod
    def split(cls, Q, K, V, num_heads: int, beta=1.0, **kwargs):
        """Split d x d matrices into ``num_heads`` row blocks, W_h = h-th column block of I_d.

        This is the authors' ``rhs_multihead`` construction (euclidean.md §2b).
        """
        Q, K, V = (as_float_array(a, name) for a, name in ((Q, "Q"), (K, "K"), (V, "V")))
        d = V.shape[0]
        if Q.shape != (d, d) or K.shape != (d, d) or V.shape != (d, d):
            raise ValueError(f"split needs square (d, d) Q, K, V, got {Q.shape}, {K.shape}, {V.shape}")
        if num_heads < 1 or d % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d={d}")
        k = d // num_heads
        blocks = lambda a: a.reshape(num_heads, k, d)  # noqa: E731 - row blocks
        W = jnp.eye(d, dtype=V.dtype).reshape(d, num_heads, k).transpose(1, 0, 2)
        return cls(blocks(Q), blocks(K), blocks(V), W, beta, **kwargs)

    @property
    def num_heads(self) -> int:
        return param_shape(self.Q)[0]

    @property
    def dim(self):
        return param_shape(self.Q)[-1]

    def _field(self, queries, x, weights, t, query_offset=0):
        Q, K, V, W = (evaluate(p, t) for p in (self.Q, self.K, self.V, self.W))
        logw = log_weights(weights)

        def head(Qh, Kh, Vh, Wh):
            avg = softmax_average(self.beta * (queries @ Qh.T), x @ Kh.T, x @ Vh.T, logw,
                                  causal=self.causal, query_offset=query_offset,
                                  block_size=self.block_size)
            return avg @ Wh.T

        return jnp.sum(jax.vmap(head)(Q, K, V, W), axis=0)

    def score_matrix(self, t=0.0):
        """The stack A_h = β K_hᵀQ_h, shape ``(H, d, d)``."""
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        return self.beta * jnp.einsum("hkd,hke->hde", K, Q)

    def value_norm(self, t=0.0):
        WV = jnp.einsum("hdk,hke->hde", evaluate(self.W, t), evaluate(self.V, t))
        return jnp.sum(jnp.linalg.norm(WV, ord=2, axis=(-2, -1)))

    def _affine_field(self, mean, cov, t):
        r"""Multi-head (euclidean.md §4b): Γ(x) = Σ_h W_hV_h(α + ΣA_hx), so
        J = Σ_h W_hV_hΣA_h and c = Σ_h W_hV_hα."""
        WV = jnp.einsum("hdk,hke->hde", evaluate(self.W, t), evaluate(self.V, t))
        return (jnp.einsum("hde,ef,hfg->dg", WV, cov, self.score_matrix(t)),
                jnp.einsum("hde,e->d", WV, mean))
