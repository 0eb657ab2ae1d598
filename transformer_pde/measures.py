"""Measures the solver evolves: weighted empirical measures (arrays) and Gaussians."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import as_float_array, check_finite, is_concrete


class Gaussian(eqx.Module):
    """A Gaussian measure N(mean, cov) (euclidean.md §4): the state of the Gaussian closure.

    Args:
        mean: shape ``(d,)``.
        cov: shape ``(d, d)``, symmetric positive definite.
    """

    mean: jax.Array
    cov: jax.Array

    def __init__(self, mean, cov):
        mean = check_finite(as_float_array(mean, "Gaussian.mean"), "Gaussian.mean")
        cov = check_finite(as_float_array(cov, "Gaussian.cov"), "Gaussian.cov")
        if mean.ndim != 1:
            raise ValueError(f"Gaussian.mean must have shape (d,), got {mean.shape}")
        d = mean.shape[0]
        if cov.shape != (d, d):
            raise ValueError(f"Gaussian.cov must have shape ({d}, {d}) to match mean, got {cov.shape}")
        if is_concrete(cov):
            c = np.asarray(cov, dtype=np.float64)
            asym = np.max(np.abs(c - c.T)) if d else 0.0
            scale = max(np.max(np.abs(c)), 1e-300)
            if asym > 1e-6 * scale:
                raise ValueError(f"Gaussian.cov must be symmetric, but max|cov - cov.T| = {asym:.3g}")
            lam = np.linalg.eigvalsh((c + c.T) / 2)
            # singular up to round-off counts as singular: the closure needs cov^{-1}
            tol = d * np.finfo(np.dtype(cov.dtype)).eps * max(abs(lam[-1]), 1e-300)
            if lam[0] <= tol:
                raise ValueError(f"Gaussian.cov must be positive definite, but its smallest "
                                 f"eigenvalue is {lam[0]:.6g} (needs > {tol:.3g}, relative to "
                                 f"the largest {lam[-1]:.6g})")
        self.mean = mean
        self.cov = cov

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def sample(self, key, n: int):
        """n i.i.d. samples, shape ``(n, d)``."""
        if int(n) < 1:
            raise ValueError(f"Gaussian.sample needs n >= 1, got n={n}")
        L = jnp.linalg.cholesky(self.cov)
        z = jax.random.normal(key, (n, self.dim), dtype=self.mean.dtype)
        return self.mean[None, :] + z @ L.T

    def gauss_hermite(self, order: int):
        """Tensor Gauss–Hermite quadrature: ``(points (order**d, d), weights (order**d,))``.

        x = mean + L z with L Lᵀ = cov and z on the tensor grid of the probabilists' Hermite
        nodes: integrates polynomials of degree <= 2*order - 1 in each coordinate exactly
        against N(mean, cov). The weighted empirical measure Σ w_i δ_{x_i} is then a state of
        the particle solver (``tp.solve(attn, x, weights=w)``) whose moments follow the
        Gaussian closure to quadrature accuracy (euclidean.md §1, weighted measures).
        """
        if int(order) < 1:
            raise ValueError(f"Gauss–Hermite order must be >= 1, got {order}")
        if int(order) ** self.dim > 10**7:
            raise ValueError(f"order**d = {int(order)}**{self.dim} points is too many for a tensor "
                             "grid; lower the order")
        z, w = np.polynomial.hermite_e.hermegauss(int(order))  # weight e^{-z^2/2}
        w = w / w.sum()
        grids = np.meshgrid(*([z] * self.dim), indexing="ij")
        pts = np.stack([g.ravel() for g in grids], axis=-1)
        wts = np.ones(pts.shape[0])
        for ws in np.meshgrid(*([w] * self.dim), indexing="ij"):
            wts = wts * ws.ravel()
        L = jnp.linalg.cholesky(self.cov)
        x = self.mean[None, :] + jnp.asarray(pts, self.mean.dtype) @ L.T
        return x, jnp.asarray(wts / wts.sum(), self.mean.dtype)


def cap_sample(key, center, n: int, spread: float):
    """n points on S^{d-1} near ``center``: normalize(center + spread · Gaussian)."""
    center = jnp.asarray(center)
    center = center / jnp.linalg.norm(center)
    z = center[None, :] + spread * jax.random.normal(key, (n, center.shape[0]), center.dtype)
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)
