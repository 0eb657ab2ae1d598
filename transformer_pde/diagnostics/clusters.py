"""Cluster detection by single linkage (sphere.md §10: ⟨x_i, x_j⟩ > 0.999)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._types import Points


def cluster_labels(x: Points, threshold: float = 0.999, *, metric: str = "cosine") -> jax.Array:
    """Connected components of the graph {i ~ j : ⟨x_i, x_j⟩ > threshold}.

    Each token gets the smallest index of its component, so labels are canonical and
    ``labels[i] == i`` marks one representative per cluster. With ``metric="euclidean"``
    the edge rule is |x_i − x_j| < threshold (for tokens in R^d).

    Works under ``jit``: min-label propagation with pointer jumping, O(n²) per sweep and
    O(log n) sweeps for typical graphs (at most n).
    """
    n = x.shape[0]
    if metric == "cosine":
        adj = (x @ x.T) > threshold
    elif metric == "euclidean":
        sq = jnp.sum(x * x, axis=-1)
        adj = (sq[:, None] + sq[None, :] - 2 * x @ x.T) < threshold**2
    else:
        raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}")
    adj = adj | jnp.eye(n, dtype=bool)
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
