"""Moments of a weighted empirical measure (euclidean.md §4; sphere.md §5)."""

from __future__ import annotations

import jax.numpy as jnp

from .._linalg import symmetrize


def empirical_moments(x, weights=None):
    """Mean ``(d,)`` and covariance ``(d, d)`` of Σ_j w_j δ_{x_j} (population normalization)."""
    w = jnp.full(x.shape[:1], 1.0 / x.shape[0], x.dtype) if weights is None else weights
    m = w @ x
    xc = x - m[None, :]
    return m, symmetrize((xc * w[:, None]).T @ xc)


def mean_overlap(x):
    """m = |x̄|² = n^{-2} Σ_{ij} ⟨x_i, x_j⟩ (last two axes are tokens × dimension; sphere.md §5)."""
    return jnp.sum(jnp.mean(x, axis=-2) ** 2, axis=-1)


__all__ = ["empirical_moments", "mean_overlap"]
