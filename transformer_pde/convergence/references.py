r"""The mean field a study compares with, a value: each reference gives the initial samples, the
states evolved beside the particles (the same-seed tracers and what moves them) and the
measures compared at each save; :func:`~transformer_pde.convergence.runner.run` runs them all."""

from __future__ import annotations

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar
from ..diagnostics.moments import unchecked_moments as empirical_moments  # per save: no checks
from ..diagnostics.study_distances import AbstractStudyDistance, ExactCircle, ExactLine, SinkhornDistance
from ..models.attention.base import AbstractGaussianClosure
from ..models.base import AbstractDynamics, AbstractManifoldDynamics
from ..solvers import Gaussian, Particles, Tracers
from . import runner


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


class AbstractMeanFieldReference(eqx.Module):
    """The mean-field reference of a study: beside the n-particle systems of one n (every seed) it
    evolves its own states, and at each save gives the measures the particles are compared with.

    A reference gives :meth:`initial` (the particles' start from a key), :meth:`companions` (the
    states evolved beside them in one ``tp.Coupled`` state) and :meth:`compared` (at a save, the
    tracers and the reference's moments and measure; a second entry is a coarser reference whose
    change estimates the reference's own error). :meth:`errors` and :meth:`run` run it
    (:func:`~transformer_pde.convergence.runner.run`)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The dimension d of the tokens."""

    @property
    @abc.abstractmethod
    def dtype(self):
        """The dtype of the systems."""

    @abc.abstractmethod
    def initial(self, key, n: int) -> tuple[jax.Array, jax.Array]:
        """``(x0 (n, d), key)``: the particles' initial samples from ``key`` and the key of the
        independent reference samples drawn at the saves (where the reference draws any)."""

    @abc.abstractmethod
    def companions(self, x0) -> tuple:
        """The states evolved beside the particles ``x0`` (their values follow the particles'
        in the saved tuple)."""

    @abc.abstractmethod
    def compared(self, x, x0, key, parts) -> tuple:
        """At a save, for the particles ``x`` and the companions' values ``parts``: one or two
        ``(tracers z, reference mean, reference cov, reference points, their weights or None)``."""

    @property
    @abc.abstractmethod
    def own_error(self) -> float:
        """The error of the reference itself where it is not estimated run by run: 0 (exact up to
        the time stepping) or NaN (unknown)."""

    def errors(self, dynamics, keys, n: int, spec: runner.StudySpec) -> dict:
        """Metric name -> ``(seeds, times)`` for the systems of ``n`` particles, one per key."""
        return self.run(dynamics, keys, n, spec)[0]

    def run(self, dynamics, keys, n: int, spec: runner.StudySpec) -> tuple[dict, dict]:
        """``(errors, reference_error)``: the metrics of :meth:`errors` and, for each, the
        estimated error of the reference in that measurement (same shapes)."""
        out = runner.run(dynamics, self, keys, n, spec)
        return out, out.pop("reference_error")

    def distance(self, dynamics, sinkhorn: SinkhornDistance) -> AbstractStudyDistance:
        """The transport distance the study measures: exact on R (d = 1) and on S¹ (tokens of
        R² under a manifold dynamics), ``sinkhorn`` elsewhere."""
        if self.dim == 1:
            return ExactLine()
        if self.dim == 2 and isinstance(dynamics, AbstractManifoldDynamics):
            return ExactCircle()
        return sinkhorn


class _AbstractMomentReference(AbstractMeanFieldReference):
    """A reference whose fields ``mean``, ``cov`` (each subclass's own, so that its constructor
    keeps its argument order) are the moments of the initial law μ_0 in the study's dtype, and
    which follows μ_t exactly (its own error 0, up to the time stepping): the dimension and dtype
    are the mean's."""

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def dtype(self):
        return self.mean.dtype

    @property
    def own_error(self) -> float:
        return 0.0


class GaussianClosureReference(_AbstractMomentReference):
    """μ_t = N(α(t), Σ(t)) from the moment ODEs of the Gaussian closure, started at
    N(``mean``, ``cov``); the tracers move along the closure's affine field. W₂ is measured to an
    independent n-sample of μ_t."""

    mean: jax.Array
    cov: jax.Array

    def initial(self, key, n):
        kx, ky = jax.random.split(key)
        L = jnp.linalg.cholesky(self.cov)
        return self.mean[None, :] + jax.random.normal(kx, (n, self.dim), self.dtype) @ L.T, ky

    def companions(self, x0):
        return (Tracers(Gaussian(self.mean, self.cov), x0),)

    def compared(self, x, x0, key, parts):
        ((m, S), z), = parts
        # an independent n-sample of μ_t for the W_2 of empirical measures
        y = m[None, :] + jax.random.normal(key, x.shape, self.dtype) @ jnp.linalg.cholesky(S).T
        return ((z, m, S, y, None),)

    def __str__(self):
        return "gaussian"


