"""Clusters of tokens: single linkage, masses, clustered pairs (sphere.md §2 and §10).

The published runs count clusters by single linkage with ⟨x_i, x_j⟩ > 0.999 (sphere.md §10);
the authors' phase diagrams also report the fraction of pairs i ≠ j with ⟨x_i, x_j⟩ > 0.999
(``rotf/phase-diagrams.py``, sphere.md §2 "Cluster counting"). All functions work under jit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._types import Points, Weights


def _adjacency(x, threshold, metric):
    if metric == "cosine":
        return (x @ x.T) > threshold
    if metric == "euclidean":
        sq = jnp.sum(x * x, axis=-1)
        return (sq[:, None] + sq[None, :] - 2 * x @ x.T) < threshold**2
    raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}")


def cluster_labels(x: Points, threshold: float = 0.999, *, metric: str = "cosine") -> jax.Array:
    """Connected components of the graph {i ~ j : ⟨x_i, x_j⟩ > threshold}.

    Each token gets the smallest index of its component, so labels are canonical and
    ``labels[i] == i`` marks one representative per cluster. With ``metric="euclidean"``
    the edge rule is |x_i − x_j| < threshold (for tokens in R^d).

    Works under ``jit``: min-label propagation with pointer jumping, O(n²) per sweep and
    O(log n) sweeps for typical graphs (at most n).
    """
    n = x.shape[0]
    adj = _adjacency(x, threshold, metric) | jnp.eye(n, dtype=bool)
    big = jnp.iinfo(jnp.int32).max

    def sweep(state):
        labels, _ = state
        nbr_min = jnp.min(jnp.where(adj, labels[None, :], big), axis=1)
        new = jnp.minimum(labels, nbr_min)
        new = new[new]  # pointer jumping: follow the representative's label
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(lambda s: s[1], sweep, (jnp.arange(n, dtype=jnp.int32), True))
    return labels


def cluster_count(x: Points, threshold: float = 0.999, *, metric: str = "cosine") -> jax.Array:
    """Number of clusters (connected components, see :func:`cluster_labels`)."""
    labels = cluster_labels(x, threshold, metric=metric)
    return jnp.sum(labels == jnp.arange(x.shape[0]))


def cluster_masses(x: Points, threshold: float = 0.999, weights: Weights | None = None, *,
                   metric: str = "cosine") -> jax.Array:
    """Masses m_k of the clusters, sorted in decreasing order and padded with zeros to ``(n,)``.

    m_k = Σ_{i in cluster k} w_i (w_i = 1/n by default), so the masses sum to one and
    ``jnp.sum(masses > 0)`` is :func:`cluster_count`. For well-separated point clusters the
    normalized energy is Σ_k m_k² (sphere.md §2, "Plateau values").
    """
    n = x.shape[0]
    w = jnp.full((n,), 1.0 / n, x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
    labels = cluster_labels(x, threshold, metric=metric)
    masses = jnp.zeros((n,), x.dtype).at[labels].add(w)
    return -jnp.sort(-masses)


def clustered_pair_fraction(x: Points, threshold: float = 0.999) -> jax.Array:
    """Fraction of ordered pairs i ≠ j with ⟨x_i, x_j⟩ > threshold (the authors' "density"
    in their phase diagrams, sphere.md §2 and §10.4); 1 exactly when all tokens are one
    tight cluster. Needs n >= 2."""
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"clustered_pair_fraction needs n >= 2 tokens, got n={n}")
    close = (x @ x.T) > threshold
    return (jnp.sum(close) - jnp.sum(jnp.diagonal(close))) / (n * (n - 1))


def atoms(x, threshold: float = 0.9999):
    """Group tokens into atoms (single linkage ⟨x_i,x_j⟩ > threshold): (positions, masses).

    Positions are the normalized means of each group; masses are token fractions.
    """
    x = np.asarray(x)
    labels = np.asarray(cluster_labels(jnp.asarray(x), threshold))
    reps = np.unique(labels)
    pos = np.stack([x[labels == r].mean(0) for r in reps])
    pos /= np.linalg.norm(pos, axis=1, keepdims=True)
    mass = np.array([(labels == r).mean() for r in reps])
    return pos, mass


def gap_clusters(x, gap) -> int:
    """Clusters of points on the line: split the sorted points where consecutive gaps exceed ``gap``."""
    xs = np.sort(np.asarray(x, dtype=float).ravel())
    return int(1 + np.sum(np.diff(xs) > gap))
