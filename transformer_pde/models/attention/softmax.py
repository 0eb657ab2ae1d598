"""Softmax and multi-head attention (euclidean.md §2a–b; sphere.md §1 "General SA")."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import as_float_array, check_scalar, is_concrete
from ..._types import Param
from ...kernels.backends import AbstractBackend, bind_backend
from ...kernels.exact import log_weights
from ...kernels.reduction import SoftmaxReduction
from ...params import as_param, evaluate, param_shape, scalar_param
from .base import (
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractNormalizedAttention,
    bilinear_fields,
)


class SoftmaxAttention(AbstractBilinearAttention, AbstractKernelAttention, AbstractNormalizedAttention,
                       AbstractGaussianClosure):
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
        backend: how the reduction is computed (:mod:`transformer_pde.kernels.backends`):
            ``tp.kernels.Exact()`` (default; ``Exact(tp.kernels.Streaming(key_block))`` sets its
            blocks), ``Fast(tol, radius)`` or ``Auto(tol, radius)``, the NUFFT Gaussian sum for
            Q, K of shape (k, d) with k <= 3, non-causal.

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
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, causal: bool = False, alibi=0.0, include_self: bool = True,
                 backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta, self.causal = bilinear_fields(name, Q, K, V, beta, causal)
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta,
                                    causal=self.causal)
        check_scalar(alibi, f"{name}.alibi", nonnegative=True)
        if not self.causal and (not include_self or is_concrete(alibi) and float(alibi) != 0):
            raise ValueError(f"{name}: alibi={alibi} and include_self={include_self} are position "
                             "weights of causal attention; pass causal=True")
        self.alibi = scalar_param(alibi)
        self.include_self = bool(include_self)

    def _value_width(self):
        return self.dim

    def _reduction(self, queries, x, weights, t, query_offset=0):
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        bias = log_weights(weights)
        if self.causal:
            # ALiBi: e^{−λ(i−j)/N} = e^{−λi/N} e^{λj/N}; the first factor cancels in the softmax
            bias = bias + self.alibi * jnp.arange(x.shape[0], dtype=x.dtype) / x.shape[0]
            if not self.include_self:
                query_offset = query_offset - 1  # query i sees keys j <= i - 1
        # With Q, K of full rank (k >= d) the exact kernel folds them: β⟨Q q_i, K x_j⟩ =
        # ⟨q_i, β QᵀK x_j⟩, so only one (n, d) projection is held next to the output.
        folded = (queries, self.beta * (x @ (K.T @ Q))) if Q.shape[0] >= Q.shape[1] else None
        return SoftmaxReduction(queries @ Q.T, x @ K.T, x, bias, self.beta, x.dtype,
                                exact_scores=folded, causal=self.causal, query_offset=query_offset)

    def _reductions(self, queries, x, weights, t):
        return [self._reduction(queries, x, weights, t)]

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        # Average the tokens and apply V after: Σ p_ij V x_j = V Σ p_ij x_j
        red = self._reduction(queries, x, weights, t, query_offset)
        avg, _ = self.backend.lse_average(red, axis_name=axis_name)
        return avg @ evaluate(self.V, t).T

    def _affine_field(self, mean, cov, t):
        r"""Softmax (euclidean.md §4a): Γ(x) = V(α + ΣAx), so J = VΣA, c = Vα and

        $$\dot\alpha=V(I+\Sigma A)\alpha,\qquad\dot\Sigma=V\Sigma A\Sigma+\Sigma A^\top\Sigma V^\top.$$
        """
        V = evaluate(self.V, t)
        return V @ cov @ self.score_matrix(t), V @ mean


class MultiHeadAttention(AbstractKernelAttention, AbstractNormalizedAttention, AbstractGaussianClosure):
    r"""Multi-head attention (euclidean.md §2b):

    $$\Gamma_\mu(x)=\sum_{h=1}^H W_h\,\frac{\int e^{\beta\langle Q_hx,K_hy\rangle}\,V_hy\,d\mu(y)}
    {\int e^{\beta\langle Q_hx,K_hy\rangle}\,d\mu(y)}.$$

    Args:
        Q, K: shape ``(H, k, d)``.
        V: shape ``(H, k, d)`` (head values V_h: R^d -> R^k).
        W: shape ``(H, d, k)`` (output maps W_h: R^k -> R^d).
        beta: inverse temperature.
        causal: causal masking, as in :class:`SoftmaxAttention`.
        backend: as in :class:`SoftmaxAttention`; the fast kernel runs per head
            (scores in R^k, k <= 3), with one plan for every head (R over all heads' rows).
    """

    Q: Param
    K: Param
    V: Param
    W: Param
    beta: jax.Array
    causal: bool = eqx.field(static=True)
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, W, beta=1.0, *, causal: bool = False,
                 backend: AbstractBackend | None = None):
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
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta,
                                    causal=self.causal)

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

    def _value_width(self):
        return param_shape(self.V)[1]

    def _head_reduction(self, queries, x, logw, Qh, Kh, Vh, query_offset=0):
        return SoftmaxReduction(queries @ Qh.T, x @ Kh.T, x @ Vh.T, logw, self.beta, x.dtype,
                                causal=self.causal, query_offset=query_offset)

    def _reductions(self, queries, x, weights, t):
        Q, K, V = (evaluate(p, t) for p in (self.Q, self.K, self.V))
        logw = log_weights(weights)
        return [self._head_reduction(queries, x, logw, Q[h], K[h], V[h])
                for h in range(self.num_heads)]

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        Q, K, V, W = (evaluate(p, t) for p in (self.Q, self.K, self.V, self.W))
        logw = log_weights(weights)

        def head(Qh, Kh, Vh, Wh):
            red = self._head_reduction(queries, x, logw, Qh, Kh, Vh, query_offset)
            avg, _ = self.backend.lse_average(red, axis_name=axis_name)
            return avg @ Wh.T

        return jnp.sum(self.backend.over_heads(head, Q, K, V, W), axis=0)

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
