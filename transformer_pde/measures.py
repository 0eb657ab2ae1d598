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
(compare the evolved rule with a coarser one). An order whose rule has more than
:data:`MAX_NODES` nodes is refused before any is allocated; a density must return real,
finite, non-negative values (a complex one is refused, not cast).
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

MAX_NODES = 10**7
"""The most nodes a rule allocates (every rule checks ``num_nodes(order)`` against it first)."""


def _order(order, name="order") -> int:
    """The number of nodes: an integer >= 1 (an integral float counts; NaN, inf, a fraction, a
    string or bool is refused naming ``name``)."""
    m = check_count(order, name)
    if m < 1:
        raise ValueError(f"a quadrature rule needs {name} >= 1 nodes, got {order!r}")
    return m


def _density_values(density: Callable, points: np.ndarray, where: str) -> np.ndarray:
    """``density(points)`` as float64, checked: real (a complex value is refused, not cast), one
    value per point, finite, non-negative."""
    raw = np.asarray(density(jnp.asarray(points)))
    if raw.dtype.kind not in "biuf":
        raise ValueError(f"the density must return real values, got dtype {raw.dtype} at the nodes of the "
                         f"{where} rule (a complex density is not cast to real: return its real part or modulus)")
    v = raw.astype(np.float64)
    if v.shape != points.shape[:1]:
        raise ValueError(f"the density must return one value per point, shape {points.shape[:1]}, got "
                         f"shape {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"the density is not finite at every node of the {where} rule")
    if (v < 0).any():
        raise ValueError(f"the density is negative at a node of the {where} rule (min {v.min():.3g})")
    return v


def _reweight(base_weights, values, where: str):
    """w_j ∝ base_j · values_j (values from :func:`_density_values`), with positive total (a
    normalizable density)."""
    w = base_weights * values
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
    def num_nodes(self, order: int) -> int:
        """The number of nodes of the rule of ``order`` (checked against :data:`MAX_NODES` before
        any is allocated)."""

    @abc.abstractmethod
    def _points(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """The nodes of a checked ``order`` (see :meth:`nodes`)."""

    def check_order(self, order, name: str = "order") -> int:
        """``order`` as an int, refused naming ``name`` unless >= 1 and its rule has at most
        :data:`MAX_NODES` nodes (checked before anything is allocated)."""
        m = _order(order, name)
        n = self.num_nodes(m)
        if n > MAX_NODES:
            raise ValueError(f"{type(self).__name__}: {name}={order!r} gives {n} nodes, more than the "
                             f"{MAX_NODES} a rule allocates; lower the {name}")
        return m

    def nodes(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """``(points (m, dim), base weights (m,))``, float64, weights summing to 1; an order whose
        rule has more than :data:`MAX_NODES` nodes is refused naming it."""
        return self._points(self.check_order(order))

    def density_weights(self, density: Callable, points: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The weights of the rule for ``density`` (a value at points, relative to the reference
        measure; normalized here)."""
        where = type(self).__name__
        return _reweight(weights, _density_values(density, points, where), where)

    def __call__(self, density: Callable | None, order: int, dtype=jnp.float64) -> Particles:
        """The weighted tokens of the rule of ``order`` for ``density`` (None: the base measure)."""
        pts, w = self.nodes(order)
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

    def num_nodes(self, order):
        return order

    def _points(self, m):
        th = 2 * np.pi * (np.arange(m) + self.offset) / m
        return np.stack([np.cos(th), np.sin(th)], -1), np.full(m, 1.0 / m)


class SphereRule(AbstractRule):
    r"""Gauss–Legendre in cos ϑ (``order`` nodes) times the trapezoid rule in φ (2·``order``
    nodes) on S² ⊂ R³: 2·order² points, exact for polynomials of degree <= 2·order − 1 on the
    sphere. Densities are relative to the uniform law (e.g. e^{κ⟨c, x⟩} for a von Mises–Fisher cap)."""

    @property
    def dim(self) -> int:
        return 3

    def num_nodes(self, order):
        return 2 * order**2

    def _points(self, m):
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

    def num_nodes(self, order):
        return order**self.dim

    def _points(self, m):
        x, w = Gaussian(self.mean, self.cov).gauss_hermite(m)
        return np.asarray(x, np.float64), np.asarray(w, np.float64)

    def density_weights(self, density, points, weights):
        mean, cov = np.asarray(self.mean, np.float64), np.asarray(self.cov, np.float64)
        r = points - mean
        quad = np.einsum("ni,ij,nj->n", r, np.linalg.inv(cov), r)
        _, logdet = np.linalg.slogdet(2 * np.pi * cov)
        rho = _density_values(density, points, "Gauss–Hermite")
        # ρ/φ in logs, scaled by its largest value: 1/φ overflows on far nodes where ρ may be 0,
        # and ρ·(1/φ) there would be 0·inf; the scale cancels in the normalization
        with np.errstate(divide="ignore"):
            log_ratio = np.where(rho > 0, np.log(rho), -np.inf) + 0.5 * quad + 0.5 * logdet
        top = np.max(log_ratio)
        ratio = np.exp(log_ratio - top) if np.isfinite(top) else np.zeros_like(rho)
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


__all__ = ["AbstractRule", "CircleRule", "GaussHermiteRule", "MAX_NODES", "SphereRule", "refinement_orders"]
