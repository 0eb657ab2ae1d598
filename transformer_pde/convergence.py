r"""Mean-field convergence rates: how fast n-particle systems approach the Transformer PDE.

The particle system dx_i/dt = Γ_{μ^n_t}(x_i) with x_i(0) i.i.d. μ_0 has empirical measure
μ^n_t = (1/n) Σ_i δ_{x_i(t)}, a weak solution of the Transformer PDE
(docs: math/mean_field.md#mean-field-convergence). Its distance to the mean-field solution μ_t is measured at chosen
times, for n over a geometric range and several seeds, and the rate is fitted on a log-log scale.

**Two sources of error, separated by a same-seed coupling** (the Sznitman construction). With
the same initial samples, also move *tracers* z_i along the characteristics of the mean-field
field: dz_i/dt = Γ_{μ_t}(z_i), z_i(0) = x_i(0). The z_i(t) are i.i.d. samples of μ_t, so

    d(μ^n_t, μ_t)  <=  W_2(μ^n_t, ν^n_t)  +  d(ν^n_t, μ_t),     ν^n_t = (1/n) Σ_i δ_{z_i(t)},
                       └ dynamics-added ┘    └ sampling error carried by the exact flow ┘

and W_2(μ^n_t, ν^n_t) <= ((1/n) Σ_i |x_i(t) − z_i(t)|²)^{1/2} =: coupling error, zero at t = 0.
For a Lipschitz field (compact support, docs: math/mean_field.md#mean-field-convergence) propagation of chaos gives
a coupling error O(n^{-1/2}) on bounded time intervals; moment errors follow the Monte Carlo rate
n^{-1/2}; W_2 between an empirical measure and its law decays like n^{-1/d} for d >= 3 (and
(log n / n)^{1/2} for d = 2).

**Mean-field references** (values, :func:`mean_field_reference`, chosen once from the type of the law).
* Gaussian data with a Gaussian closure (docs: math/gaussian.md#moment-equations): μ_t = N(α(t), Σ(t)) from the
  moment ODEs, and the characteristics are affine, dz/dt = J(t) z + c(t), with (J, c) the affine field
  of the closure (:func:`gaussian_affine_field`; :class:`GaussianClosureReference`).
* A law whose mean field vanishes, Γ_{μ_0} ≡ 0 (:class:`StationaryLaw`; the uniform law on
  S^{d-1} under SA with Q = K = V = I, :func:`uniform_sphere_law`): μ_t = μ_0 and the tracers
  stay where they start, so the reference is exact at every n (no floor): this is what takes the
  study to n = 2²² with the fast kernel (:class:`StationaryReference`).
* A smooth law given by its density (:class:`QuadratureLaw`: :func:`perturbed_circle_law`,
  :func:`vmf_cap_law`, :func:`gaussian_quadrature_law`), any dynamics: a quadrature rule of μ_0
  evolved as weighted tokens (docs: math/mean_field.md#quadrature-references), integrated jointly; the tracers
  follow its field. Its error is the rule's (spectral while the flow map is smooth), estimated in every
  measurement as the change when the rule of the coarser order replaces it
  (:class:`QuadratureReference`; measured: < 1e-6 in the exact W₁ on S¹ at t = 1, β = 9).
* Any other law: a large-n reference system x^ref (n_ref particles, its own seed) integrated
  jointly; tracers follow the field of μ^{ref}_t. Its own error (n_ref^{-1/2}) is a floor
  (:class:`ParticleReference`).

The rate fits (:func:`transformer_pde.statistics.fit_rate`) are generic statistics, in their own
module.

The distances (``metrics``): ``mean`` |x̄ − α|; ``cov`` ‖Ĉ − Σ‖_F; ``bw`` the Bures–Wasserstein
distance between the moment-matched Gaussians; ``coupling`` (above); ``flow_bw`` the ``bw`` of
the tracers (the sampling error alone); ``w1``, ``w2`` transport distances (the study's
:class:`AbstractStudyDistance`, chosen by the reference): exact on R (W₁, W₂ from quantile
functions) and on S¹ (W₁ from cumulative functions), no ε; elsewhere ``w2`` = √(Sinkhorn
divergence) with ε relative to tr Cov of the reference measure (ott-jax), NaN and counted when it
does not converge. The compared measure is an independent n-sample of μ_t (closure, stationary),
the reference system, or the quadrature rule (on S¹ and R a finer rule carried by its field).
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Sequence

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from ._checks import INT_LIMIT, check_count, check_in_range, check_int, check_real, check_scalar
from .diagnostics.distances import bures_wasserstein, sinkhorn_wasserstein_status
from .diagnostics.distances_1d import wasserstein_circle, wasserstein_line
from .diagnostics.moments import unchecked_moments as empirical_moments  # per save: no checks
from .models.attention.base import AbstractGaussianClosure
from .models.base import AbstractDynamics, AbstractManifoldDynamics
from .models.sphere import uniform_sphere
from .solvers import Coupled, Gaussian, Particles, Tracers, solve
from .solvers.quadrature import AbstractRule, CircleRule, GaussHermiteRule, SphereRule, refinement_orders
from .statistics import RateFit, fit_rate

METRICS = ("mean", "cov", "bw", "coupling", "flow_bw", "w1", "w2")


# --------------------------------------------------------------------------------------------
# Gaussian geometry


def gaussian_affine_field(dynamics: AbstractDynamics, mean, cov, t=0.0):
    r"""The affine field Γ_μ(x) = J x + c of μ = N(mean, cov) (docs: math/gaussian.md#gaussian-data-stay-gaussian),
    from :meth:`~transformer_pde.models.AbstractGaussianClosure.affine_field`; a ValueError when
    there is no closure (causal attention included: its field depends on positions)."""
    if not isinstance(dynamics, AbstractGaussianClosure):
        raise ValueError(f"dynamics has no Gaussian closure with an affine field ({type(dynamics).__name__}); "
                         "use a large-n reference instead (law given as a sampler)")
    law = Gaussian(mean, cov)  # mean, cov checked (finite, shapes, cov symmetric positive definite)
    t = check_scalar(t, "t")
    return dynamics.affine_field(law.mean, law.cov, t)


# --------------------------------------------------------------------------------------------
# Distances


class AbstractStudyDistance(eqx.Module):
    """The transport distance a study measures between two weighted measures Σ a_i δ_{x_i} and
    Σ b_j δ_{y_j} (:meth:`between`; called with μ^n_t, uniform ``x``, and the reference measure):
    returns ``w1``, ``w2`` (NaN where not computed) and ``unconverged`` (True where an iterative
    solve did not converge: its value is then NaN)."""

    @abc.abstractmethod
    def between(self, x, a, y, b) -> dict:
        ...

    def __call__(self, x, y, b) -> dict:
        return self.between(x, jnp.full(x.shape[:1], 1.0 / x.shape[0], x.dtype), y, b)

    @property
    def exact(self) -> bool:
        return True


class ExactLine(AbstractStudyDistance):
    """On R: exact W_1 and W_2 from the quantile functions (:func:`wasserstein_line`)."""

    def between(self, x, a, y, b):
        return {"w1": wasserstein_line(x, y, a, b, p=1.0), "w2": wasserstein_line(x, y, a, b, p=2.0),
                "unconverged": jnp.zeros((), bool)}

    def __str__(self):
        return "exact W1, W2 on R (quantile functions)"


class ExactCircle(AbstractStudyDistance):
    """On S¹: exact W_1 for the arc length, from the cumulative functions
    (:func:`wasserstein_circle`); no W_2."""

    def between(self, x, a, y, b):
        return {"w1": wasserstein_circle(x, y, a, b), "w2": jnp.full((), jnp.nan, x.dtype),
                "unconverged": jnp.zeros((), bool)}

    def __str__(self):
        return "exact W1 on the circle (cumulative functions)"


def _positive(value, name: str) -> float:
    """A finite real number > 0, as a float (ValueError naming ``name`` otherwise)."""
    return float(check_scalar(value, name, positive=True))


class SinkhornDistance(AbstractStudyDistance):
    r"""W_2 ≈ √S_ε (debiased Sinkhorn divergence, ott-jax) with ε relative to the data's scale:
    ε = ``epsilon`` · tr Cov(ν), ν the reference measure at the time of measurement (the bias is
    O(ε²) for smooth data). A solve that does not reach ``threshold`` in ``max_iterations`` gives
    NaN and ``unconverged`` (the study counts and warns; it does not stop)."""

    epsilon: float = eqx.field(static=True, default=0.01, converter=lambda v: _positive(v, "epsilon"))
    max_iterations: int = eqx.field(static=True, default=2000,
                                    converter=lambda v: check_count(v, "max_iterations", minimum=1))
    threshold: float = eqx.field(static=True, default=1e-4, converter=lambda v: _positive(v, "threshold"))

    def between(self, x, a, y, b):
        _, S = empirical_moments(y, b)
        eps = self.epsilon * jnp.maximum(jnp.trace(S), jnp.finfo(x.dtype).tiny)
        batch = None if x.shape[0] * y.shape[0] <= (1 << 24) else 1024
        w, converged = sinkhorn_wasserstein_status(x, y, a, b, epsilon=eps, threshold=self.threshold,
                                                   max_iterations=self.max_iterations, batch_size=batch)
        return {"w1": jnp.full((), jnp.nan, x.dtype), "w2": jnp.where(converged, w, jnp.nan),
                "unconverged": ~converged}

    @property
    def exact(self) -> bool:
        return False

    def __str__(self):
        return (f"Sinkhorn W2, epsilon = {self.epsilon:g} x tr Cov(reference), threshold {self.threshold:g}, "
                f"max_iterations {self.max_iterations}")


def _metrics(x, z, m_ref, S_ref, y_ref, b_ref, distance, with_w2):
    m, S = empirical_moments(x)
    mz, Sz = empirical_moments(z)
    out = {
        "mean": jnp.linalg.norm(m - m_ref),
        "cov": jnp.linalg.norm(S - S_ref),
        "bw": bures_wasserstein(m, S, m_ref, S_ref),
        "coupling": jnp.sqrt(jnp.mean(jnp.sum((x - z) ** 2, axis=-1))),
        "flow_bw": bures_wasserstein(mz, Sz, m_ref, S_ref),
    }
    if with_w2 or distance.exact:
        b = jnp.full(y_ref.shape[:1], 1.0 / y_ref.shape[0], x.dtype) if b_ref is None else b_ref
        out.update(distance(x, y_ref, b))
    else:
        out.update(w1=jnp.full((), jnp.nan, x.dtype), w2=jnp.full((), jnp.nan, x.dtype),
                   unconverged=jnp.zeros((), bool))
    return out


# --------------------------------------------------------------------------------------------
# Runs


@eqx.filter_jit
def _run_gaussian(dynamics, mean0, cov0, keys, n, ts, t1, dt0, solver, distance, with_w2,
                  max_steps):
    dtype = mean0.dtype

    def one(key):
        # independent samples across n (fold in n): the fits treat the n's as independent
        kx, ky = jax.random.split(jax.random.fold_in(key, n))
        L = jnp.linalg.cholesky(cov0)
        x0 = mean0[None, :] + jax.random.normal(kx, (n, mean0.shape[0]), dtype) @ L.T
        w = jnp.full((n,), 1.0 / n, dtype)

        def save(t, y, args):
            x, ((m, S), z) = y
            # an independent n-sample of μ_t for the W_2 of empirical measures
            yref = m[None, :] + jax.random.normal(ky, x.shape, dtype) @ jnp.linalg.cholesky(S).T
            return _metrics(x, z, m, S, yref, None, distance, with_w2)

        # the system, and tracers moved by the closure's affine field (the same-seed coupling)
        state = Coupled(Particles(x0, w), Tracers(Gaussian(mean0, cov0), x0))
        return solve(dynamics, state, t1=t1, dt0=dt0, solver=solver, max_steps=max_steps,
                     saveat=diffrax.SaveAt(ts=ts, fn=save)).stats

    return jax.lax.map(one, keys)


@dataclasses.dataclass(frozen=True)
class StationaryLaw:
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


def uniform_sphere_law(d: int) -> StationaryLaw:
    r"""The uniform law σ on S^{d-1}, mean 0 and covariance I/d: its field vanishes under
    ``Sphere(attention)`` for every attention invariant under rotations (Q, K, V multiples of I:
    SA, USA, ℓ²; docs: math/sphere.md#the-projected-flow). By symmetry about x, Γ_σ(x) = ∫ e^{β⟨x,y⟩} y dσ(y) / Z(x)
    is parallel to x, and its tangent part P⊥_x Γ_σ(x) is 0 (checked in the tests: the field of an
    n-sample is O(n^{-1/2}))."""
    d = check_count(d, "d", minimum=2)
    return StationaryLaw(lambda key, n: uniform_sphere(key, n, d), np.zeros(d), np.eye(d) / d)


@eqx.filter_jit
def _run_stationary(dynamics, sampler, mean, cov, keys, n, ts, t1, dt0, solver, distance, with_w2,
                    max_steps):
    dtype = mean.dtype

    def one(key):
        # the same initial samples as the particle reference's runs (fold in n), so the two
        # references are compared on the same trajectories
        kx = jax.random.fold_in(key, n)
        ky = jax.random.fold_in(kx, 1)
        x0 = sampler(kx, n).astype(dtype)
        w = jnp.full((n,), 1.0 / n, dtype)

        def save(t, x, args):
            # tracers of a vanishing field stay at x0; an independent n-sample of μ_t = μ_0 for W₂
            return _metrics(x, x0, mean, cov, sampler(ky, n).astype(dtype), None, distance, with_w2)

        return solve(dynamics, Particles(x0, w), t1=t1, dt0=dt0, solver=solver, max_steps=max_steps,
                     saveat=diffrax.SaveAt(ts=ts, fn=save)).stats

    return jax.lax.map(one, keys)


@eqx.filter_jit
def _run_reference(dynamics, sampler, keys, ref_key, n, n_ref, ts, t1, dt0, solver, distance,
                   with_w2, max_steps):
    xref0 = sampler(ref_key, n_ref)
    dtype = xref0.dtype
    wref = jnp.full((n_ref,), 1.0 / n_ref, dtype)

    def one(key):
        x0 = sampler(jax.random.fold_in(key, n), n).astype(dtype)
        w = jnp.full((n,), 1.0 / n, dtype)

        def save(t, y, args):
            x, (xr, z) = y
            m, S = empirical_moments(xr)
            return _metrics(x, z, m, S, xr, None, distance, with_w2)

        # the system, and tracers moved by the field of the large reference system
        state = Coupled(Particles(x0, w), Tracers(Particles(xref0, wref), x0))
        return solve(dynamics, state, t1=t1, dt0=dt0, solver=solver, max_steps=max_steps,
                     saveat=diffrax.SaveAt(ts=ts, fn=save)).stats

    return jax.lax.map(one, keys)


@dataclasses.dataclass(frozen=True)
class QuadratureLaw:
    r"""A smooth law μ_0 given by its density (a value at points) and a sampler, compared with the
    deterministic reference: a quadrature rule of μ_0 evolved as weighted tokens by the same
    dynamics (docs: math/mean_field.md#quadrature-references, :mod:`transformer_pde.solvers.quadrature`). Its error
    is the rule's, estimated by refinement against the rule of the coarser order
    (:func:`~transformer_pde.solvers.quadrature.refinement_orders`); no closure is needed, any
    attention that has a field at arbitrary points will do.

    Attributes:
        rule: :class:`~transformer_pde.solvers.CircleRule`, ``SphereRule`` or ``GaussHermiteRule``.
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
        object.__setattr__(self, "order", order)
        if self.resolution is not None:
            object.__setattr__(self, "resolution", check_count(self.resolution, "resolution", minimum=2))

    @property
    def one_dimensional(self) -> bool:
        return isinstance(self.rule, CircleRule) or self.rule.dim == 1


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


@eqx.filter_jit
def _run_quadrature(dynamics, sampler, rules, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps):
    """``rules``: ``((rule, resolved), (coarse rule, coarse resolved))``; returns the metrics
    against the fine reference and their differences from those against the coarse one."""
    dtype = rules[0][0].x.dtype

    def one(key):
        x0 = sampler(jax.random.fold_in(key, n), n).astype(dtype)
        w = jnp.full((n,), 1.0 / n, dtype)

        def save(t, y, args):
            x, *refs = y
            out = []
            for (rule, resolved), (xr, zz) in zip(rules, refs):
                m, S = empirical_moments(xr, rule.weights)
                out.append(_metrics(x, zz[:n], m, S, zz[n:], resolved.weights, distance, with_w2))
            fine, coarse = out
            ref_err = {k: jnp.abs(fine[k] - coarse[k]) for k in METRICS}
            return {**fine, "reference_error": ref_err}

        # the system; for each rule, tracers from the particles' starts (same-seed coupling) and
        # the resolved measure, moved by the field of the evolved rule
        tracers = [Tracers(rule, jnp.concatenate([x0, resolved.x])) for rule, resolved in rules]
        return solve(dynamics, Coupled(Particles(x0, w), *tracers), t1=t1, dt0=dt0, solver=solver,
                     max_steps=max_steps, saveat=diffrax.SaveAt(ts=ts, fn=save)).stats

    return jax.lax.map(one, keys)


# --------------------------------------------------------------------------------------------
# References: the mean field a law is compared with, chosen once from the type of the law


class AbstractMeanFieldReference(abc.ABC):
    """The mean-field reference of a study: it runs the n-particle systems of one n (every seed)
    beside the mean field and returns their errors, metric name -> ``(seeds, times)``."""

    dim: int

    @abc.abstractmethod
    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps) -> dict:
        ...

    #: the error of the reference itself where it is not estimated run by run: 0 (exact up to the
    #: time stepping) or NaN (unknown)
    own_error: float = 0.0

    def run(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps) -> tuple[dict, dict]:
        """``(errors, reference_error)``: the metrics of :meth:`errors` and, for each, the
        estimated error of the reference in that measurement (same shapes)."""
        out = self.errors(dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps)
        return out, {k: np.full(np.shape(out[k]), self.own_error) for k in METRICS}

    def distance(self, dynamics, sinkhorn: "SinkhornDistance") -> AbstractStudyDistance:
        """The transport distance the study measures: exact on R (d = 1) and on S¹ (tokens of
        R² under a manifold dynamics), ``sinkhorn`` elsewhere."""
        if self.dim == 1:
            return ExactLine()
        if self.dim == 2 and isinstance(dynamics, AbstractManifoldDynamics):
            return ExactCircle()
        return sinkhorn


@dataclasses.dataclass(frozen=True)
class GaussianClosureReference(AbstractMeanFieldReference):
    """μ_t = N(α(t), Σ(t)) from the moment ODEs of the Gaussian closure, started at
    N(``mean``, ``cov``); the tracers move along the closure's affine field."""

    mean: jax.Array
    cov: jax.Array

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps) -> dict:
        return _run_gaussian(dynamics, self.mean, self.cov, keys, n, ts, t1, dt0, solver, distance,
                             with_w2, max_steps)

    def __str__(self):
        return "gaussian"


@dataclasses.dataclass(frozen=True)
class StationaryReference(AbstractMeanFieldReference):
    """μ_t = μ_0 for a :class:`StationaryLaw` (its moments ``mean``, ``cov`` in the study's dtype):
    exact at every n, the tracers at rest."""

    law: StationaryLaw
    mean: jax.Array
    cov: jax.Array

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps) -> dict:
        return _run_stationary(dynamics, self.law.sample, self.mean, self.cov, keys, n, ts, t1, dt0,
                               solver, distance, with_w2, max_steps)

    def __str__(self):
        return "stationary"


