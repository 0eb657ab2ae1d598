"""Clusters of tokens: single linkage, masses, clustered pairs (docs: math/sphere.md#metastability), Rényi centers
(docs: math/causal.md#metastability-and-renyi-parking).

The published runs count clusters by single linkage with ⟨x_i, x_j⟩ > 0.999
(docs: math/sphere.md#clustering-theorems); the authors' phase diagrams also report the fraction of pairs i ≠ j with
⟨x_i, x_j⟩ > 0.999 (``rotf/phase-diagrams.py``, docs: math/sphere.md#metastability). All functions work under jit.

Which pairs are linked is a value, the ``metric``: :class:`Cosine` (⟨x_i, x_j⟩ > threshold, the
default, for unit tokens) or :class:`Euclidean` (|x_i − x_j| < threshold, for tokens in R^d).

The array functions are module-level ``jax.jit`` programs (``metric`` static, ``threshold`` and
``weights`` traced): called outside jit they compile once per shape, dtype and metric, not on every
call (a fresh ``lax.while_loop`` trace per call cost ~0.2 s; the cached call costs ~0.1 ms).
"""

from __future__ import annotations

import abc
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_in_range, check_points, check_scalar, check_weights
from .._types import PointsLike, Scalar, WeightsLike


class AbstractClusterMetric(eqx.Module):
    """Which tokens are linked, at a threshold: single linkage joins linked pairs into clusters."""

    @abc.abstractmethod
    def adjacency(self, x, threshold):
        """The boolean matrix ``(n, n)`` of linked pairs of the tokens ``x`` ``(n, d)``."""

    @abc.abstractmethod
    def check_threshold(self, threshold):
        """The threshold, checked against its meaning for this metric (ValueError / error_if)."""


class Cosine(AbstractClusterMetric):
    """⟨x_i, x_j⟩ > threshold: for unit tokens (the published runs use 0.999,
    docs: math/sphere.md#clustering-theorems)."""

    def adjacency(self, x, threshold):
        return (x @ x.T) > threshold

    def check_threshold(self, threshold):
        # a cosine: >= 1 links no pair (every token its own cluster, even identical ones in
        # float32), < -1 links every pair
        return check_in_range(threshold, "threshold", low=-1.0, high=1.0, high_open=True,
                              meaning="a cosine similarity")


class Euclidean(AbstractClusterMetric):
    """|x_i − x_j| < threshold: for tokens in R^d."""

    def adjacency(self, x, threshold):
        sq = jnp.sum(x * x, axis=-1)
        return (sq[:, None] + sq[None, :] - 2 * x @ x.T) < threshold**2

    def check_threshold(self, threshold):
        return check_in_range(threshold, "threshold", low=0.0, low_open=True, meaning="a distance")


def _checked(x, threshold, metric):
    """Finite tokens ``(n, d)`` (a NaN coordinate would silently split a cluster) and a
    threshold within its meaning for ``metric``; ValueError when concrete, ``eqx.error_if``
    under jit."""
    metric = _check_metric(metric)
    return check_points(x, "x"), metric.check_threshold(threshold)


def _check_metric(metric):
    if not isinstance(metric, AbstractClusterMetric):
        raise ValueError(f"metric must be an AbstractClusterMetric such as Cosine() or Euclidean(), got "
                         f"{metric!r}")
    return metric


COSINE = Cosine()
"""The default metric (a module-level value: defaults are never built per call)."""


def cluster_labels(x: PointsLike, threshold: float | Scalar = 0.999, *, metric=COSINE) -> jax.Array:
    """Connected components of the graph {i ~ j : ⟨x_i, x_j⟩ > threshold}.

    Each token gets the smallest index of its component, so labels are canonical and
    ``labels[i] == i`` marks one representative per cluster. With ``metric=Euclidean()``
    the edge rule is |x_i − x_j| < threshold (for tokens in R^d).

    Works under ``jit``: min-label propagation with pointer jumping, O(n²) per sweep and
    O(log n) sweeps for typical graphs (at most n).
    """
    x, threshold = _checked(x, threshold, metric)
    return _cluster_labels(x, threshold, _check_metric(metric))


@functools.partial(jax.jit, static_argnames="metric")
def _cluster_labels(x, threshold, metric):
    n = x.shape[0]
    adj = metric.adjacency(x, threshold) | jnp.eye(n, dtype=bool)
    big = jnp.iinfo(jnp.int32).max

    def sweep(state):
        labels, _ = state
        nbr_min = jnp.min(jnp.where(adj, labels[None, :], big), axis=1)
        new = jnp.minimum(labels, nbr_min)
        new = new[new]  # pointer jumping: follow the representative's label
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(lambda s: s[1], sweep, (jnp.arange(n, dtype=jnp.int32), True))
    return labels


