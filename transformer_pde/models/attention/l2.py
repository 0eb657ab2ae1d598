"""ℓ² attention (Kim, Papamakarios, Mnih 2021; euclidean.md §2c)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._types import Param
from ...kernels import softmax_average
from ...params import evaluate
from .base import (
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractNormalizedAttention,
    bilinear_fields,
    log_weights,
)


class L2Attention(AbstractBilinearAttention, AbstractNormalizedAttention, AbstractGaussianClosure):
    r"""ℓ² attention, kernel $e^{-\beta|Qx-Ky|^2}$ (euclidean.md §2c):

    $$\Gamma_\mu(x)=\frac{\int e^{-\beta|Qx-Ky|^2}\,Vy\,d\mu(y)}{\int e^{-\beta|Qx-Ky|^2}\,d\mu(y)}.$$

    The factor $e^{-\beta|Qx|^2}$ cancels, so this is softmax attention with logits
    β(2⟨Qx, Ky⟩ − |Ky|²): a key-dependent bias (euclidean.md §7). No factor ½, Q and K
    not tied: the normalization fixed by the authors' Gaussian right-hand side.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    causal: bool = eqx.field(static=True)
    block_size: int | None = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, causal: bool = False, block_size: int | None = None):
        self.Q, self.K, self.V, self.beta, self.causal, self.block_size = bilinear_fields(
            type(self).__name__, Q, K, V, beta, causal, block_size)

    def _field(self, queries, x, weights, t, query_offset=0):
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        kx = x @ K.T
        bias = log_weights(weights) - self.beta * jnp.sum(kx * kx, axis=-1)
        q = 2.0 * self.beta * (queries @ Q.T)
        return softmax_average(q, kx, x @ V.T, bias, causal=self.causal, query_offset=query_offset,
                               block_size=self.block_size)

    def _affine_field(self, mean, cov, t):
        r"""ℓ² attention (euclidean.md §4c) with kernel e^{-β|Qx-Ky|²}. The key law tilted by
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