@dataclasses.dataclass(frozen=True)
class ParticleReference(AbstractMeanFieldReference):
    """A large system of ``n_ref`` particles sampled by ``sampler`` from its own ``key``, integrated
    beside the n-particle systems; the tracers follow its field. Its own n_ref^{-1/2} error is a
    floor."""

    sampler: Callable
    n_ref: int
    key: jax.Array
    dim: int

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps) -> dict:
        return _run_reference(dynamics, self.sampler, keys, self.key, n, self.n_ref, ts, t1, dt0,
                              solver, distance, with_w2, max_steps)

    own_error = float("nan")  # ~ n_ref^{-1/2}, not estimated

    def __str__(self):
        return f"particles({self.n_ref})"


@dataclasses.dataclass(frozen=True)
class QuadratureReference(AbstractMeanFieldReference):
    """A :class:`QuadratureLaw`'s rule of ``order`` evolved as weighted tokens beside the
    n-particle systems; the tracers (and, on S¹ and R, the finer resolved measure the exact 1-D
    distances are taken to) follow its field. Its error is estimated by refinement against the
    rule of the coarser order (:meth:`reference_error`)."""

    law: QuadratureLaw
    rule: Particles
    resolved: Particles
    coarse: Particles
    coarse_resolved: Particles

    @property
    def dim(self) -> int:
        return int(self.rule.x.shape[1])

    def run(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps):
        rules = ((self.rule, self.resolved), (self.coarse, self.coarse_resolved))
        out = _run_quadrature(dynamics, self.law.sample, rules, keys, n, ts, t1, dt0, solver, distance,
                              with_w2, max_steps)
        return out, out.pop("reference_error")

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps) -> dict:
        return self.run(dynamics, keys, n, ts, t1, dt0, solver, distance, with_w2, max_steps)[0]

    def distance(self, dynamics, sinkhorn):
        if isinstance(self.law.rule, CircleRule):
            return ExactCircle()
        return ExactLine() if self.dim == 1 else sinkhorn

    def __str__(self):
        return f"quadrature({type(self.law.rule).__name__}, order {self.law.order})"


