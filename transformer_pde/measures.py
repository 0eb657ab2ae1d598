r"""Measures given by quadrature rules: deterministic initial measures and mean-field references
(docs: math/mean_field.md#quadrature-references).

The mean-field flow carries a quadrature rule: μ_0 ≈ Σ_j w_j δ_{y_j} evolved as weighted tokens
(``tp.Particles(y, w)`` under ``tp.solve``) integrates f∘Φ_t with the rule's error, not the Monte
Carlo n^{-1/2}, as long as the flow map Φ_t stays smooth. A rule is a base measure and its nodes;
a density (a value at points, unnormalized) reweights it:

* :class:`CircleRule`: S¹, the trapezoid rule θ_j = 2πj/m (spectral for smooth periodic data).
* :class:`SphereRule`: S², Gauss–Legendre in cos ϑ times the trapezoid rule in φ (``order``
  Legendre nodes, ``2·order`` angles: exact on spherical harmonics of degree <= 2·order − 1).
* :class:`GaussHermiteRule`: R^d, d <= 3, tensor Gauss–Hermite of N(mean, cov)
  (:meth:`Gaussian.gauss_hermite`); another density is the mapped rule w_j ∝ w_j^{GH} ρ(y_j)/φ(y_j)
  (exact for ρ a Gaussian times a polynomial; requires ρ to decay faster than φ).

``rule(density, order)`` returns the weighted tokens; its error is estimated by refinement
(compare the evolved rule with a coarser one).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._checks import check_count, check_scalar
from .solvers.states import Gaussian, Particles


def _order(order, name="order") -> int:
    """The number of nodes: an integer >= 1 (an integral float counts; NaN, inf, a fraction, a
    string or bool is refused naming ``name``)."""
    m = check_count(order, name)
    if m < 1:
        raise ValueError(f"a quadrature rule needs {name} >= 1 nodes, got {order!r}")
    return m


def _reweight(base_weights, values, where: str):
    """w_j ∝ base_j · values_j, checked: finite, non-negative, with positive total (a
    normalizable density)."""
    v = np.asarray(values, dtype=np.float64)
    if v.shape != base_weights.shape:
        raise ValueError(f"the density must return one value per point, shape {base_weights.shape}, got "
                         f"shape {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"the density is not finite at every node of the {where} rule")
    if (v < 0).any():
        raise ValueError(f"the density is negative at a node of the {where} rule (min {v.min():.3g})")
    w = base_weights * v
    total = w.sum()
    if not total > 0:
        raise ValueError(f"the density is not normalizable on the {where} rule: it integrates to {total!r}")
    return w / total


class AbstractRule(eqx.Module):
    """A quadrature rule for a base probability measure on a domain of R^dim; a density relative
    to the base's reference measure reweights it (:meth:`__call__`)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The dimension of the tokens (ambient)."""

    @abc.abstractmethod
    def nodes(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """``(points (m, dim), base weights (m,))``, float64, weights summing to 1."""

    def density_weights(self, density: Callable, points: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The weights of the rule for ``density`` (a value at points, relative to the reference
        measure; normalized here)."""
        return _reweight(weights, density(jnp.asarray(points)), type(self).__name__)

    def __call__(self, density: Callable | None, order: int, dtype=jnp.float64) -> Particles:
        """The weighted tokens of the rule of ``order`` for ``density`` (None: the base measure)."""
        pts, w = self.nodes(_order(order))
        if density is not None:
            w = self.density_weights(density, pts, w)
        return Particles(jnp.asarray(pts, dtype), jnp.asarray(w, dtype))


class CircleRule(AbstractRule):
    r"""The trapezoid rule on S¹: θ_j = 2πj/m + ``offset``·2π/m, equal base weights (the uniform
    law); error O(e^{−c m}) for analytic periodic integrands. Densities are relative to the uniform
    law (e.g. 1 + ε cos kθ). ``order`` = m, the number of nodes."""

    offset: float = 0.0

    def __check_init__(self):
        check_scalar(self.offset, "CircleRule.offset")

    @property
    def dim(self) -> int:
        return 2

    def nodes(self, order):
        m = _order(order)
        th = 2 * np.pi * (np.arange(m) + self.offset) / m
        return np.stack([np.cos(th), np.sin(th)], -1), np.full(m, 1.0 / m)


class SphereRule(AbstractRule):
    r"""Gauss–Legendre in cos ϑ (``order`` nodes) times the trapezoid rule in φ (2·``order``
    nodes) on S² ⊂ R³: 2·order² points, exact for polynomials of degree <= 2·order − 1 on the
    sphere. Densities are relative to the uniform law (e.g. e^{κ⟨c, x⟩} for a von Mises–Fisher cap)."""

    @property
    def dim(self) -> int:
        return 3

    def nodes(self, order):
        m = _order(order)
        u, wu = np.polynomial.legendre.leggauss(m)  # u = cos ϑ, ∫_{-1}^1 du = 2
        phi = 2 * np.pi * (np.arange(2 * m) + 0.5) / (2 * m)
        U, P = np.meshgrid(u, phi, indexing="ij")
        s = np.sqrt(1 - U**2)
        pts = np.stack([s * np.cos(P), s * np.sin(P), U], -1).reshape(-1, 3)
        w = np.repeat(wu / 2, 2 * m) / (2 * m)
        return pts, w / w.sum()


class GaussHermiteRule(AbstractRule):
    r"""Tensor Gauss–Hermite rule of N(``mean``, ``cov``) on R^d, d <= 3 (``order`` nodes per
    axis, :meth:`Gaussian.gauss_hermite`). A density ρ (relative to Lebesgue, unnormalized) maps
    it, w_j ∝ w_j^{GH} ρ(y_j)/φ(y_j) with φ the N(mean, cov) density: exact when ρ/φ is a
    polynomial of degree <= 2·order − 1 per axis; ρ must decay faster than φ (at order >= 8 a
    rule that puts more than 1e-3 of the mass on its outermost nodes is refused: ρ is not resolved,
    or not normalizable)."""

    mean: jnp.ndarray
    cov: jnp.ndarray

    def __init__(self, mean, cov):
        g = Gaussian(mean, cov)
        if g.dim > 3:
            raise ValueError(f"tensor Gauss–Hermite references are for d <= 3, got d={g.dim}")
        self.mean, self.cov = g.mean, g.cov

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def nodes(self, order):
        x, w = Gaussian(self.mean, self.cov).gauss_hermite(_order(order))
        return np.asarray(x, np.float64), np.asarray(w, np.float64)

    def density_weights(self, density, points, weights):
        mean, cov = np.asarray(self.mean, np.float64), np.asarray(self.cov, np.float64)
        r = points - mean
        quad = np.einsum("ni,ij,nj->n", r, np.linalg.inv(cov), r)
        _, logdet = np.linalg.slogdet(2 * np.pi * cov)
        rho = np.asarray(density(jnp.asarray(points)), np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            ratio = rho * np.exp(0.5 * quad + 0.5 * logdet)  # ρ / φ
        w = _reweight(weights, ratio, "Gauss–Hermite")
        order = round(len(weights) ** (1.0 / self.dim))
        if order >= 8:
            z = np.linalg.solve(np.linalg.cholesky(cov), r.T).T
            outer = np.isclose(np.max(np.abs(z), axis=1), np.max(np.abs(z)))
            if w[outer].sum() > 1e-3:
                raise ValueError(f"the density is not resolved by the Gauss–Hermite rule of N(mean, cov): "
                                 f"{w[outer].sum():.3g} of its mass sits on the outermost nodes (it decays "
                                 "no faster than the Gaussian, or is not normalizable); widen cov")
        return w


def refinement_orders(order: int, rule: AbstractRule) -> tuple[int, int]:
    """``(order, coarse)``: the reference order and the coarser one its error is estimated
    against (order·2/3 rounded, at least 1; the trapezoid rule on S¹ halves m)."""
    order = _order(order)
    if order < 2:
        raise ValueError(f"a refinement check needs order >= 2, got {order}")
    coarse = order // 2 if isinstance(rule, CircleRule) else max(1, math.ceil(2 * order / 3))
    return order, min(coarse, order - 1)


__all__ = ["AbstractRule", "CircleRule", "GaussHermiteRule", "SphereRule", "refinement_orders"]
