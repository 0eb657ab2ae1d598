"""ℓ² attention (Kim, Papamakarios, Mnih 2021; euclidean.md §2c)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_block_size
from .._types import Param
from ..kernels import softmax_average
from ..params import evaluate
from .base import AbstractAttention, check_qkv, log_weights, matrix_dim, scalar_param


class L2Attention(AbstractAttention):
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
        self.Q, self.K, self.V = check_qkv(type(self).__name__, Q, K, V, beta)
        self.beta = scalar_param(beta)
        self.causal = bool(causal)
        self.block_size = check_block_size(block_size, f"{type(self).__name__}.block_size")

    @property
    def dim(self):
        return matrix_dim(self.V)

    def _field(self, queries, x, weights, t, query_offset=0):
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        kx = x @ K.T
        bias = log_weights(weights) - self.beta * jnp.sum(kx * kx, axis=-1)
        q = 2.0 * self.beta * (queries @ Q.T)
        return softmax_average(q, kx, x @ V.T, bias, causal=self.causal, query_offset=query_offset,
                               block_size=self.block_size)

    def gaussian_velocity(self, mean, cov, t=0.0):
        from ..gaussian import l2_moments

        return l2_moments(self, mean, cov, t)