class StationaryReference(_AbstractMomentReference):
    """μ_t = μ_0 for a :class:`~transformer_pde.convergence.StationaryLaw` (its sampler
    ``sample`` and moments ``mean``, ``cov`` in the study's dtype): exact at every n, the tracers
    at rest; W₂ is measured to an independent n-sample of μ_0."""

    sample: Callable
    mean: jax.Array
    cov: jax.Array

    def initial(self, key, n):
        return self.sample(key, n).astype(self.dtype), jax.random.fold_in(key, 1)

    def companions(self, x0):
        return ()

    def compared(self, x, x0, key, parts):
        # tracers of a vanishing field stay at x0
        return ((x0, self.mean, self.cov, self.sample(key, x.shape[0]).astype(self.dtype), None),)

    def __str__(self):
        return "stationary"


class ParticleReference(AbstractMeanFieldReference):
    """A large system of ``n_ref`` particles sampled by ``sampler`` from its own ``key``, integrated
    beside the n-particle systems; the tracers follow its field. Its own n_ref^{-1/2} error is a
    floor (not estimated: NaN)."""

    sampler: Callable
    n_ref: int = eqx.field(static=True)
    key: jax.Array
    d: int = eqx.field(static=True)
    sample_dtype: np.dtype = eqx.field(static=True)

    @property
    def dim(self) -> int:
        return self.d

    @property
    def dtype(self):
        return self.sample_dtype

    def initial(self, key, n):
        return self.sampler(key, n).astype(self.dtype), key

    def companions(self, x0):
        xref0 = self.sampler(self.key, self.n_ref)
        return (Tracers(Particles(xref0, jnp.full((self.n_ref,), 1.0 / self.n_ref, self.dtype)), x0),)

    def compared(self, x, x0, key, parts):
        (xr, z), = parts
        m, S = empirical_moments(xr)
        return ((z, m, S, xr, None),)

    @property
    def own_error(self) -> float:
        return float("nan")  # ~ n_ref^{-1/2}, not estimated

    def __str__(self):
        return f"particles({self.n_ref})"


class QuadratureReference(AbstractMeanFieldReference):
    """A :class:`~transformer_pde.convergence.QuadratureLaw`'s rule of its order evolved as weighted
    tokens (``rule``) beside the n-particle systems, the particles sampled by ``sample``; the
    tracers (and, on S¹ and R, the finer ``resolved`` measure the exact 1-D distances are taken
    to) follow its field. Its error is estimated in every measurement against the rule of the
    coarser order (``coarse``, ``coarse_resolved``)."""

    sample: Callable
    rule: Particles
    resolved: Particles
    coarse: Particles
    coarse_resolved: Particles
    circle: bool = eqx.field(static=True)
    name: str = eqx.field(static=True)

    @property
    def dim(self) -> int:
        return int(self.rule.x.shape[1])

    @property
    def dtype(self):
        return self.rule.x.dtype

    def initial(self, key, n):
        return self.sample(key, n).astype(self.dtype), key

    def _rules(self):
        return (self.rule, self.resolved), (self.coarse, self.coarse_resolved)

    def companions(self, x0):
        # for each rule, tracers from the particles' starts (same-seed coupling) and the resolved
        # measure, moved by the field of the evolved rule
        return tuple(Tracers(rule, jnp.concatenate([x0, resolved.x])) for rule, resolved in self._rules())

    def compared(self, x, x0, key, parts):
        n = x.shape[0]
        out = []
        for (rule, resolved), (xr, zz) in zip(self._rules(), parts):
            m, S = empirical_moments(xr, rule.weights)
            out.append((zz[:n], m, S, zz[n:], resolved.weights))
        return tuple(out)

    @property
    def own_error(self) -> float:
        return 0.0  # estimated run by run (compared with the coarser rule)

    def distance(self, dynamics, sinkhorn):
        if self.circle:
            return ExactCircle()
        return ExactLine() if self.dim == 1 else sinkhorn

    def __str__(self):
        return self.name


__all__ = ["AbstractMeanFieldReference", "GaussianClosureReference", "ParticleReference", "QuadratureReference",
           "StationaryReference", "gaussian_affine_field"]
