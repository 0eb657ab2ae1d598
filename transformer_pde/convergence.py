r"""Mean-field convergence rates: how fast n-particle systems approach the Transformer PDE.

The particle system dx_i/dt = Γ_{μ^n_t}(x_i) with x_i(0) i.i.d. μ_0 has empirical measure
μ^n_t = (1/n) Σ_i δ_{x_i(t)}, a weak solution of the Transformer PDE (euclidean.md §1). Its
distance to the mean-field solution μ_t is measured at chosen times, for n over a geometric
range and several seeds, and the rate is fitted on a log-log scale.

**Two sources of error, separated by a same-seed coupling** (the Sznitman construction). With
the same initial samples, also move *tracers* z_i along the characteristics of the mean-field
field: dz_i/dt = Γ_{μ_t}(z_i), z_i(0) = x_i(0). The z_i(t) are i.i.d. samples of μ_t, so

    d(μ^n_t, μ_t)  <=  W_2(μ^n_t, ν^n_t)  +  d(ν^n_t, μ_t),     ν^n_t = (1/n) Σ_i δ_{z_i(t)},
                       └ dynamics-added ┘    └ sampling error carried by the exact flow ┘

and W_2(μ^n_t, ν^n_t) <= ((1/n) Σ_i |x_i(t) − z_i(t)|²)^{1/2} =: coupling error, zero at t = 0.
For a Lipschitz field (compact support, euclidean.md §3) propagation of chaos gives a coupling
error O(n^{-1/2}) on bounded time intervals; moment errors follow the Monte Carlo rate
n^{-1/2}; W_2 between an empirical measure and its law decays like n^{-1/d} for d >= 3 (and
(log n / n)^{1/2} for d = 2).

**Mean-field references** (values, :func:`mean_field_reference`, chosen once from the type of the law).
* Gaussian data with a Gaussian closure (euclidean.md §4): μ_t = N(α(t), Σ(t)) from the moment
  ODEs, and the characteristics are affine, dz/dt = J(t) z + c(t), with (J, c) the affine field
  of the closure (:func:`gaussian_affine_field`; :class:`GaussianClosureReference`).
* A law whose mean field vanishes, Γ_{μ_0} ≡ 0 (:class:`StationaryLaw`; the uniform law on
  S^{d-1} under SA with Q = K = V = I, :func:`uniform_sphere_law`): μ_t = μ_0 and the tracers
  stay where they start, so the reference is exact at every n (no floor): this is what takes the
  study to n = 2²² with the fast kernel (:class:`StationaryReference`).
* Any other law: a large-n reference system x^ref (n_ref particles, its own seed) integrated
  jointly; tracers follow the field of μ^{ref}_t. Its own error (n_ref^{-1/2}) is a floor
  (:class:`ParticleReference`).

The rate fits (:func:`transformer_pde.statistics.fit_rate`) are generic statistics, in their own
module.

The distances (``metrics``): ``mean`` |x̄ − α|; ``cov`` ‖Ĉ − Σ‖_F; ``bw`` the Bures–Wasserstein
distance between the moment-matched Gaussians; ``coupling`` (above); ``flow_bw`` the ``bw`` of
the tracers (the sampling error alone); ``w2`` √(Sinkhorn divergence) between μ^n_t and an
independent n-sample of μ_t (resp. the reference), with explicit ε (ott-jax).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from ._checks import check_count
from .diagnostics.distances import bures_wasserstein, sinkhorn_wasserstein
from .diagnostics.moments import empirical_moments
from .models.attention.base import AbstractGaussianClosure
from .models.base import AbstractDynamics
from .models.sphere import uniform_sphere
from .solvers import Coupled, Gaussian, Particles, Tracers, solve
from .statistics import RateFit, fit_rate

METRICS = ("mean", "cov", "bw", "coupling", "flow_bw", "w2")


# --------------------------------------------------------------------------------------------
# Gaussian geometry


def gaussian_affine_field(dynamics: AbstractDynamics, mean, cov, t=0.0):
    r"""The affine field Γ_μ(x) = J x + c of μ = N(mean, cov) (euclidean.md §4, "Mechanism"),
    from :meth:`~transformer_pde.models.AbstractGaussianClosure.affine_field`; a ValueError when
    there is no closure (causal attention included: its field depends on positions)."""
    if not isinstance(dynamics, AbstractGaussianClosure):
        raise ValueError(f"no Gaussian closure with an affine field for {type(dynamics).__name__}; use "
                         "a large-n reference instead (law given as a sampler)")
    return dynamics.affine_field(mean, cov, t)


# --------------------------------------------------------------------------------------------
# Distances


def _metrics(x, z, m_ref, S_ref, y_ref, w2_epsilon, with_w2):
    m, S = empirical_moments(x)
    mz, Sz = empirical_moments(z)
    out = {
        "mean": jnp.linalg.norm(m - m_ref),
        "cov": jnp.linalg.norm(S - S_ref),
        "bw": bures_wasserstein(m, S, m_ref, S_ref),
        "coupling": jnp.sqrt(jnp.mean(jnp.sum((x - z) ** 2, axis=-1))),
        "flow_bw": bures_wasserstein(mz, Sz, m_ref, S_ref),
    }
    if with_w2:
        batch = None if x.shape[0] * y_ref.shape[0] <= (1 << 24) else 1024
        out["w2"] = sinkhorn_wasserstein(x, y_ref, epsilon=w2_epsilon, threshold=1e-4,
                                         max_iterations=2000, batch_size=batch)
    else:
        out["w2"] = jnp.full((), jnp.nan, x.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Runs


@eqx.filter_jit
def _run_gaussian(dynamics, mean0, cov0, keys, n, ts, t1, dt0, solver, w2_epsilon, with_w2,
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
            return _metrics(x, z, m, S, yref, w2_epsilon, with_w2)

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
    SA, USA, ℓ²; sphere.md §1). By symmetry about x, Γ_σ(x) = ∫ e^{β⟨x,y⟩} y dσ(y) / Z(x) is
    parallel to x, and its tangent part P⊥_x Γ_σ(x) is 0 (checked in the tests: the field of an
    n-sample is O(n^{-1/2}))."""
    if int(d) < 2:
        raise ValueError(f"uniform_sphere_law needs d >= 2, got {d}")
    d = int(d)
    return StationaryLaw(lambda key, n: uniform_sphere(key, n, d), np.zeros(d), np.eye(d) / d)


