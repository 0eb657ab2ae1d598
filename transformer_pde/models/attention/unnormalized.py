"""Attention without softmax normalization: sigmoid (docs: math/attention.md#sigmoid-attention) and USA
(docs: math/attention.md#unnormalized-attention-usa); both can be made causal by
:class:`~transformer_pde.Causal` (docs: math/causal.md#causal-attention)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import check_scalar
from ..._types import Param
from ...kernels.backends import AbstractBackend, bind_backend
from ...kernels.exact import DEFAULT_LAYOUT, AbstractLayout, check_layout, sigmoid_kernel_sum, unchecked_log_weights
from ...kernels.reduction import SoftmaxReduction
from ...params import bilinear_params, evaluate, scalar_param
from .base import AbstractBilinearAttention, AbstractKernelAttention, AbstractMaskableAttention


class SigmoidAttention(AbstractBilinearAttention, AbstractMaskableAttention):
    r"""Sigmoid attention (Ramapuram et al. 2024; docs: math/attention.md#sigmoid-attention), keys not normalized:

    $$\Gamma_\mu(x)=\int\sigma\big(\beta\langle Qx,Ky\rangle+b\big)\,Vy\,d\mu(y),\qquad
    \sigma(s)=\frac1{1+e^{-s}}.$$

    For particles, ∫ dμ is the weighted average Σ_j w_j (1/n for uniform weights).
    Ramapuram et al. use b = −log n together with an unaveraged sum. ``layout`` sets how the
    exact kernel visits the pairs (:class:`transformer_pde.kernels.Streaming` blocks, ...).
    Causal: ``tp.Causal(SigmoidAttention(...))``.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    bias: jax.Array
    layout: AbstractLayout = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, bias=0.0, *, layout: AbstractLayout = DEFAULT_LAYOUT):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta = bilinear_params(name, Q, K, V, beta)
        self.layout = check_layout(layout, f"{name}.layout")
        self.bias = scalar_param(check_scalar(bias, f"{name}.bias"))

    def _sum(self, queries, x, weights, t, **mask):
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        q, k, v = self.beta * (queries @ Q.T), x @ K.T, x @ V.T
        # fold the bias into the bilinear form: [q, b] · [k, 1] = q·k + b
        q = jnp.concatenate([q, jnp.broadcast_to(self.bias, (q.shape[0], 1)).astype(q.dtype)], 1)
        k = jnp.concatenate([k, jnp.ones((k.shape[0], 1), k.dtype)], 1)
        return sigmoid_kernel_sum(q, k, v, weights, layout=self.layout, **mask)

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._sum(queries, x, weights, t)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        if key_bias is not None:  # the sum is linear in the masses
            weights = weights * jnp.exp(key_bias)
        return self._sum(queries, x, weights, t, causal=True, query_offset=query_offset)


class UnnormalizedAttention(AbstractBilinearAttention, AbstractKernelAttention, AbstractMaskableAttention):
    r"""Unnormalized self-attention, USA (docs: math/attention.md#unnormalized-attention-usa):

    $$\Gamma_\mu(x)=e^{-\beta c}\int e^{\beta\langle Qx,Ky\rangle}\,Vy\,d\mu(y)
    =e^{-\beta c}\sum_j w_j e^{\beta\langle Qx,Ky_j\rangle}Vy_j.$$

    ``shift`` = c sets the normalization across papers (docs: math/sphere.md#normalizations-across-papers): c = 0 is
    GLPR's USA (1/n, the default), c = 1 is GKPR's e^{β(⟨x,y⟩−1)}/n, which stays finite on the sphere
    for any β. The sum is computed in the log domain, as e^{lse}·average; it overflows only
    when its true value exceeds the dtype's range.

    ``backend`` as in :class:`SoftmaxAttention`; on the fast kernel the tolerance applies to the
    log-normalizer (so relatively to the sum) and to the average. Causal:
    ``tp.Causal(UnnormalizedAttention(...))``.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    shift: jax.Array
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, shift=0.0, backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta = bilinear_params(name, Q, K, V, beta)
        self.shift = scalar_param(check_scalar(shift, f"{name}.shift"))
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta)

    def _value_width(self):
        return self.dim

    def _reduction(self, queries, x, weights, t, key_bias=None, **mask):
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        bias = unchecked_log_weights(weights) - self.beta * self.shift
        if key_bias is not None:
            bias = bias + key_bias
        return SoftmaxReduction(queries @ Q.T, x @ K.T, x, bias, self.beta, x.dtype, **mask)

    def _sum(self, reduction, t, axis_name=None):
        # e^{lse} times the average of the tokens, V applied after
        avg, lse = self.backend.lse_average(reduction, axis_name=axis_name)
        return jnp.exp(lse)[:, None] * (avg @ evaluate(self.V, t).T)

    def _reductions(self, queries, x, weights, t, causal=False):
        return [self._reduction(queries, x, weights, t, causal=causal)]

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        return self._sum(self._reduction(queries, x, weights, t), t, axis_name)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        red = self._reduction(queries, x, weights, t, key_bias, causal=True, query_offset=query_offset)
        return self._sum(red, t)