def cluster_count(x: PointsLike, threshold: float | Scalar = 0.999, *, metric=COSINE) -> jax.Array:
    """Number of clusters (connected components, see :func:`cluster_labels`)."""
    x, threshold = _checked(x, threshold, metric)
    return _cluster_count(x, threshold, _check_metric(metric))


@functools.partial(jax.jit, static_argnames="metric")
def _cluster_count(x, threshold, metric):
    labels = _cluster_labels(x, threshold, metric)
    return jnp.sum(labels == jnp.arange(x.shape[0]))


def cluster_masses(x: PointsLike, threshold: float | Scalar = 0.999, weights: WeightsLike | None = None, *,
                   metric=COSINE) -> jax.Array:
    """Masses m_k of the clusters, sorted in decreasing order and padded with zeros to ``(n,)``.

    m_k = Σ_{i in cluster k} w_i (w_i = 1/n by default), so the masses sum to one and
    ``jnp.sum(masses > 0)`` is :func:`cluster_count`. For well-separated point clusters the
    normalized energy is Σ_k m_k² (docs: math/sphere.md#metastability).
    """
    x, threshold = _checked(x, threshold, metric)
    weights = None if weights is None else check_weights(weights, x.shape[0], x.dtype)
    return _cluster_masses(x, threshold, weights, _check_metric(metric))


@functools.partial(jax.jit, static_argnames="metric")
def _cluster_masses(x, threshold, weights, metric):
    n = x.shape[0]
    w = jnp.full((n,), 1.0 / n, x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
    labels = _cluster_labels(x, threshold, metric)
    masses = jnp.zeros((n,), x.dtype).at[labels].add(w)
    return -jnp.sort(-masses)


def clustered_pair_fraction(x: PointsLike, threshold: float | Scalar = 0.999) -> jax.Array:
    """Fraction of ordered pairs i ≠ j with ⟨x_i, x_j⟩ > threshold (the authors' "density"
    in their phase diagrams, docs: math/sphere.md#metastability); 1 exactly when all tokens are one
    tight cluster. Needs n >= 2."""
    x, threshold = _checked(x, threshold, COSINE)
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"clustered_pair_fraction needs n >= 2 tokens, got n={n}")
    # the division stays outside the compiled count: inside jit XLA may multiply by the
    # reciprocal, one ulp away from the eager quotient
    return _clustered_pair_count(x, threshold) / (n * (n - 1))


@jax.jit
def _clustered_pair_count(x, threshold):
    close = (x @ x.T) > threshold
    return jnp.sum(close) - jnp.sum(jnp.diagonal(close))


def atoms(x, threshold: float | Scalar = 0.9999):
    """Group tokens into atoms (single linkage ⟨x_i,x_j⟩ > threshold): (positions, masses).

    Positions are the normalized means of each group; masses are token fractions.
    """
    x = np.asarray(check_points(x, "x"))
    labels = np.asarray(cluster_labels(jnp.asarray(x), threshold))
    reps = np.unique(labels)
    pos = np.stack([x[labels == r].mean(0) for r in reps])
    pos /= np.linalg.norm(pos, axis=1, keepdims=True)
    mass = np.array([(labels == r).mean() for r in reps])
    return pos, mass


def renyi_centers(x, delta):
    r"""Strong Rényi centers of a token sequence: indices s with dist(x_s, x_i) > δ for all i < s.

    Geodesic distance on the sphere (arccos of the inner product). Returns a boolean mask. Their
    expected number for uniform tokens (Rényi parking, docs: math/causal.md#metastability-and-renyi-parking) is
    :func:`transformer_pde.theory.causal_clustering.expected_renyi_centers`.
    """
    x = check_points(x, "x")
    delta = check_scalar(delta, "delta", nonnegative=True)
    n = x.shape[0]
    ang = jnp.arccos(jnp.clip(x @ x.T, -1.0, 1.0))
    earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
    return ~jnp.any(earlier & (ang <= delta), axis=1)


__all__ = ["AbstractClusterMetric", "Cosine", "Euclidean", "atoms", "cluster_count", "cluster_labels",
           "cluster_masses", "clustered_pair_fraction", "renyi_centers"]