@eqx.filter_jit
def _run_stationary(dynamics, sampler, mean, cov, keys, n, ts, t1, dt0, solver, w2_epsilon, with_w2,
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
            return _metrics(x, x0, mean, cov, sampler(ky, n).astype(dtype), w2_epsilon, with_w2)

        return solve(dynamics, Particles(x0, w), t1=t1, dt0=dt0, solver=solver, max_steps=max_steps,
                     saveat=diffrax.SaveAt(ts=ts, fn=save)).stats

    return jax.lax.map(one, keys)


@eqx.filter_jit
def _run_reference(dynamics, sampler, keys, ref_key, n, n_ref, ts, t1, dt0, solver, w2_epsilon,
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
            return _metrics(x, z, m, S, xr, w2_epsilon, with_w2)

        # the system, and tracers moved by the field of the large reference system
        state = Coupled(Particles(x0, w), Tracers(Particles(xref0, wref), x0))
        return solve(dynamics, state, t1=t1, dt0=dt0, solver=solver, max_steps=max_steps,
                     saveat=diffrax.SaveAt(ts=ts, fn=save)).stats

    return jax.lax.map(one, keys)


# --------------------------------------------------------------------------------------------
# References: the mean field a law is compared with, chosen once from the type of the law


class AbstractMeanFieldReference(abc.ABC):
    """The mean-field reference of a study: it runs the n-particle systems of one n (every seed)
    beside the mean field and returns their errors, metric name -> ``(seeds, times)``."""

    dim: int

    @abc.abstractmethod
    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, w2_epsilon, with_w2, max_steps) -> dict:
        ...


@dataclasses.dataclass(frozen=True)
class GaussianClosureReference(AbstractMeanFieldReference):
    """μ_t = N(α(t), Σ(t)) from the moment ODEs of the Gaussian closure, started at
    N(``mean``, ``cov``); the tracers move along the closure's affine field."""

    mean: jax.Array
    cov: jax.Array

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, w2_epsilon, with_w2, max_steps) -> dict:
        return _run_gaussian(dynamics, self.mean, self.cov, keys, n, ts, t1, dt0, solver, w2_epsilon,
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

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, w2_epsilon, with_w2, max_steps) -> dict:
        return _run_stationary(dynamics, self.law.sample, self.mean, self.cov, keys, n, ts, t1, dt0,
                               solver, w2_epsilon, with_w2, max_steps)

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

    def errors(self, dynamics, keys, n, ts, t1, dt0, solver, w2_epsilon, with_w2, max_steps) -> dict:
        return _run_reference(dynamics, self.sampler, keys, self.key, n, self.n_ref, ts, t1, dt0,
                              solver, w2_epsilon, with_w2, max_steps)

    def __str__(self):
        return f"particles({self.n_ref})"


