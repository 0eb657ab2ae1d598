"""Hard (zero-temperature, β = ∞) attention: each query moves toward its argmax key
(docs: math/attention.md#hard-attention); can be made causal by :class:`~transformer_pde.Causal`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..._checks import check_count, check_scalar, cover_finiteness
from ..._types import Param
from ...params import bilinear_params, evaluate, matrix_dim, scalar_param
from .base import AbstractMaskableAttention, AbstractNormalizedAttention


class HardAttention(AbstractNormalizedAttention, AbstractMaskableAttention):
    r"""Hard attention, the β → ∞ limit of :class:`~transformer_pde.SoftmaxAttention`
    (docs: math/attention.md#hard-attention):

    $$\Gamma_\mu(x)=\frac{\sum_{j\in S(x)}w_j\,Vy_j}{\sum_{j\in S(x)}w_j},\qquad
    S(x)=\{j:\ w_j>0,\ \langle Qx,Ky_j\rangle\ge\max_{k:\,w_k>0}\langle Qx,Ky_k\rangle-\mathrm{tol}\}.$$

    Ties are the argmax set S(x), averaged with the keys' masses: with ``tol = 0`` this is the
    pointwise limit of the softmax weights w_j e^{β s_j}/Σ_k w_k e^{β s_k} as β → ∞ (the
    keys of the largest score keep their relative masses, the others' weights vanish like
    e^{−β gap}); ``tol > 0`` counts scores within ``tol`` of the maximum as ties (rounding).
    The field is piecewise constant in x (zero divergence between the cells of S); its
    discontinuities are on the tie sets, where a token may slide (a Filippov solution; a
    time-stepper chatters across them at the scale of its step).

    The β → −∞ limit (repulsive attention, each query moving toward its argmin key) is this
    with K replaced by −K. Zero-temperature dynamics: Alcalde, Fantuzzi & Zuazua (2407.01602,
    hardmax transformers, leaders and clusters); 2508.09628 (the hardmax step as a Frank–Wolfe
    step, Voronoi cells for KᵀQ ⪰ 0, contraction for KᵀQ ⪯ 0).

    Args:
        Q, K: shape ``(k, d)``, or callables ``t -> (k, d)``.
        V: shape ``(d, d)``, or a callable.
        tol: scores within ``tol`` of the maximum are ties (>= 0; default 0: exact ties only).

    The scores are a dense ``(m, n)`` matrix (no kernel backend: the argmax is not a softmax
    reduction). Causal: ``tp.Causal(HardAttention(...))``; an ALiBi bias e^{b_j} multiplies the
    masses (the β → ∞ limit of a bias added to β-scaled scores: it only reweights ties).
    """

    Q: Param
    K: Param
    V: Param
    tol: jax.Array

    def __init__(self, Q, K, V, *, tol=0.0):
        name = type(self).__name__
        # Q, K, V checked as any bilinear attention's (a placeholder β: none is used)
        self.Q, self.K, self.V, _ = bilinear_params(name, Q, K, V, 1.0)
        self.tol = scalar_param(check_scalar(tol, f"{name}.tol", nonnegative=True), f"{name}.tol")

    @classmethod
    def identity(cls, d: int, *, tol=0.0, dtype=None):
        """Q = K = V = I_d."""
        eye = jnp.eye(check_count(d, f"{cls.__name__}.identity d", minimum=1), dtype=dtype)
        cover_finiteness([eye])
        return cls(eye, eye, eye, tol=tol)

    @property
    def dim(self):
        return matrix_dim(self.V)

    def value_norm(self, t=0.0):
        return jnp.linalg.norm(evaluate(self.V, t), ord=2)

    def _field(self, queries, x, weights, t, mask=None):
        Q, K, V = (evaluate(p, t) for p in (self.Q, self.K, self.V))
        scores = (queries @ Q.T) @ (x @ K.T).T
        live = jnp.broadcast_to(weights > 0, scores.shape)
        if mask is not None:
            live = live & mask
        scores = jnp.where(live, scores, -jnp.inf)
        top = jnp.max(scores, axis=1, keepdims=True)
        ties = jnp.where(live & (scores >= top - self.tol), weights[None, :], 0.0)
        mass = jnp.sum(ties, axis=1, keepdims=True)
        # a query that sees no key (causal, without itself, token 0) does not move
        return jnp.where(mass > 0, ties @ (x @ V.T), 0.0) / jnp.where(mass > 0, mass, 1.0)

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._field(queries, x, weights, t)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        if key_bias is not None:
            weights = weights * jnp.exp(key_bias - jnp.max(key_bias))  # only ratios matter
        i = query_offset + jnp.arange(queries.shape[0])
        mask = jnp.arange(x.shape[0])[None, :] <= i[:, None]
        return self._field(queries, x, weights, t, mask)
