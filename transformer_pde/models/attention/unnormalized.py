"""Attention without softmax normalization: sigmoid (docs: math/attention.md#sigmoid-attention) and USA
(docs: math/attention.md#unnormalized-attention-usa), and their causal variants
(docs: math/causal.md#causal-attention)."""

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
from .base import (
    AbstractBilinearAttention,
    AbstractCausalAttention,
    AbstractFieldAttention,
    AbstractKernelAttention,
)


class _AbstractSigmoid(AbstractBilinearAttention):
    """What :class:`SigmoidAttention` and :class:`CausalSigmoidAttention` share."""

    bias: eqx.AbstractVar[jax.Array]
    layout: eqx.AbstractVar[AbstractLayout]

    def _sum(self, queries, x, weights, t, **mask):
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        q, k, v = self.beta * (queries @ Q.T), x @ K.T, x @ V.T
        # fold the bias into the bilinear form: [q, b] · [k, 1] = q·k + b
        q = jnp.concatenate([q, jnp.broadcast_to(self.bias, (q.shape[0], 1)).astype(q.dtype)], 1)
        k = jnp.concatenate([k, jnp.ones((k.shape[0], 1), k.dtype)], 1)
        return sigmoid_kernel_sum(q, k, v, weights, layout=self.layout, **mask)


def _sigmoid_params(name, Q, K, V, beta, bias, layout):
    Q, K, V, beta = bilinear_params(name, Q, K, V, beta)
    layout = check_layout(layout, f"{name}.layout")
    bias = check_scalar(bias, f"{name}.bias")
    return Q, K, V, beta, scalar_param(bias), layout


class SigmoidAttention(_AbstractSigmoid, AbstractFieldAttention):
    r"""Sigmoid attention (Ramapuram et al. 2024; docs: math/attention.md#sigmoid-attention), keys not normalized:

    $$\Gamma_\mu(x)=\int\sigma\big(\beta\langle Qx,Ky\rangle+b\big)\,Vy\,d\mu(y),\qquad
    \sigma(s)=\frac1{1+e^{-s}}.$$

    For particles, ∫ dμ is the weighted average Σ_j w_j (1/n for uniform weights).
    Ramapuram et al. use b = −log n together with an unaveraged sum. ``layout`` sets how the
    exact kernel visits the pairs (:class:`transformer_pde.kernels.Streaming` blocks, ...). The
    causal variant is :class:`CausalSigmoidAttention`.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    bias: jax.Array
    layout: AbstractLayout = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, bias=0.0, *, layout: AbstractLayout = DEFAULT_LAYOUT):
        self.Q, self.K, self.V, self.beta, self.bias, self.layout = _sigmoid_params(
            type(self).__name__, Q, K, V, beta, bias, layout)

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._sum(queries, x, weights, t)


class CausalSigmoidAttention(AbstractCausalAttention, _AbstractSigmoid):
    """Causal sigmoid attention (docs: math/causal.md#causal-attention): :class:`SigmoidAttention` with token i
    attending to tokens j <= i."""

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    bias: jax.Array
    layout: AbstractLayout = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, bias=0.0, *, layout: AbstractLayout = DEFAULT_LAYOUT):
        self.Q, self.K, self.V, self.beta, self.bias, self.layout = _sigmoid_params(
            type(self).__name__, Q, K, V, beta, bias, layout)

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._sum(queries, x, weights, t, causal=True, query_offset=query_offset)


class _AbstractUnnormalized(AbstractBilinearAttention, AbstractKernelAttention):
    """What :class:`UnnormalizedAttention` and :class:`CausalUnnormalizedAttention` share: one
    softmax reduction, its sum e^{lse}·average."""

    shift: eqx.AbstractVar[jax.Array]

    def _value_width(self):
        return self.dim

    def _reduction(self, queries, x, weights, t, **mask):
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        bias = unchecked_log_weights(weights) - self.beta * self.shift
        return SoftmaxReduction(queries @ Q.T, x @ K.T, x, bias, self.beta, x.dtype, **mask)

    def _sum(self, reduction, t, axis_name=None):
        # e^{lse} times the average of the tokens, V applied after
        avg, lse = self.backend.lse_average(reduction, axis_name=axis_name)
        return jnp.exp(lse)[:, None] * (avg @ evaluate(self.V, t).T)


def _unnormalized_params(name, Q, K, V, beta, shift):
    Q, K, V, beta = bilinear_params(name, Q, K, V, beta)
    shift = check_scalar(shift, f"{name}.shift")
    return Q, K, V, beta, scalar_param(shift)


class UnnormalizedAttention(_AbstractUnnormalized, AbstractFieldAttention):
    r"""Unnormalized self-attention, USA (docs: math/attention.md#unnormalized-attention-usa):

    $$\Gamma_\mu(x)=e^{-\beta c}\int e^{\beta\langle Qx,Ky\rangle}\,Vy\,d\mu(y)
    =e^{-\beta c}\sum_j w_j e^{\beta\langle Qx,Ky_j\rangle}Vy_j.$$

    ``shift`` = c sets the normalization across papers (docs: math/sphere.md#normalizations-across-papers): c = 0 is
    GLPR's USA (1/n, the default), c = 1 is GKPR's e^{β(⟨x,y⟩−1)}/n, which stays finite on the sphere
    for any β. The sum is computed in the log domain, as e^{lse}·average; it overflows only
    when its true value exceeds the dtype's range.

    ``backend`` as in :class:`SoftmaxAttention`; on the fast kernel the tolerance applies to the
    log-normalizer (so relatively to the sum) and to the average. The causal variant is
    :class:`CausalUnnormalizedAttention`.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    shift: jax.Array
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, shift=0.0, backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta, self.shift = _unnormalized_params(name, Q, K, V, beta, shift)
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta)

    def _reductions(self, queries, x, weights, t):
        return [self._reduction(queries, x, weights, t)]

    def query_field(self, queries, x, weights, t, query_offset=0, axis_name=None):
        return self._sum(self._reduction(queries, x, weights, t), t, axis_name)


class CausalUnnormalizedAttention(AbstractCausalAttention, _AbstractUnnormalized):
    """Causal USA (docs: math/attention.md#unnormalized-attention-usa, docs: math/causal.md#causal-attention):
    :class:`UnnormalizedAttention` with token i attending to tokens j <= i. ``backend``: ``tp.kernels.Exact()`` or
    ``Auto`` (the default; exact here)."""

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    shift: jax.Array
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, shift=0.0, backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta, self.shift = _unnormalized_params(name, Q, K, V, beta, shift)
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta, causal=True)

    def _reductions(self, queries, x, weights, t):
        return [self._reduction(queries, x, weights, t, causal=True)]

    def query_field(self, queries, x, weights, t, query_offset=0):
        red = self._reduction(queries, x, weights, t, causal=True, query_offset=query_offset)
        return self._sum(red, t)