def mean_field_reference(dynamics: AbstractDynamics, law, n_ref: int, dtype) -> AbstractMeanFieldReference:
    """The reference a law is compared with: a :class:`~transformer_pde.Gaussian` (the dynamics
    must have a Gaussian closure) gives :class:`GaussianClosureReference`, a :class:`StationaryLaw`
    :class:`StationaryReference`, a sampler ``(key, n) -> (n, d)`` an ``n_ref``-particle
    :class:`ParticleReference` (seeded by ``jax.random.key(2**31 - 1)``)."""
    if isinstance(law, Gaussian):
        if dynamics.dim is not None and dynamics.dim != law.dim:
            raise ValueError(f"the Gaussian has dimension {law.dim} but the dynamics act on d={dynamics.dim}")
        gaussian_affine_field(dynamics, law.mean, law.cov)  # raises early if there is no closure
        return GaussianClosureReference(law.mean.astype(dtype), law.cov.astype(dtype))
    if isinstance(law, StationaryLaw):
        return StationaryReference(law, jnp.asarray(law.mean, dtype), jnp.asarray(law.cov, dtype))
    if callable(law):
        d = int(jax.eval_shape(lambda k: law(k, 2), jax.random.key(0)).shape[-1])
        return ParticleReference(law, int(n_ref), jax.random.key(2**31 - 1), d)
    raise ValueError(f"law must be a tp.Gaussian, a StationaryLaw or a sampler (key, n) -> (n, d), got "
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
            reads ``gaussian``, ``stationary`` or ``particles(n_ref)``).
    """

    ns: np.ndarray
    seeds: np.ndarray
    ts: np.ndarray
    errors: dict
    dim: int
    reference: AbstractMeanFieldReference

    def rates(self, metric: str, time_index: int = -1, **kwargs) -> RateFit:
        """Log-log fit of ``errors[metric][:, :, time_index]`` against n
        (:func:`transformer_pde.statistics.fit_rate`)."""
        return fit_rate(self.ns, self.errors[metric][:, :, time_index], **kwargs)


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
        law: :class:`Gaussian`, :class:`StationaryLaw` or a sampler.
        ns: particle counts (e.g. ``2 ** np.arange(6, 17)``).
        t1, dt0: horizon and constant step of the solver (default Tsit5).
        ts: measurement times in [0, t1] (default ``[0, t1]``; include 0 to see the sampling
            error at t = 0).
        seeds: the initial samples of seed s use ``jax.random.key(s)``; the same key drives the
            particles and their tracers (same-seed coupling).
        n_ref: size of the reference system (particle laws only; default 8 · max(ns)).
        w2_epsilon: ε of the Sinkhorn divergence (absolute, in squared distance units).
        w2_max_n: skip ``w2`` (NaN) above this n: the Sinkhorn solve costs O(n²) per iteration.
        progress: called with a line of text after every n.
    """
    ns = np.asarray(sorted({check_count(n, f"ns[{i}]", minimum=2) for i, n in enumerate(ns)}))
    if ns.size < 1:
        raise ValueError(f"ns must hold particle counts >= 2, got {ns.tolist()}")
    seeds = [check_count(s, f"seeds[{i}]", minimum=0) for i, s in enumerate(seeds)]
    if len(set(seeds)) != len(seeds):
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        raise ValueError(f"seeds must be distinct (each is one independent sample; a repeat would "
                         f"narrow the band), got {twice} more than once")
    if n_ref is not None:
        n_ref = check_count(n_ref, "n_ref", minimum=2)
        if n_ref < ns[-1]:
            raise ValueError(f"n_ref={n_ref} must be at least the largest n={int(ns[-1])} (the "
                             f"reference stands in for the mean-field limit)")
    if not float(t1) > 0 or not float(dt0) > 0:
        raise ValueError(f"need t1 > 0 and dt0 > 0, got t1={t1}, dt0={dt0}")
    if len(seeds) < 1:
        raise ValueError("need at least one seed")
    if not float(w2_epsilon) > 0:
        raise ValueError(f"w2_epsilon must be > 0, got {w2_epsilon}")
    dtype = jnp.dtype(dtype or jnp.result_type(float))
    ts = np.asarray([0.0, float(t1)] if ts is None else ts, dtype=np.float64)
    if ts.ndim != 1 or np.any(np.diff(ts) < 0) or ts[0] < 0 or ts[-1] > float(t1) * (1 + 1e-9):
        raise ValueError(f"ts must be non-decreasing times in [0, t1={t1}], got {ts.tolist()}")
    solver = diffrax.Tsit5() if solver is None else solver
    keys = jnp.stack([jax.random.key(int(s)) for s in seeds])
    t1a, dt0a, tsa = (jnp.asarray(v, dtype) for v in (t1, dt0, ts))
    max_steps = int(np.ceil(float(t1) / float(dt0) * (1 + 1e-6))) + 1
    errors = {k: np.zeros((ns.size, len(seeds), ts.size)) for k in METRICS}
    reference = mean_field_reference(dynamics, law, int(n_ref or 8 * ns[-1]), dtype)
    for i, n in enumerate(ns):
        with_w2 = bool(n <= w2_max_n)
        out = reference.errors(dynamics, keys, int(n), tsa, t1a, dt0a, solver, w2_epsilon, with_w2,
                               max_steps)
        for k in METRICS:
            errors[k][i] = np.asarray(out[k], dtype=np.float64)
        if progress is not None:
            progress(f"n={n}: " + ", ".join(f"{k}={np.mean(errors[k][i, :, -1]):.3g}"
                                           for k in METRICS if with_w2 or k != "w2"))
    return ConvergenceResult(ns=ns, seeds=np.asarray(seeds), ts=ts, errors=errors, dim=reference.dim,
                             reference=reference)


# --------------------------------------------------------------------------------------------
# Rates


def reference_rates(d: int) -> dict:
    """The rates to compare with: Monte Carlo n^{-1/2} and the empirical W_2 rate n^{-1/d}
    (n^{-1/2} up to logs for d <= 2)."""
    return {"monte_carlo": -0.5, "empirical_w2": -1.0 / max(d, 2)}


def rate_table(result: ConvergenceResult, metrics=None, time_index: int = -1) -> list[dict]:
    """One row per metric: fitted slope, its interval, and the reference rates."""
    rows = []
    for k in metrics or METRICS:
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
    """Powers of two 2^lo, 2^(lo + step), ..., up to 2^hi."""
    return 2 ** np.arange(int(lo), int(hi) + 1, int(step))


__all__ = [
    "AbstractMeanFieldReference",
    "ConvergenceResult",
    "GaussianClosureReference",
    "ParticleReference",
    "StationaryLaw",
    "StationaryReference",
    "convergence_study",
    "gaussian_affine_field",
    "geometric_ns",
    "mean_field_reference",
    "rate_table",
    "reference_rates",
    "uniform_sphere_law",
]
