r"""Lost in the middle (LitM): the particle model of Duerinckx–Geshkovski–Rossi on the torus
(docs: math/causal.md#lost-in-the-middle).

Causal USA with ALiBi weights over k < j (self excluded), in angles,

$$\theta_j'=\mathcal Z_{N,j}^{-1}\sum_{k<j}e^{-\lambda(j-k)/N}w_\beta'(\theta_j-\theta_k),\qquad
w_\beta(\theta)=e^{\beta\cos\theta},\quad \mathcal Z_{N,j}=\sum_{k<j}e^{-\lambda(j-k)/N}.$$

Causal softmax attention with ALiBi weights on R^d or the sphere (the CSA model) is
``tp.Causal(SoftmaxAttention(...), alibi=λ)``. The mean field, the Volterra closed forms and
the retrieval profile are in :mod:`transformer_pde.theory.lost_in_the_middle`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._checks import check_scalar
from ..params import scalar_param
from .base import AbstractDynamics

__all__ = ["LostInTheMiddle", "alibi_logits"]


def alibi_logits(n: int, lam, dtype, include_self: bool = True):
    """Position biases −λ(k − j)/N for key j <= k (−inf for masked pairs), shape (n, n)."""
    k = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    allowed = (j <= k) if include_self else (j < k)
    bias = -lam * (k - j).astype(dtype) / n
    return jnp.where(allowed, bias, -jnp.inf)


class LostInTheMiddle(AbstractDynamics):
    r"""The LitM particle model on the torus, state = angles of shape ``(N, 1)``
    (docs: math/causal.md#lost-in-the-middle):

    $$\theta_j'=\mathcal Z_{N,j}^{-1}\sum_{k<j}e^{-\lambda(j-k)/N}\,w_\beta'(\theta_j-\theta_k),
    \qquad w_\beta'(\theta)=-\beta\sin\theta\,e^{\beta\cos\theta}.$$

    The kernel is unnormalized (USA-type) and the ALiBi weights are normalized over k < j;
    the first token has no predecessor and stays put. Angles are not wrapped.
    """

    beta: jax.Array
    lam: jax.Array

    def __init__(self, beta=1.0, lam=1.0):
        beta = check_scalar(beta, "LostInTheMiddle.beta", nonnegative=True)
        lam = check_scalar(lam, "LostInTheMiddle.lam", nonnegative=True)
        self.beta = scalar_param(beta)
        self.lam = scalar_param(lam)

    @property
    def dim(self):
        return 1

    def position_weights(self, n: int, dtype=None):
        """Row-normalized ALiBi weights K_{jk} = e^{−λ(j−k)/N}/Z_{N,j} over k < j (row 1: zeros)."""
        dtype = dtype or jnp.result_type(float)
        logits = alibi_logits(n, self.lam, dtype, include_self=False)
        lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        return jnp.where(jnp.isfinite(lse), jnp.exp(logits - jnp.where(jnp.isfinite(lse), lse, 0.0)),
                         0.0)

    def vector_field(self, x, weights, t):
        theta = x[:, 0]
        c, s = jnp.cos(theta), jnp.sin(theta)
        # cos/sin of θ_j − θ_k from products (no n x n trigonometric calls)
        cos_d = c[:, None] * c[None, :] + s[:, None] * s[None, :]
        sin_d = s[:, None] * c[None, :] - c[:, None] * s[None, :]
        wprime = -self.beta * sin_d * jnp.exp(self.beta * (cos_d - 1.0))
        # e^{-β} factored out of the exponential for range; put it back
        Kw = self.position_weights(x.shape[0], x.dtype)
        return (jnp.exp(self.beta) * jnp.sum(Kw * wprime, axis=1))[:, None]
