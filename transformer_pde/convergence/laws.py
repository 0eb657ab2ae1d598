r"""The initial laws a study starts from; each owns its mean-field reference (:meth:`AbstractLaw.reference`).

* :class:`GaussianLaw` (a ``tp.Gaussian``) under a dynamics with a Gaussian closure: the closure.
* :class:`StationaryLaw`, a law whose mean field vanishes: itself, exact at every n.
* :class:`QuadratureLaw`, a smooth law given by its density: a quadrature rule evolved as
  weighted tokens (:mod:`transformer_pde.measures`).
* :class:`SampledLaw` (a sampler ``(key, n) -> (n, d)``), any dynamics: a large particle system.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_count, check_in_range, check_real, check_scalar
from ..measures import MAX_NODES, AbstractRule, CircleRule, GaussHermiteRule, SphereRule, refinement_orders
from ..models.base import AbstractDynamics
from ..models.sphere import uniform_sphere
from ..solvers import Gaussian, Particles
from .references import (
    AbstractMeanFieldReference,
    GaussianClosureReference,
    ParticleReference,
    QuadratureReference,
    StationaryReference,
    gaussian_affine_field,
)

#: the key of a particle reference's own sample
REFERENCE_KEY = 2**31 - 1


class AbstractLaw(abc.ABC):
    """An initial law μ_0 of a study, which knows the mean field it is compared with."""

    @abc.abstractmethod
    def reference(self, dynamics: AbstractDynamics, n_ref: int, dtype) -> AbstractMeanFieldReference:
        """The mean-field reference of this law under ``dynamics`` in ``dtype`` (``n_ref``: the size
        of a particle reference, where the law has one)."""


@dataclasses.dataclass(frozen=True)
class GaussianLaw(AbstractLaw):
    """A Gaussian law ``tp.Gaussian(mean, cov)``: its reference is the Gaussian closure of the
    dynamics (which must have one), :class:`GaussianClosureReference`."""

    law: Gaussian

    def __post_init__(self):
        if not isinstance(self.law, Gaussian):
            raise ValueError(f"law must be a tp.Gaussian(mean, cov), got {type(self.law).__name__} {self.law!r}"[:300])

    def reference(self, dynamics, n_ref, dtype):
        law = self.law
        if dynamics.dim is not None and dynamics.dim != law.dim:
            raise ValueError(f"the Gaussian has dimension {law.dim} but the dynamics act on d={dynamics.dim}")
        gaussian_affine_field(dynamics, law.mean, law.cov)  # raises early if there is no closure
        return GaussianClosureReference(law.mean.astype(dtype), law.cov.astype(dtype))


@dataclasses.dataclass(frozen=True)
class SampledLaw(AbstractLaw):
    """A law given by a sampler ``(key, n) -> (n, d)``, any dynamics with a field at arbitrary
    points: its reference is an ``n_ref``-particle system seeded by ``jax.random.key(2**31 - 1)``,
    :class:`ParticleReference`."""

    sample: Callable

    def __post_init__(self):
        if not callable(self.sample):
            raise ValueError(f"sample must be a sampler (key, n) -> (n, d), got {type(self.sample).__name__} "
                             f"{self.sample!r}"[:300])

    def reference(self, dynamics, n_ref, dtype):
        shape = jax.eval_shape(lambda k: self.sample(k, 2), jax.random.key(0))
        return ParticleReference(self.sample, n_ref, jax.random.key(REFERENCE_KEY), int(shape.shape[-1]),
                                 np.dtype(shape.dtype))


@dataclasses.dataclass(frozen=True)
class StationaryLaw(AbstractLaw):
    r"""A law μ_0 whose mean field vanishes, Γ_{μ_0} ≡ 0: then μ_t = μ_0 for all t and the
    characteristics (the tracers) do not move, so the mean-field reference is exact: the moments
    ``mean``, ``cov`` of μ_0 and independent samples of μ_0 (for W₂), with no reference system
    (whose own n_ref^{-1/2} error would floor the study). The caller vouches for Γ_{μ_0} = 0 for
    the dynamics studied; :func:`uniform_sphere_law` is the case the theory gives.

    Attributes:
        sample: ``(key, n) -> (n, d)`` i.i.d. samples of μ_0.
        mean, cov: the moments of μ_0, shapes ``(d,)`` and ``(d, d)``.
    """

    sample: Callable
    mean: np.ndarray
    cov: np.ndarray

    def reference(self, dynamics, n_ref, dtype):
        return StationaryReference(self.sample, jnp.asarray(self.mean, dtype), jnp.asarray(self.cov, dtype))


def uniform_sphere_law(d: int) -> StationaryLaw:
    r"""The uniform law σ on S^{d-1}, mean 0 and covariance I/d: its field vanishes under
    ``Sphere(attention)`` for every attention invariant under rotations (Q, K, V multiples of I:
    SA, USA, ℓ²; docs: math/sphere.md#the-projected-flow). By symmetry about x, Γ_σ(x) = ∫ e^{β⟨x,y⟩} y dσ(y) / Z(x)
    is parallel to x, and its tangent part P⊥_x Γ_σ(x) is 0 (checked in the tests: the field of an
    n-sample is O(n^{-1/2}))."""
    d = check_count(d, "d", minimum=2)
    return StationaryLaw(lambda key, n: uniform_sphere(key, n, d), np.zeros(d), np.eye(d) / d)


@dataclasses.dataclass(frozen=True)
class QuadratureLaw(AbstractLaw):
    r"""A smooth law μ_0 given by its density (a value at points) and a sampler, compared with the
    deterministic reference: a quadrature rule of μ_0 evolved as weighted tokens by the same
    dynamics (docs: math/mean_field.md#quadrature-references, :mod:`transformer_pde.measures`). Its error
    is the rule's, estimated by refinement against the rule of the coarser order
    (:func:`~transformer_pde.measures.refinement_orders`); no closure is needed, any
    attention that has a field at arbitrary points will do.

    Attributes:
        rule: :class:`~transformer_pde.measures.CircleRule`, ``SphereRule`` or ``GaussHermiteRule``.
        density: ρ_0 relative to the rule's reference measure (unnormalized), ``(m, d) -> (m,)``;
            None: the rule's base measure (uniform, or the Gaussian).
        sample: ``(key, n) -> (n, d)`` i.i.d. samples of μ_0 (the particles).
        order: the reference rule's order (nodes on S¹; Legendre nodes on S²; nodes per axis on R^d).
        resolution: on S¹ and R¹, the number of nodes of the finer measure carried by the
            reference's field on which the exact 1-D distances are measured (its W_1 distance to
            μ_t is O(1/resolution)); default 64·order.
    """

    rule: AbstractRule
    density: Callable | None
    sample: Callable
    order: int
    resolution: int | None = None

    def __post_init__(self):
        order = check_count(self.order, "order", minimum=1)
        if order < 2:
            raise ValueError(f"order must be >= 2 (a refinement check needs a coarser rule), got {order}")
        object.__setattr__(self, "order", self.rule.check_order(order))  # the node budget, before any node
        if self.resolution is not None:
            object.__setattr__(self, "resolution", check_count(self.resolution, "resolution", minimum=2))
        if self.one_dimensional:  # the 1-D distances' measure has resolution (default 64·order) points
            m, name = (self.resolution, "resolution") if self.resolution is not None else (64 * order, "64·order")
            if m > MAX_NODES:
                raise ValueError(f"{name} = {m} points for the 1-D distances, more than the {MAX_NODES} a rule "
                                 "allocates; lower the order or pass a smaller resolution")

    @property
    def one_dimensional(self) -> bool:
        return isinstance(self.rule, CircleRule) or self.rule.dim == 1

    def reference(self, dynamics, n_ref, dtype):
        if dynamics.dim is not None and dynamics.dim != self.rule.dim:
            raise ValueError(f"the law's rule lives in R^{self.rule.dim} but the dynamics act on d={dynamics.dim}")
        order, coarse = refinement_orders(self.order, self.rule)
        m = int(self.resolution or 64 * order)
        if m < 2:
            raise ValueError(f"resolution must be >= 2, got {self.resolution}")
        rule, rule_c = self.rule(self.density, order, dtype), self.rule(self.density, coarse, dtype)
        if self.one_dimensional:
            res, res_c = _resolved(self.rule, self.density, m, dtype), _resolved(self.rule, self.density, m // 2, dtype)
        else:
            res, res_c = rule, rule_c
        return QuadratureReference(self.sample, rule, res, rule_c, res_c, isinstance(self.rule, CircleRule),
                                   f"quadrature({type(self.rule).__name__}, order {self.order})")


def _resolved(rule: AbstractRule, density, m: int, dtype) -> Particles:
    """The measure the 1-D distances are taken to: the trapezoid rule at half-offset on S¹, the
    quantile midpoints of N(mean, cov) (reweighted by ρ/φ) on R."""
    if isinstance(rule, CircleRule):
        return CircleRule(offset=0.5)(density, m, dtype)
    mean, sd = float(rule.mean[0]), float(np.sqrt(rule.cov[0, 0]))
    u = (np.arange(m) + 0.5) / m
    z = np.asarray(jax.scipy.special.ndtri(jnp.asarray(u, jnp.result_type(float))))
    pts = (mean + sd * z)[:, None]
    w = np.full(m, 1.0 / m)
    if density is not None:
        w = rule.density_weights(density, pts, w)
    return Particles(jnp.asarray(pts, dtype), jnp.asarray(w, dtype))


def perturbed_circle_law(epsilon: float = 0.1, k: int = 1, *, order: int = 256,
                         resolution: int | None = None) -> QuadratureLaw:
    r"""ρ_0(θ) = 1 + ε cos kθ on S¹ (relative to the uniform law), |ε| < 1, k >= 1: a perturbation
    of the uniform law, which moves under SA at β where the uniform law is unstable. Samples by
    inverting F(θ) = (θ + (ε/k) sin kθ)/2π (bisection, exact to rounding)."""
    epsilon = float(check_in_range(epsilon, "epsilon", low=-1.0, high=1.0, low_open=True, high_open=True,
                                   meaning="a positive density 1 + epsilon cos k theta"))
    k = check_count(k, "k", minimum=1)

    def density(x):
        return 1.0 + epsilon * jnp.cos(k * jnp.arctan2(x[:, 1], x[:, 0]))

    def sample(key, n):
        u = jax.random.uniform(key, (n,), jnp.result_type(float))  # float64 under x64, else float32 (no warning)
        F = lambda th: (th + (epsilon / k) * jnp.sin(k * th)) / (2 * jnp.pi)  # noqa: E731
        lo, hi = jnp.zeros_like(u), jnp.full_like(u, 2 * jnp.pi)

        def step(_, bracket):
            lo, hi = bracket
            mid = 0.5 * (lo + hi)
            below = F(mid) < u
            return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

        lo, hi = jax.lax.fori_loop(0, 60, step, (lo, hi))
        th = 0.5 * (lo + hi)
        return jnp.stack([jnp.cos(th), jnp.sin(th)], -1)

    return QuadratureLaw(CircleRule(), density, sample, order, resolution)


def vmf_cap_law(center, kappa: float, *, order: int = 24) -> QuadratureLaw:
    r"""The von Mises–Fisher law on S², ρ_0(x) ∝ e^{κ⟨c, x⟩} (a cap about the unit vector c),
    with the Gauss–Legendre × trapezoid reference rule; samples by Wood's inversion
    (w = 1 + log(u + (1 − u)e^{−2κ})/κ, Wood 1994)."""
    c = np.asarray(check_real(center, "center"), np.float64)
    if c.shape != (3,) or not np.linalg.norm(c) > 0:
        raise ValueError(f"center must be a non-zero vector of R^3, got {center!r}")
    c = c / np.linalg.norm(c)
    kappa = float(check_scalar(kappa, "kappa"))
    if not kappa > 0:
        raise ValueError(f"kappa must be > 0 (kappa = 0 is the uniform law), got {kappa}")
    # a rotation taking e3 to c (Householder reflection composed with a flip keeps orientation
    # irrelevant: the law is symmetric about c)
    e3 = np.array([0.0, 0.0, 1.0])
    v = e3 - c
    H = np.eye(3) if np.linalg.norm(v) < 1e-12 else np.eye(3) - 2 * np.outer(v, v) / (v @ v)

    def density(x):
        return jnp.exp(kappa * (x @ jnp.asarray(c, x.dtype) - 1.0))

    def sample(key, n):
        ku, kp = jax.random.split(key)
        u = jax.random.uniform(ku, (n,), jnp.result_type(float))
        w = 1.0 + jnp.log(u + (1.0 - u) * jnp.exp(-2.0 * kappa)) / kappa
        phi = jax.random.uniform(kp, (n,), jnp.result_type(float), 0.0, 2 * jnp.pi)
        r = jnp.sqrt(jnp.clip(1.0 - w**2, 0.0))
        y = jnp.stack([r * jnp.cos(phi), r * jnp.sin(phi), w], -1)
        return y @ jnp.asarray(H.T)

    return QuadratureLaw(SphereRule(), density, sample, order)


def gaussian_quadrature_law(law: Gaussian, *, order: int = 24, resolution: int | None = None) -> QuadratureLaw:
    """N(mean, cov) on R^d, d <= 3, with the tensor Gauss–Hermite reference rule: the
    deterministic reference for any attention (no closure needed)."""
    if not isinstance(law, Gaussian):
        raise ValueError(f"law must be a tp.Gaussian(mean, cov), got {type(law).__name__} {law!r}"[:300])
    return QuadratureLaw(GaussHermiteRule(law.mean, law.cov), None, law.sample, order, resolution)


def as_law(law) -> AbstractLaw:
    """``law`` as an :class:`AbstractLaw`: a ``tp.Gaussian`` is a :class:`GaussianLaw`, a sampler
    ``(key, n) -> (n, d)`` a :class:`SampledLaw`."""
    if isinstance(law, AbstractLaw):
        return law
    if isinstance(law, Gaussian):
        return GaussianLaw(law)
    if callable(law):
        return SampledLaw(law)
    raise ValueError(f"law must be a tp.Gaussian, a StationaryLaw, a QuadratureLaw or a sampler (key, n) -> (n, d), "
                     f"got {type(law).__name__}")


def mean_field_reference(dynamics: AbstractDynamics, law, n_ref: int, dtype) -> AbstractMeanFieldReference:
    """The reference a law is compared with, its own (:meth:`AbstractLaw.reference`): a
    :class:`~transformer_pde.Gaussian` (the dynamics must have a Gaussian closure) gives
    :class:`GaussianClosureReference`, a :class:`StationaryLaw` :class:`StationaryReference`, a
    :class:`QuadratureLaw` :class:`QuadratureReference`, a sampler ``(key, n) -> (n, d)`` an
    ``n_ref``-particle :class:`ParticleReference` (seeded by ``jax.random.key(2**31 - 1)``);
    ``n_ref`` is an integer >= 2 whichever reference is chosen."""
    n_ref = check_count(n_ref, "n_ref", minimum=2)
    return as_law(law).reference(dynamics, n_ref, dtype)


__all__ = ["AbstractLaw", "GaussianLaw", "QuadratureLaw", "SampledLaw", "StationaryLaw",
           "gaussian_quadrature_law", "mean_field_reference", "perturbed_circle_law", "uniform_sphere_law",
           "vmf_cap_law"]
