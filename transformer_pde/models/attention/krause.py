"""Krause (bounded-confidence) attention: Gaussian scores restricted to a radius and/or the top-k
keys, a softmax over the kept keys, each token moving toward their mean
(docs: math/attention.md#krause-attention); can be made causal by :class:`~transformer_pde.Causal`."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import check_count, check_points, check_scalar, check_weights, cover_finiteness
from ..._types import Param, PointsLike, QueriesLike, WeightsLike
from ...kernels.exact import AbstractLayout, check_layout
from ...kernels.spatial import SpatialTiles, morton_order, near_tiles, tile_boxes
from ...params import bilinear_params, evaluate, matrix_dim, scalar_param
from .base import AbstractMaskableAttention

KRAUSE_LAYOUT = SpatialTiles()
"""Krause attention's default layout: dense up to 512 x 512 pairs, then 128 x 128 tiles of
queries and keys sorted along a Morton curve, a key tile computed only for the query tiles
within the radius of it (every tile without a radius). Small tiles have tight boxes, so more of
them are skipped (benchmarks/README.md#krause-attention-at-large-n)."""


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
        layout: how the m x n pairs are visited (``tp.kernels.Dense()``: the scores at once;
            ``tp.kernels.Streaming(key_block, query_block)``: tiles of queries against tiles of keys,
            memory O(query_block · key_block · d), never O(mn), time O(mn);
            ``tp.kernels.SpatialTiles(tiles)``: the tiles of ``tiles`` over queries and keys sorted
            along a Morton curve, a key tile skipped by every query tile whose bounding box lies
            farther than ``radius`` from its own, time O(n · neighbours) for a small radius). The
            default, ``KRAUSE_LAYOUT``, is dense up to 512 x 512 pairs and spatial 128 x 128
            tiles above. With ``top_k`` and no radius no tile can be skipped (the k nearest keys
            may lie anywhere): every tile is visited, as with ``Streaming``.

    :meth:`sphere` gives the geodesic neighbourhood on S^{d−1} (its chordal radius bounds the
    tiles' boxes in R^d). Exact on every layout: the streamed ones merge each query's running
    top-k over the key tiles (ties at the k-th distance kept as in the dense path: the set does not
    depend on the order of the keys, so the spatial sort changes no neighbourhood) and accumulate
    the masked softmax with a running maximum; the tiles change only the order of the sums.
    :meth:`tile_visits` counts the tile pairs computed. Causal: ``tp.Causal(KrauseAttention(...))``
    (no ALiBi: the velocity is not a plain average of values).
    """

    Q: Param
    K: Param
    V: Param
    sigma: jax.Array
    radius: jax.Array | None
    top_k: int | None = eqx.field(static=True)
    layout: AbstractLayout = eqx.field(static=True)

    def __init__(self, Q, K, V, *, sigma=1.0, radius=None, top_k=None, layout=KRAUSE_LAYOUT):
        name = type(self).__name__
        self.Q, self.K, self.V, _ = bilinear_params(name, Q, K, V, 1.0)  # a placeholder β: none is used
        self.sigma = scalar_param(check_scalar(sigma, f"{name}.sigma", positive=True), f"{name}.sigma")
        self.radius = None if radius is None else scalar_param(
            check_scalar(radius, f"{name}.radius", positive=True), f"{name}.radius")
        self.top_k = None if top_k is None else check_count(top_k, f"{name}.top_k", minimum=1)
        self.layout = check_layout(layout, f"{name}.layout")

    @classmethod
    def identity(cls, d: int, *, sigma=1.0, radius=None, top_k=None, layout=KRAUSE_LAYOUT,
                 dtype=None):
        """Q = K = V = I_d: the Hegselmann–Krause model on R^d with Gaussian weights."""
        eye = jnp.eye(check_count(d, f"{cls.__name__}.identity d", minimum=1), dtype=dtype)
        cover_finiteness([eye])
        return cls(eye, eye, eye, sigma=sigma, radius=radius, top_k=top_k, layout=layout)

    @classmethod
    def sphere(cls, d: int, *, sigma=1.0, angle=None, top_k=None, layout=KRAUSE_LAYOUT,
               dtype=None):
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
        return cls.identity(d, sigma=sigma, radius=radius, top_k=top_k, layout=layout, dtype=dtype)

    @property
    def dim(self):
        return matrix_dim(self.V)

    def _scores(self, q, k):
        """|q_i − k_j|² per pair, summed over the coordinates of the difference: the same
        arithmetic for a pair in any tile (so dense and streamed paths see the same ties), and
        no cancellation at close points (|q|² + |k|² − 2q·k loses them)."""
        return jnp.sum((q[:, None, :] - k[None, :, :]) ** 2, axis=-1)

    def _live(self, dist2, weights, mask):
        live = mask & (weights > 0)[None, :]
        if self.radius is not None:
            live = live & (dist2 <= self.radius ** 2)
        return live

    def _block(self, q, k, x, weights, mask):
        """The field at a block of queries (projected ``q``) against all keys, dense (m, n)."""
        dist2 = self._scores(q, k)
        live = self._live(dist2, weights, mask)
        if self.top_k is not None and self.top_k < x.shape[0]:
            # the k-th smallest distance among the live keys; ties at it are all kept
            kth = -jax.lax.top_k(jnp.where(live, -dist2, -jnp.inf), self.top_k)[0][:, -1:]
            live = live & (dist2 <= kth)
        logits = jnp.where(live, -dist2 / (2.0 * self.sigma ** 2), -jnp.inf)
        top = jnp.max(logits, axis=1, keepdims=True)
        e = jnp.where(live, weights[None, :] * jnp.exp(logits - jnp.where(live.any(1, keepdims=True), top, 0.0)), 0.0)
        return e @ x, jnp.sum(e, axis=1, keepdims=True)

    def _streamed(self, q, last, tiles, visit):
        """The sums for one block of queries over ``tiles`` (keys, values, masses, original key
        indices, each cut in tiles of kb), never the (m, n) scores: a first pass keeps each
        query's ``top_k`` smallest live distances (a running merge, so the k-th and its ties are
        those of the dense path), a second accumulates the masked softmax with a running maximum
        (flash-attention rescaling: the scores are <= 0 but may all underflow). ``visit``
        (tiles,): the key tiles to compute (``lax.cond``; a skipped one holds no live key), or
        None: all. Also returns the number of key tiles computed."""
        n = tiles[0].shape[0] * tiles[0].shape[1]

        def over_tiles(body, init):
            if visit is None:
                return jax.lax.scan(lambda c, tile: (body(c, tile), None), init, tiles)[0]

            def step(c, visit_tile):
                return jax.lax.cond(visit_tile[0], body, lambda c, _: c, c, visit_tile[1]), None

            return jax.lax.scan(step, init, (visit, tiles))[0]

        def live_tile(kj, wj, cj):
            dist2 = self._scores(q, kj)
            return dist2, self._live(dist2, wj, cj[None, :] <= last[:, None])

        kth = jnp.full((q.shape[0], 1), jnp.inf, q.dtype)
        if self.top_k is not None and self.top_k < n:
            def merge(best, tile):
                kj, _, wj, cj = tile
                dist2, live = live_tile(kj, wj, cj)
                both = jnp.concatenate([best, jnp.where(live, dist2, jnp.inf)], axis=1)
                return -jax.lax.top_k(-both, self.top_k)[0]

            # the k-th: inf when fewer than top_k keys are live (all live kept)
            kth = over_tiles(merge, jnp.full((q.shape[0], self.top_k), jnp.inf, q.dtype))[:, -1:]

        def accumulate(carry, tile):
            mx, mass, acc, count = carry
            kj, xj, wj, cj = tile
            dist2, live = live_tile(kj, wj, cj)
            live = live & (dist2 <= kth)
            logits = jnp.where(live, -dist2 / (2.0 * self.sigma ** 2), -jnp.inf)
            new = jnp.maximum(mx, jnp.max(logits, axis=1, keepdims=True))
            shift = jnp.where(jnp.isfinite(new), new, 0.0)
            scale = jnp.where(jnp.isfinite(mx), jnp.exp(mx - shift), 0.0)
            e = jnp.where(live, wj[None, :] * jnp.exp(logits - shift), 0.0)
            return new, mass * scale + jnp.sum(e, axis=1, keepdims=True), acc * scale + e @ xj, count + 1

        m, d = q.shape[0], tiles[1].shape[2]
        init = (jnp.full((m, 1), -jnp.inf, q.dtype), jnp.zeros((m, 1), q.dtype),
                jnp.zeros((m, d), tiles[1].dtype), jnp.zeros((), jnp.int32))
        _, mass, acc, count = over_tiles(accumulate, init)
        return acc, mass, count

    def _tiled(self, q, k, x, weights, last, blocks):
        """The streamed sums: queries in blocks of qb (``lax.map``) against keys in tiles of kb;
        with ``SpatialTiles`` and a radius, both sorted along a Morton curve and only the key
        tiles near each query tile computed (the sums put back in the queries' order)."""
        (qb, kb), m, n = blocks, q.shape[0], k.shape[0]
        index = jnp.arange(n)
        skip = isinstance(self.layout, SpatialTiles) and self.radius is not None
        if skip:
            both = jnp.concatenate([q, k])
            lo, hi = jnp.min(both, axis=0), jnp.max(both, axis=0)
            qorder, korder = morton_order(q, lo, hi), morton_order(k, lo, hi)
            q, last = q[qorder], last[qorder]
            k, x, weights, index = k[korder], x[korder], weights[korder], index[korder]

        def tiles(a, size, fill):
            pad = (-a.shape[0]) % size
            a = jnp.concatenate([a, jnp.full((pad,) + a.shape[1:], fill, a.dtype)])
            return a.reshape((-1, size) + a.shape[1:])

        # padded keys have mass 0 and padded queries see no key (last = -1): never live
        key_tiles = (tiles(k, kb, 0.0), tiles(x, kb, 0.0), tiles(weights, kb, 0.0), tiles(index, kb, n))
        qt, lt = tiles(q, qb, 0.0), tiles(last, qb, -1)
        if skip:
            qboxes = tile_boxes(qt, tiles(jnp.ones(m, bool), qb, False))
            kboxes, first = tile_boxes(key_tiles[0], tiles(jnp.ones(n, bool), kb, False)), jnp.min(key_tiles[3], axis=1)

            def near(qlo, qhi, lj):  # one query tile's row, not the (qt, kt) matrix: memory O(n / kb)
                # causal: a key tile whose first key comes after every query's last is empty too
                return near_tiles((qlo[None], qhi[None]), kboxes, self.radius)[0] & (first <= jnp.max(lj))

            total, mass, count = jax.lax.map(
                lambda a: self._streamed(a[0], a[1], key_tiles, near(a[2], a[3], a[1])), (qt, lt, *qboxes))
        else:
            total, mass, count = jax.lax.map(lambda a: self._streamed(a[0], a[1], key_tiles, None), (qt, lt))
        total, mass = total.reshape(-1, x.shape[1])[:m], mass.reshape(-1, 1)[:m]
        if skip:
            total, mass = (jnp.zeros_like(a).at[qorder].set(a) for a in (total, mass))
        return total, mass, jnp.sum(count), qt.shape[0] * key_tiles[0].shape[0]

    def _field_and_visits(self, queries, x, weights, t, last_key=None):
        """The field and the (query tile, key tile) pairs computed, dense or tiled as ``layout``
        decides; ``last_key`` (m,): query i sees keys j <= it."""
        Q, K, V = (evaluate(p, t) for p in (self.Q, self.K, self.V))
        m, n = queries.shape[0], x.shape[0]
        last = jnp.full((m,), n, dtype=int) if last_key is None else last_key
        q, k = queries @ Q.T, x @ K.T
        blocks = self.layout.blocks(m, n, k.shape[1])
        if blocks is None:
            total, mass = self._block(q, k, x, weights, jnp.arange(n)[None, :] <= last[:, None])
            visits, pairs = jnp.ones((), jnp.int32), 1
        else:
            total, mass, visits, pairs = self._tiled(q, k, x, weights, last, blocks)
        # Σ_j p_j (y_j − x); an empty neighbourhood: no motion
        mean = jnp.where(mass > 0, total, 0.0) / jnp.where(mass > 0, mass, 1.0)
        return jnp.where(mass > 0, mean - queries, 0.0) @ V.T, visits, pairs

    def _field(self, queries, x, weights, t, last_key=None):
        return self._field_and_visits(queries, x, weights, t, last_key)[0]

    def tile_visits(self, queries: QueriesLike, x: PointsLike, weights: WeightsLike | None = None,
                    t=0.0) -> tuple[jax.Array, int]:
        """The (query tile, key tile) pairs that :meth:`field` at ``queries`` computes, counted
        inside the kernel's computed branch, and all the pairs of tiles (the dense layout: one
        tile, ``(1, 1)``). With ``tp.kernels.SpatialTiles`` and a radius the first is below the
        second as soon as some tiles lie farther apart than the radius."""
        x = self.check_state(x, "x")
        queries = check_points(queries, "queries", x.shape[1])
        w = check_weights(weights, x.shape[0], x.dtype)
        check_scalar(t, "t")
        _, visits, pairs = self._field_and_visits(queries, x, w, jnp.asarray(t, x.dtype))
        return visits, pairs

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._field(queries, x, weights, t)

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        if key_bias is not None:
            weights = weights * jnp.exp(key_bias - jnp.max(key_bias))  # only ratios matter
        return self._field(queries, x, weights, t, query_offset + jnp.arange(queries.shape[0]))
