"""Softmax and multi-head attention (docs: math/attention.md#softmax-attention,
math/attention.md#multi-head-attention); both can be made causal by :class:`~transformer_pde.Causal`
(math/causal.md#causal-attention)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import as_float_array, check_count, check_real, check_scalar
from ..._types import Param
from ...kernels.backends import AbstractBackend, bind_backend
from ...kernels.exact import unchecked_log_weights
from ...kernels.reduction import SoftmaxReduction, keys_over_devices
from ...params import as_param, bilinear_params, evaluate, param_shape, scalar_param
from .base import (
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractMaskableAttention,
    AbstractNormalizedAttention,
)


class SoftmaxAttention(AbstractBilinearAttention, AbstractKernelAttention, AbstractNormalizedAttention,
                       AbstractGaussianClosure, AbstractMaskableAttention):
    r"""Softmax self-attention (docs: math/attention.md#softmax-attention):

    $$\Gamma_\mu(x)=\frac{\int e^{\beta\langle Qx,Ky\rangle}\,Vy\,d\mu(y)}
    {\int e^{\beta\langle Qx,Ky\rangle}\,d\mu(y)}.$$

    Args:
        Q, K: shape ``(k, d)``, or callables ``t -> (k, d)`` (time-dependent weights).
        V: shape ``(d, d)``, or a callable.
        beta: inverse temperature β (scores are β⟨Qx, Ky⟩ = β yᵀ A x with A = KᵀQ).
        backend: how the reduction is computed (:mod:`transformer_pde.kernels.backends`):
            ``tp.kernels.Exact()`` (``Exact(tp.kernels.Streaming(key_block))`` sets its
            blocks), ``Fast(tol, radius)`` or ``Auto(tol, radius)``, the NUFFT Gaussian sum for
            Q, K of shape (k, d) with k <= 3. Default: ``tp.kernels.automatic()``, exact unless
            the tokens' bound is known (``tp.Sphere`` declares it) and the fast kernel is
            predicted cheaper (n in the thousands).

    Many papers use A = KᵀQ/√d: pass ``Q / sqrt(d)`` (docs: math/attention.md#conventions). Token i attending to
    tokens j <= i only, with ALiBi position weights, is ``tp.Causal(SoftmaxAttention(...), alibi=λ)``
    (the CSA model; :class:`~transformer_pde.Causal`).

    Example:
        ```python
        import jax.numpy as jnp, jax.random as jr, transformer_pde as tp

        x = jr.normal(jr.key(0), (16, 2))
        attn = tp.SoftmaxAttention(Q=jnp.eye(2), K=jnp.eye(2), V=jnp.eye(2), beta=1.0)
        v = attn.velocity(x)                                    # Γ_μ(x_i) for μ = (1/n) Σ δ_{x_j}: (16, 2)
        sol = tp.solve(attn, x, t1=1.0, dt0=0.1)                # tokens in R^d
        ```
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta = bilinear_params(name, Q, K, V, beta)
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta)

    def _value_width(self):
        return self.dim

    def _reduction(self, queries, x, bias, t, **mask):
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        # With Q, K of full rank (k >= d) the exact kernel folds them: β⟨Q q_i, K x_j⟩ =
        # ⟨q_i, β QᵀK x_j⟩, so only one (n, d) projection is held next to the output.
        folded = (queries, self.beta * (x @ (K.T @ Q))) if Q.shape[0] >= Q.shape[1] else None
        return SoftmaxReduction(queries @ Q.T, x @ K.T, x, bias, self.beta, x.dtype,
                                exact_scores=folded, **mask)

    def _average(self, reduction, t, axis_name=None):
        # average the tokens and apply V after: Σ p_ij V x_j = V Σ p_ij x_j
        avg, _ = self.backend.lse_average(reduction, axis_name=axis_name)
        return avg @ evaluate(self.V, t).T

    def _reductions(self, queries, x, weights, t, causal=False):
        return [self._reduction(queries, x, unchecked_log_weights(weights), t, causal=causal)]

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        return self._average(self._reduction(queries, x, unchecked_log_weights(weights), t), t, axis_name)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        bias = unchecked_log_weights(weights)
        if key_bias is not None:  # ALiBi (tp.Causal): e^{−λ(i−j)/N} ∝ e^{λj/N} in the softmax
            bias = bias + key_bias
        return self._average(self._reduction(queries, x, bias, t, causal=True, query_offset=query_offset), t)

    def divergence(self, queries, x, weights, t):
        r"""Closed form (docs: math/mean_field.md#densities-along-characteristics): with p_j(q) ∝ w_j
        e^{β⟨Qq, Ky_j⟩}, ∂Γ/∂q = β V C(q) KᵀQ, C(q) = Cov_{p(q)}(y) the covariance of the keys under query q's
        attention weights, so

        $$\operatorname{div}\Gamma_\mu(q)=\beta\,\mathrm{tr}\big(V\,C(q)\,K^\top Q\big)
        =\mathbb E_{p(q)}\big[(y-\bar y)^\top M (y-\bar y)\big],\quad M=\beta K^\top QV,$$

        one softmax reduction with values (y − c, (y − c)ᵀM(y − c)), c the weighted mean of the
        keys (the covariance does not see c; centring keeps the difference well conditioned).
        Checked against the trace of the autodiff Jacobian (tests/solvers/test_densities.py:
        agreement to 1e-12 in float64; sign as written, d/dt log ρ = −div Γ).
        """
        V = evaluate(self.V, t)
        M = self.score_matrix(t) @ V
        c = weights @ x
        y = x - c[None, :]
        s = jnp.einsum("nd,de,ne->n", y, M, y)
        red = self._reduction(queries, x, unchecked_log_weights(weights), t)
        red = eqx.tree_at(lambda r: r.v, red, jnp.concatenate([y, s[:, None]], axis=1))
        avg, _ = self.backend.lse_average(red)
        ybar, es = avg[:, :-1], avg[:, -1]
        return es - jnp.einsum("md,de,me->m", ybar, M, ybar)

    def affine_field(self, mean, cov, t=0.0):
        r"""Softmax (docs: math/gaussian.md#moment-equations): Γ(x) = V(α + ΣAx), so J = VΣA, c = Vα and

        $$\dot\alpha=V(I+\Sigma A)\alpha,\qquad\dot\Sigma=V\Sigma A\Sigma+\Sigma A^\top\Sigma V^\top.$$
        """
        V = evaluate(self.V, t)
        return V @ cov @ self.score_matrix(t), V @ mean


def _multihead_params(name: str, Q, K, V, W, beta):
    """The checked (Q, K, V, W, beta) of a multi-head attention."""
    Q, K, V, W = (as_param(p, f"{name}.{n}") for p, n in ((Q, "Q"), (K, "K"), (V, "V"), (W, "W")))
    sq, sk, sv, sw = (param_shape(p) for p in (Q, K, V, W))
    if len(sq) != 3 or sq != sk:
        raise ValueError(f"{name}: Q and K must both have shape (H, k, d), got Q {sq} and K {sk}")
    H, _, d = sq
    if not ((len(sv) == 3 and sv[0] == H) or len(sv) == 2) or sv[-1] != d:
        raise ValueError(f"{name}: V must have shape (H, k_v, d) = ({H}, k_v, {d}), or (k_v, {d}) for "
                         f"one map shared by the heads, got {sv}")
    k_v = sv[-2]
    if sw not in ((H, d, k_v), (d, k_v)):
        raise ValueError(f"{name}: W must have shape (H, d, k_v) = ({H}, {d}, {k_v}), or ({d}, {k_v}) for "
                         f"one map shared by the heads, got {sw}")
    beta = check_scalar(beta, f"{name}.beta")
    return Q, K, V, W, scalar_param(beta)


class MultiHeadAttention(AbstractKernelAttention, AbstractNormalizedAttention, AbstractGaussianClosure,
                         AbstractMaskableAttention):
    r"""Multi-head attention (docs: math/attention.md#multi-head-attention):

    $$\Gamma_\mu(x)=\sum_{h=1}^H W_h\,\frac{\int e^{\beta\langle Q_hx,K_hy\rangle}\,V_hy\,d\mu(y)}
    {\int e^{\beta\langle Q_hx,K_hy\rangle}\,d\mu(y)}.$$

    Args:
        Q, K: shape ``(H, k, d)``.
        V: shape ``(H, k_v, d)`` (head values V_h: R^d -> R^{k_v}), or ``(k_v, d)``: one V for
            every head.
        W: shape ``(H, d, k_v)`` (output maps W_h: R^{k_v} -> R^d), or ``(d, k_v)``: one W for
            every head. With V and W both shared, Γ(x) = Σ_h ∫ P_h(x, y) WVy dμ(y) (P_h the heads'
            softmax weights): the exact kernel sums the weights first and applies them once
            (docs: math/attention.md#multi-head-attention).
        beta: inverse temperature.
        backend: as in :class:`SoftmaxAttention`; the fast kernel runs per head (scores in R^k,
            k <= 3), with one plan for every head (R over all heads' rows).

    Causal (token i attends to tokens j <= i): ``tp.Causal(MultiHeadAttention(...))``.
    """

    Q: Param
    K: Param
    V: Param
    W: Param
    beta: jax.Array
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, W, beta=1.0, *, backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.W, self.beta = _multihead_params(name, Q, K, V, W, beta)
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta)

    @classmethod
    def split(cls, Q, K, V, num_heads: int, beta=1.0, **kwargs):
        """Split d x d matrices into ``num_heads`` row blocks, W_h = h-th column block of I_d.

        Head h scores with the k = d/H rows h·k..(h+1)·k of Q and K and averages the same rows of
        V y, and W_h writes its k outputs back into those coordinates: Γ is the concatenation of
        the heads' outputs, as in a Transformer's multi-head layer. With ``num_heads = d`` (k = 1)
        every head has a rank-one score β(Q_h x)(K_h y) and moves only coordinate h. This is the
        authors' ``rhs_multihead`` construction (docs: math/attention.md#multi-head-attention).

        Args:
            Q, K, V: (d, d) matrices; ``num_heads`` must divide d.
            num_heads: the number of heads H.
            beta: the inverse temperature (shared by the heads).
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

    @classmethod
    def scalar(cls, d: int, scores, values, beta=1.0, **kwargs):
        """Scalar heads: head h scores with β a_h⟨x, y⟩ (Q_h = a_h I, K_h = I) and writes w_h times its
        softmax average (V = I, W_h = w_h I); w_h < 0 is a repulsive head, a_h = 0 a uniform one.
        Equiangular starts keep a common inner product under it (docs:
        math/sphere.md#equiangular-multi-head-attention, ``tp.theory.equiangular.MultiHeadReducedODE``).

        Args:
            d: the dimension.
            scores, values: the heads' a_h and w_h, shape ``(H,)`` each.
            beta: the inverse temperature (shared by the heads).
        """
        d = check_count(d, "d", minimum=1)
        scores, values = (as_float_array(a, name) for a, name in ((scores, "scores"), (values, "values")))
        if scores.ndim != 1 or scores.shape != values.shape or scores.shape[0] < 1:
            raise ValueError(f"scores and values must be 1-D with one entry per head each, got shapes "
                             f"{scores.shape} and {values.shape}")
        scores, values = check_real(scores, "scores"), check_real(values, "values")
        eye = jnp.eye(d, dtype=scores.dtype)
        H = scores.shape[0]
        return cls(jnp.einsum("h,de->hde", scores, eye), jnp.broadcast_to(eye, (H, d, d)), eye,
                   jnp.einsum("h,de->hde", values, eye), beta, **kwargs)

    @property
    def num_heads(self) -> int:
        return param_shape(self.Q)[0]

    @property
    def dim(self):
        return param_shape(self.Q)[-1]

    def _value_width(self):
        # shared maps average x(WV)ᵀ, d columns; per-head maps average V_h x, k_v columns
        return self.dim if self._shared_values() else param_shape(self.V)[-2]

    def _shared_values(self) -> bool:
        """V and W given once for every head (2-D): the heads then average the same values."""
        return len(param_shape(self.V)) == 2 and len(param_shape(self.W)) == 2

    def _stacked(self, P, t):
        """A per-head map at t, ``(H, ., .)``: a 2-D one (shared by the heads) broadcast."""
        P = evaluate(P, t)
        return jnp.broadcast_to(P, (self.num_heads, *P.shape[-2:]))

    def score_matrix(self, t=0.0):
        """The stack A_h = β K_hᵀQ_h, shape ``(H, d, d)``."""
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        return self.beta * jnp.einsum("hkd,hke->hde", K, Q)

    def _value_maps(self, t):
        """The heads' value-output maps W_hV_h at t, ``(H, d, d)`` (shared maps: the same for every head)."""
        return jnp.einsum("hdk,hke->hde", self._stacked(self.W, t), self._stacked(self.V, t))

    def value_norm(self, t=0.0):
        return jnp.sum(jnp.linalg.norm(self._value_maps(t), ord=2, axis=(-2, -1)))

    def _head_scores(self, queries, x, t):
        """Every head's queries Q_h q and keys K_h x, ``(H, m, k)``, ``(H, n, k)``: one matmul per
        array (H small matmuls cost more than their flops: twice the field's time at n = 64)."""
        return tuple(jnp.einsum("nd,hkd->hnk", y, evaluate(P, t)) for y, P in ((queries, self.Q), (x, self.K)))

    def _head_values(self, x, t):
        """Every head's values V_h x, ``(H, n, e)``, one matmul."""
        return jnp.einsum("nd,hkd->hnk", x, self._stacked(self.V, t))

    def _head_reductions(self, queries, x, weights, t, **mask):
        logw = unchecked_log_weights(weights)
        (a, b), v = self._head_scores(queries, x, t), self._head_values(x, t)
        return [SoftmaxReduction(a[h], b[h], v[h], logw, self.beta, x.dtype, **mask)
                for h in range(self.num_heads)]

    def _heads_field(self, queries, x, logw, t, axis_name=None, **mask):
        """Γ at ``queries`` for key biases ``logw`` (log w_j, plus any position bias)."""
        if self._shared_values():
            # Σ_h W P_h (xVᵀ) = (Σ_h P_h)(x(WV)ᵀ): the backend sums the heads' weights where it can;
            # the values mapped first (a map after the sum cost a fifth of the field's time at
            # d = 16, n = 64, 8 heads: XLA:CPU fuses the sum over heads less well before a product)
            a, b = self._head_scores(queries, x, t)
            # full-width heads: ⟨Q_h q, K_h x⟩ = ⟨q, (K_hᵀQ_h)ᵀx⟩, the queries shared by the heads
            folded = ((queries, jnp.einsum("nd,hde->hne", x, self.score_matrix(t)))
                      if param_shape(self.Q)[1] >= self.dim else None)
            values = x @ (evaluate(self.W, t) @ evaluate(self.V, t)).T
            return self.backend.sum_over_heads(a, b, values, logw, self.beta, dtype=x.dtype,
                                               exact_scores=folded, axis_name=axis_name, **mask)
        (a, b), v = self._head_scores(queries, x, t), self._head_values(x, t)

        def head(ah, bh, vh):
            red = SoftmaxReduction(ah, bh, vh, logw, self.beta, x.dtype, **mask)
            return self.backend.lse_average(red, axis_name=axis_name)[0]

        sizes = dict(m=queries.shape[0], n=keys_over_devices(x.shape[0], axis_name),
                     e=v.shape[-1], dtype=x.dtype, causal=bool(mask.get("causal", False)))
        # the heads' outputs W_h avg_h summed by one matmul
        return jnp.einsum("hme,hde->md", self.backend.over_heads(head, a, b, v, **sizes), self._stacked(self.W, t))

    def _reductions(self, queries, x, weights, t, causal=False):
        return self._head_reductions(queries, x, weights, t, causal=causal)

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        return self._heads_field(queries, x, unchecked_log_weights(weights), t, axis_name)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        logw = unchecked_log_weights(weights)
        if key_bias is not None:  # ALiBi (tp.Causal): a key bias, as in SoftmaxAttention
            logw = logw + key_bias
        return self._heads_field(queries, x, logw, t, causal=True, query_offset=query_offset)

    def affine_field(self, mean, cov, t=0.0):
        r"""Multi-head (docs: math/gaussian.md#moment-equations): Γ(x) = Σ_h W_hV_h(α + ΣA_hx), so
        J = Σ_h W_hV_hΣA_h and c = Σ_h W_hV_hα."""
        WV = self._value_maps(t)
        return (jnp.einsum("hde,ef,hfg->dg", WV, cov, self.score_matrix(t)),
                jnp.einsum("hde,e->d", WV, mean))
