"""Krause (bounded-confidence) attention: Gaussian scores restricted to a radius and/or the top-k
keys, a softmax over the kept keys, each token moving toward their mean
(docs: math/attention.md#krause-attention); can be made causal by :class:`~transformer_pde.Causal`."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import check_count, check_scalar, cover_finiteness
from ..._types import Param
from ...params import bilinear_params, evaluate, matrix_dim, scalar_param
from .base import AbstractMaskableAttention


class KrauseAttention(AbstractMaskableAttention):
    r"""Krause attention (Liu, Yue, Welling & Song, arXiv 2602.11534), bounded-confidence
    (Hegselmann–Krause) dynamics with Gaussian weights (docs: math/attention.md#krause-attention):

    $$\Gamma_\mu(x)=\sum_{j\in N(x)}p_j(x)\,V(y_j-x),\qquad
    p_j(x)=\frac{w_je^{-|Qx-Ky_j|^2/(2\sigma^2)}}{\sum_{k\in N(x)}w_ke^{-|Qx-Ky_k|^2/(2\sigma^2)}},$$

    N(x) the keys of positive mass with |Qx − Ky_j| <= ``radius`` and, with ``top_k``, among the
    ``top_k`` nearest (every key at the k-th distance kept: ties are all in). The velocity is the
    residual form of the layer x ← Σ p_j V y_j, so with V = I each token moves toward the
    weighted mean of its neighbours, the continuous Hegselmann–Krause model; on the sphere
    (``tp.Sphere``) the term −Vx is radial for V = I and the projection removes it.

    A query whose neighbourhood is empty (possible only when Q ≠ K: with Q = K a token is at
    distance 0 from itself, always kept) does not move; one whose only neighbour is itself does
    not move either (y_j − x = 0).

    Args:
        Q, K: shape ``(k, d)``, or callables ``t -> (k, d)``.
        V: shape ``(d, d)``, or a callable.
        sigma: σ > 0, the width of the Gaussian scores.
        radius: r > 0, the confidence bound in the key space R^k, or None (no bound).
        top_k: keep the ``top_k`` >= 1 nearest keys, or None (all within the radius).
        query_block: queries per block of the dense computation (memory ``query_block · n``).

    :meth:`sphere` gives the geodesic neighbourhood on S^{d−1}. Exact and dense, computed by
    blocks of queries (no n x n matrix). Causal: ``tp.Causal(KrauseAttention(...))`` (no ALiBi:
    the velocity is not a plain average of values).
    """

    Q: Param
    K: Param
    V: Param
    sigma: jax.Array
    radius: jax.Array | None
    top_k: int | None = eqx.field(static=True)
    query_block: int = eqx.field(static=True)

    def __init__(self, Q, K, V, *, sigma=1.0, radius=None, top_k=None, query_block: int = 256):
        name = type(self).__name__
        self.Q, self.K, self.V, _ = bilinear_params(name, Q, K, V, 1.0)  # a placeholder β: none is used
        self.sigma = scalar_param(check_scalar(sigma, f"{name}.sigma", positive=True), f"{name}.sigma")
        self.radius = None if radius is None else scalar_param(
            check_scalar(radius, f"{name}.radius", positive=True), f"{name}.radius")
        self.top_k = None if top_k is None else check_count(top_k, f"{name}.top_k", minimum=1)
        self.query_block = check_count(query_block, f"{name}.query_block", minimum=1)

    @classmethod
    def identity(cls, d: int, *, sigma=1.0, radius=None, top_k=None, dtype=None):
        """Q = K = V = I_d: the Hegselmann–Krause model on R^d with Gaussian weights."""
        eye = jnp.eye(check_count(d, f"{cls.__name__}.identity d", minimum=1), dtype=dtype)
        cover_finiteness([eye])
        return cls(eye, eye, eye, sigma=sigma, radius=radius, top_k=top_k)

    @classmethod
    def sphere(cls, d: int, *, sigma=1.0, angle=None, top_k=None, dtype=None):
        """Q = K = V = I_d for tokens on S^{d−1} (wrap it in ``tp.Sphere``): the neighbourhood is
        the geodesic ball of radius ``angle`` in (0, π] (None: the whole sphere). For unit vectors
        |x − y| = 2 sin(θ/2), increasing in the angle θ, so it is the chordal radius 2 sin(angle/2);
        the score −|x − y|²/(2σ²) = (⟨x, y⟩ − 1)/σ² is softmax attention at β = 1/σ²."""
        radius = None
        if angle is not None:
            angle = float(check_scalar(angle, f"{cls.__name__}.sphere angle", positive=True))
            if angle > math.pi:
                raise ValueError(f"{cls.__name__}.sphere angle must be in (0, π], got {angle}")
            radius = 2.0 * math.sin(angle / 2)
        return cls.identity(d, sigma=sigma, radius=radius, top_k=top_k, dtype=dtype)

    @property
    def dim(self):
        return matrix_dim(self.V)

    def _block(self, queries, x, weights, t, mask):
        """The field at a block of queries, ``mask`` (m, n) the keys each may see."""
        Q, K, V = (evaluate(p, t) for p in (self.Q, self.K, self.V))
        q, k = queries @ Q.T, x @ K.T
        dist2 = jnp.sum(q * q, 1)[:, None] + jnp.sum(k * k, 1)[None, :] - 2.0 * q @ k.T
        dist2 = jnp.maximum(dist2, 0.0)  # round-off below 0 at coincident points
        live = mask & (weights > 0)[None, :]
        if self.radius is not None:
            live = live & (dist2 <= self.radius ** 2)
        if self.top_k is not None and self.top_k < x.shape[0]:
            # the k-th smallest distance among the live keys; ties at it are all kept
            kth = -jax.lax.top_k(jnp.where(live, -dist2, -jnp.inf), self.top_k)[0][:, -1:]
            live = live & (dist2 <= kth)
        logits = jnp.where(live, -dist2 / (2.0 * self.sigma ** 2), -jnp.inf)
        top = jnp.max(logits, axis=1, keepdims=True)
        e = jnp.where(live, weights[None, :] * jnp.exp(logits - jnp.where(live.any(1, keepdims=True), top, 0.0)), 0.0)
        mass = jnp.sum(e, axis=1, keepdims=True)
        # Σ_j p_j (y_j − x); an empty neighbourhood: no motion
        mean = jnp.where(mass > 0, e @ x, 0.0) / jnp.where(mass > 0, mass, 1.0)
        return jnp.where(mass > 0, mean - queries, 0.0) @ V.T

    def _field(self, queries, x, weights, t, last_key=None):
        """By blocks of ``query_block`` queries; ``last_key`` (m,): query i sees keys j <= it."""
        m, b = queries.shape[0], max(1, min(self.query_block, queries.shape[0]))
        pad = (-m) % b
        last = jnp.full((m,), x.shape[0], dtype=int) if last_key is None else last_key
        qp = jnp.concatenate([queries, jnp.zeros((pad, queries.shape[1]), queries.dtype)])
        lp = jnp.concatenate([last, jnp.full((pad,), -1, dtype=last.dtype)])
        cols = jnp.arange(x.shape[0])

        def one(args):
            qb, lb = args
            return self._block(qb, x, weights, t, cols[None, :] <= lb[:, None])

        out = jax.lax.map(one, (qp.reshape(-1, b, qp.shape[1]), lp.reshape(-1, b)))
        return out.reshape(-1, queries.shape[1])[:m]

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._field(queries, x, weights, t)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        if key_bias is not None:
            weights = weights * jnp.exp(key_bias - jnp.max(key_bias))  # only ratios matter
        return self._field(queries, x, weights, t, query_offset + jnp.arange(queries.shape[0]))