def mean_field_reference(dynamics: AbstractDynamics, law, n_ref: int, dtype) -> AbstractMeanFieldReference:
    """The reference a law is compared with: a :class:`~transformer_pde.Gaussian` (the dynamics
    must have a Gaussian closure) gives :class:`GaussianClosureReference`, a :class:`StationaryLaw`
    :class:`StationaryReference`, a sampler ``(key, n) -> (n, d)`` an ``n_ref``-particle
    :class:`ParticleReference` (seeded by ``jax.random.key(2**31 - 1)``); ``n_ref`` is an integer
    >= 2 whichever reference is chosen."""
    n_ref = check_count(n_ref, "n_ref", minimum=2)
    if isinstance(law, Gaussian):
        if dynamics.dim is not None and dynamics.dim != law.dim:
            raise ValueError(f"the Gaussian has dimension {law.dim} but the dynamics act on d={dynamics.dim}")
        gaussian_affine_field(dynamics, law.mean, law.cov)  # raises early if there is no closure
        return GaussianClosureReference(law.mean.astype(dtype), law.cov.astype(dtype))
    if isinstance(law, StationaryLaw):
        return StationaryReference(law, jnp.asarray(law.mean, dtype), jnp.asarray(law.cov, dtype))
    if isinstance(law, QuadratureLaw):
        if dynamics.dim is not None and dynamics.dim != law.rule.dim:
            raise ValueError(f"the law's rule lives in R^{law.rule.dim} but the dynamics act on d={dynamics.dim}")
        order, coarse = refinement_orders(law.order, law.rule)
        m = int(law.resolution or 64 * order)
        if m < 2:
            raise ValueError(f"resolution must be >= 2, got {law.resolution}")
        rule, rule_c = law.rule(law.density, order, dtype), law.rule(law.density, coarse, dtype)
        if law.one_dimensional:
            res, res_c = _resolved(law.rule, law.density, m, dtype), _resolved(law.rule, law.density, m // 2, dtype)
        else:
            res, res_c = rule, rule_c
        return QuadratureReference(law, rule, res, rule_c, res_c)
    if callable(law):
        d = int(jax.eval_shape(lambda k: law(k, 2), jax.random.key(0)).shape[-1])
        return ParticleReference(law, n_ref, jax.random.key(2**31 - 1), d)
    raise ValueError(f"law must be a tp.Gaussian, a StationaryLaw, a QuadratureLaw or a sampler (key, n) -> (n, d), got "
                     f"{type(law).__name__}")


@dataclasses.dataclass(frozen=True)
class ConvergenceResult:
    """Errors of n-particle systems against the mean field.

    Attributes:
        ns: particle counts ``(N,)``; seeds ``(S,)``; ts: measurement times ``(T,)``.
        errors: metric name -> array ``(N, S, T)`` (see the module docstring; ``w2`` is NaN
            where it was not computed).
        dim: the dimension d (for the n^{-1/d} comparison).
        reference: the mean field compared with (:func:`mean_field_reference`; ``str`` of it
            reads ``gaussian``, ``stationary``, ``particles(n_ref)`` or ``quadrature(...)``).
        distance: the transport distance measured (``str`` states it, with the Sinkhorn ε).
        unconverged: ``(N,)`` how many Sinkhorn distances of each n did not converge (NaN).
        reference_error: metric name -> ``(N, S, T)``, the estimated error of the reference in
            each measurement of ``errors`` (quadrature: the change of the measured value when the
            reference is replaced by its coarser rule; 0: exact up to the time stepping; NaN: not
            estimated, the particle reference).
    """

    ns: np.ndarray
    seeds: np.ndarray
    ts: np.ndarray
    errors: dict
    dim: int
    reference: AbstractMeanFieldReference
    distance: AbstractStudyDistance | None = None
    unconverged: np.ndarray | None = None
    reference_error: dict | None = None

    def rates(self, metric: str, time_index: int = -1, **kwargs) -> RateFit:
        """Log-log fit of ``errors[metric][:, :, time_index]`` against n
        (:func:`transformer_pde.statistics.fit_rate`)."""
        return fit_rate(self.ns, self.errors[metric][:, :, time_index], **kwargs)


def _integers(values, name: str, *, minimum: int, maximum: int = INT_LIMIT) -> list[int]:
    """A 1-D sequence of integers (a list, tuple, range, 1-D array; integral floats allowed):
    ValueError naming ``name`` (or ``name[i]``) for a scalar, a string or a bad element."""
    if isinstance(values, (np.ndarray, jax.Array)):
        if values.ndim != 1:
            raise ValueError(f"{name} must be a 1-D sequence of integers, got an array of shape {values.shape}")
        items = list(np.asarray(values))
    elif isinstance(values, Iterable) and not isinstance(values, (str, bytes, dict)):
        items = list(values)
    else:
        raise ValueError(f"{name} must be a sequence of integers (a list, tuple, range or 1-D array), got "
                         f"{type(values).__name__} {values!r}"[:300])
    return [check_count(v, f"{name}[{i}]", minimum=minimum, maximum=maximum) for i, v in enumerate(items)]


def convergence_study(
    dynamics: AbstractDynamics,
    law,
    ns: Sequence[int] | ArrayLike,
    *,
    t1: float,
    dt0: float,
    ts=None,
    seeds: Sequence[int] = (0, 1, 2, 3),
    n_ref: int | None = None,
    w2_epsilon: float = 0.01,
    w2_max_n: int = 4096,
    w2_max_iterations: int = 2000,
    w2_threshold: float = 1e-4,
    solver: diffrax.AbstractSolver | None = None,
    dtype=None,
    progress: Callable[[str], None] | None = None,
) -> ConvergenceResult:
    """Run n-particle systems for every n in ``ns`` and seed, and measure their distance to
    the mean field at times ``ts`` (module docstring).

    Args:
        dynamics: an attention with a Gaussian closure (``law`` a :class:`Gaussian`), any
            dynamics for which ``law`` is a :class:`StationaryLaw`, or any dynamics with a field at
            arbitrary points (``law`` a sampler ``(key, n) -> (n, d)``, compared with an
            ``n_ref``-particle reference).
        law: :class:`Gaussian`, :class:`StationaryLaw`, :class:`QuadratureLaw` (the
            deterministic reference, any dynamics) or a sampler.
        ns: particle counts (e.g. ``2 ** np.arange(6, 17)``).
        t1, dt0: horizon and constant step of the solver (default Tsit5).
        ts: measurement times in [0, t1] (default ``[0, t1]``; include 0 to see the sampling
            error at t = 0).
        seeds: the initial samples of seed s use ``jax.random.key(s)``; the same key drives the
            particles and their tracers (same-seed coupling).
        n_ref: size of the reference system (particle laws only; default 8 · max(ns)).
        w2_epsilon: ε of the Sinkhorn divergence relative to the data's scale: ε = w2_epsilon ·
            tr Cov of the reference measure at each time (:class:`SinkhornDistance`). Not used on
            R and S¹, where the distances are exact (``w1``, ``w2`` on R; ``w1`` on S¹).
        w2_max_n: skip the Sinkhorn ``w2`` (NaN) above this n: it costs O(n²) per iteration.
        w2_max_iterations, w2_threshold: the Sinkhorn budget; an unconverged distance is NaN,
            counted in :attr:`ConvergenceResult.unconverged` and warned about (the study goes on).
        progress: called with a line of text after every n.
    """
    ns = np.asarray(sorted(set(_integers(ns, "ns", minimum=2))))
    if ns.size < 1:
        raise ValueError(f"ns must hold particle counts >= 2, got {ns.tolist()}")
    seeds = _integers(seeds, "seeds", minimum=0, maximum=2**32 - 1)
    if len(set(seeds)) != len(seeds):
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        raise ValueError(f"seeds must be distinct (each is one independent sample; a repeat would "
                         f"narrow the band), got {twice} more than once")
    if n_ref is not None:
        n_ref = check_count(n_ref, "n_ref", minimum=2)
        if n_ref < ns[-1]:
            raise ValueError(f"n_ref={n_ref} must be at least the largest n={int(ns[-1])} (the "
                             f"reference stands in for the mean-field limit)")
    t1, dt0 = _positive(t1, "t1"), _positive(dt0, "dt0")
    if len(seeds) < 1:
        raise ValueError("need at least one seed")
    sinkhorn = SinkhornDistance(_positive(w2_epsilon, "w2_epsilon"),
                                check_count(w2_max_iterations, "w2_max_iterations", minimum=1),
                                _positive(w2_threshold, "w2_threshold"))
    dtype = jnp.dtype(dtype or jnp.result_type(float))
    ts = np.asarray([0.0, float(t1)] if ts is None else ts, dtype=np.float64)
    if ts.ndim != 1 or np.any(np.diff(ts) < 0) or ts[0] < 0 or ts[-1] > float(t1) * (1 + 1e-9):
        raise ValueError(f"ts must be non-decreasing times in [0, t1={t1}], got {ts.tolist()}")
    solver = diffrax.Tsit5() if solver is None else solver
    keys = jnp.stack([jax.random.key(int(s)) for s in seeds])
    t1a, dt0a, tsa = (jnp.asarray(v, dtype) for v in (t1, dt0, ts))
    max_steps = int(np.ceil(float(t1) / float(dt0) * (1 + 1e-6))) + 1
    errors = {k: np.zeros((ns.size, len(seeds), ts.size)) for k in METRICS}
    unconverged = np.zeros(ns.size, dtype=int)
    reference = mean_field_reference(dynamics, law, n_ref or min(8 * int(ns[-1]), INT_LIMIT), dtype)
    distance = reference.distance(dynamics, sinkhorn)
    reference_error = {k: np.zeros((ns.size, len(seeds), ts.size)) for k in METRICS}
    for i, n in enumerate(ns):
        with_w2 = bool(n <= w2_max_n)
        out, ref_err = reference.run(dynamics, keys, int(n), tsa, t1a, dt0a, solver, distance, with_w2,
                                     max_steps)
        for k in METRICS:
            errors[k][i] = np.asarray(out[k], dtype=np.float64)
            reference_error[k][i] = np.asarray(ref_err[k], dtype=np.float64)
        unconverged[i] = int(np.sum(np.asarray(out["unconverged"])))
        if unconverged[i]:
            warnings.warn(f"n={n}: {unconverged[i]} of {len(seeds) * ts.size} Sinkhorn distances did not "
                          f"converge ({distance}); they are reported as NaN (raise w2_max_iterations or "
                          "w2_epsilon)", RuntimeWarning, stacklevel=2)
        if progress is not None:
            progress(f"n={n}: " + ", ".join(f"{k}={np.nanmean(errors[k][i, :, -1]):.3g}"
                                           for k in METRICS if np.isfinite(errors[k][i, :, -1]).any())
                     + (f" ({unconverged[i]} unconverged)" if unconverged[i] else ""))
    return ConvergenceResult(ns=ns, seeds=np.asarray(seeds), ts=ts, errors=errors, dim=reference.dim,
                             reference=reference, distance=distance, unconverged=unconverged,
                             reference_error=reference_error)


# --------------------------------------------------------------------------------------------
# Rates


def reference_rates(d: int) -> dict:
    """The rates to compare with: Monte Carlo n^{-1/2} and the empirical W_2 rate n^{-1/d}
    (n^{-1/2} up to logs for d <= 2)."""
    d = check_count(d, "d", minimum=1)
    return {"monte_carlo": -0.5, "empirical_w2": -1.0 / max(d, 2)}


def rate_table(result: ConvergenceResult, metrics=None, time_index: int = -1) -> list[dict]:
    """One row per metric: fitted slope, its interval, and the reference rates."""
    if not isinstance(result, ConvergenceResult):
        raise ValueError(f"result must be a ConvergenceResult (from convergence_study), got {type(result).__name__}")
    num_times = len(result.ts)
    time_index = check_int(time_index, "time_index", minimum=-num_times, maximum=num_times - 1)
    if metrics is None or (isinstance(metrics, (list, tuple)) and not metrics):
        metrics = [k for k in METRICS if k in result.errors]
    if isinstance(metrics, str) or not all(isinstance(k, str) and k in result.errors for k in metrics):
        raise ValueError(f"metrics must be a sequence of the result's metric names {sorted(result.errors)}, "
                         f"got {metrics!r}")
    rows = []
    for k in metrics:
        e = result.errors[k][:, :, time_index]
        if not np.all(np.isfinite(e)) or np.any(e <= 0):
            keep = np.all(np.isfinite(e) & (e > 0), axis=1)
            if keep.sum() < 2:
                continue
            fit = fit_rate(result.ns[keep], e[keep])
        else:
            fit = fit_rate(result.ns, e)
        rows.append({"metric": k, "t": float(result.ts[time_index]), "slope": fit.slope,
                     "slope_low": fit.slope_ci[0], "slope_high": fit.slope_ci[1],
                     **reference_rates(result.dim)})
    return rows


def geometric_ns(lo: int, hi: int, step: int = 1) -> np.ndarray:
    """Powers of two 2^lo, 2^(lo + step), ..., up to 2^hi (1 <= lo <= hi <= 30: JAX counts in int32)."""
    lo = check_count(lo, "lo", minimum=1, maximum=30)
    hi = check_count(hi, "hi", minimum=lo, maximum=30)
    step = check_count(step, "step", minimum=1)
    return 2 ** np.arange(lo, hi + 1, step)


__all__ = [
    "AbstractMeanFieldReference",
    "AbstractStudyDistance",
    "ConvergenceResult",
    "ExactCircle",
    "ExactLine",
    "GaussianClosureReference",
    "ParticleReference",
    "QuadratureLaw",
    "QuadratureReference",
    "SinkhornDistance",
    "StationaryLaw",
    "StationaryReference",
    "convergence_study",
    "gaussian_quadrature_law",
    "gaussian_affine_field",
    "geometric_ns",
    "mean_field_reference",
    "rate_table",
    "reference_rates",
    "perturbed_circle_law",
    "uniform_sphere_law",
    "vmf_cap_law",
]
