"""ℓ² attention (Kim, Papamakarios, Mnih 2021; docs: math/attention.md#l2-attention)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._types import Param
from ...kernels.backends import AbstractBackend, bind_backend
from ...kernels.exact import unchecked_log_weights
from ...kernels.reduction import SoftmaxReduction
from ...params import bilinear_params, evaluate
from .base import (
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractMaskableAttention,
    AbstractNormalizedAttention,
)


class L2Attention(AbstractBilinearAttention, AbstractKernelAttention, AbstractNormalizedAttention,
                  AbstractGaussianClosure, AbstractMaskableAttention):
    r"""ℓ² attention, kernel $e^{-\beta|Qx-Ky|^2}$ (docs: math/attention.md#l2-attention):

    $$\Gamma_\mu(x)=\frac{\int e^{-\beta|Qx-Ky|^2}\,Vy\,d\mu(y)}{\int e^{-\beta|Qx-Ky|^2}\,d\mu(y)}.$$

    The factor $e^{-\beta|Qx|^2}$ cancels, so this is softmax attention with logits
    β(2⟨Qx, Ky⟩ − |Ky|²): a key-dependent bias (docs: math/attention.md#l2-attention). No factor ½, Q and K
    not tied: the normalization fixed by the authors' Gaussian right-hand side.

    ``backend`` as in :class:`SoftmaxAttention`; on the fast kernel the kernel is the Gaussian
    $e^{-\beta|a-b|^2}$ itself (γ = 2β), with no weight range to widen the bound. Causal:
    ``tp.Causal(L2Attention(...))``.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta = bilinear_params(name, Q, K, V, beta)
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta,
                                    gamma_factor=2.0)

    def _value_width(self):
        return self.dim

    def _reduction(self, queries, x, weights, t, key_bias=None, **mask):
        """One softmax reduction with logits β(2⟨Q q_i, K x_j⟩ − |K x_j|²) (+ ``key_bias``)."""
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        kx = x @ K.T
        bias = unchecked_log_weights(weights) - self.beta * jnp.sum(kx * kx, axis=-1)
        if key_bias is not None:
            bias = bias + key_bias
        return SoftmaxReduction(queries @ Q.T, kx, x, bias, 2.0 * self.beta, x.dtype, **mask)

    def _average(self, reduction, t, axis_name=None):
        avg, _ = self.backend.lse_average(reduction, axis_name=axis_name)
        return avg @ evaluate(self.V, t).T

    def _reductions(self, queries, x, weights, t, causal=False):
        return [self._reduction(queries, x, weights, t, causal=causal)]

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        return self._average(self._reduction(queries, x, weights, t), t, axis_name)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        red = self._reduction(queries, x, weights, t, key_bias, causal=True, query_offset=query_offset)
        return self._average(red, t)

    def affine_field(self, mean, cov, t=0.0):
        r"""ℓ² attention (docs: math/gaussian.md#moment-equations) with kernel e^{-β|Qx-Ky|²}. The key law tilted by
        the kernel has precision Σ⁻¹ + 2βKᵀK, so with M = I + 2βΣKᵀK

        $$\Gamma(x)=VM^{-1}(\alpha+2\beta\Sigma K^\top Qx),\qquad J = 2\beta VM^{-1}\Sigma K^\top Q,
        \qquad c = VM^{-1}\alpha.$$
        """
        Q, K, V = (evaluate(p, t) for p in (self.Q, self.K, self.V))
        d = mean.shape[0]
        M = jnp.eye(d, dtype=cov.dtype) + 2.0 * self.beta * cov @ (K.T @ K)
        # one factorization for both right-hand sides
        sol = jnp.linalg.solve(M, jnp.concatenate([2.0 * self.beta * cov @ (K.T @ Q), mean[:, None]], 1))
        return V @ sol[:, :d], V @ sol[:, d]
