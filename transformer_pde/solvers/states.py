"""What :func:`transformer_pde.solve` evolves: typed states, each owning its equations.

A state says which arrays move (:meth:`AbstractState.y`), how they move under a dynamics
(:meth:`AbstractState.vector_field`), how a step ends (the dynamics' retraction), what a save
sees and when the state has blown up; the solve itself is the same for all of them.

* :class:`Particles` — tokens ``(n, d)`` with weights: μ = Σ_j w_j δ_{x_j} (docs: math/attention.md#conventions). A
  bare array given to ``tp.solve`` is ``Particles(x)``, uniform weights.
* :class:`Gaussian` — N(mean, cov) under the Gaussian closure (docs: math/gaussian.md#moment-equations): the moment
  ODEs.
* :class:`Tracers` — a carrier state and test particles z moved by the carrier's field,
  dz/dt = Γ_μ(z), without acting on it: the characteristics of the mean field (the
  same-seed coupling of the convergence studies).
* :class:`WithLogDensity` — particles or tracers carrying log ρ along their paths,
  d/dt log ρ(t, X_t) = −div Γ_{μ_t}(X_t) (docs: math/mean_field.md#densities-along-characteristics; the surface
  divergence on the sphere): the density of the mean field where the tokens are, with no kernel density estimate.
* :class:`Coupled` — several states evolved side by side by one dynamics, with one step
  sequence (a system and its reference).
* :class:`ODEState` — a plain pytree under an :class:`AbstractODE` (reduced ODEs of
  :mod:`transformer_pde.theory`, PDEs discretized in space).
"""

from __future__ import annotations

import abc
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (as_float_array, check_covariance, check_finite, check_points, check_weights, check_weights_of,
                       is_concrete, runtime_check)
from .._types import PointsLike, WeightsLike
from ..models.attention.base import AbstractFieldAttention, AbstractGaussianClosure
from ..models.base import (
    AbstractDynamics,
    AbstractFieldDynamics,
    AbstractRetractedDynamics,
    retract_at,
    retract_step,
)
from ..models.sphere import Sphere, unchecked_tangent_projection
from .events import AbstractBlowUp
from .solution import GaussianSolution, Solution


class AbstractODE(eqx.Module):
    """An ODE dy/dt = f(t, y) on a pytree y that is not a system of tokens: a reduced ODE, a PDE
    discretized in space. ``tp.solve(ode, y0, ...)`` integrates it (y0 a pytree of arrays)."""

    @abc.abstractmethod
    def rhs(self, t, y):
        """dy/dt at (t, y)."""


class AbstractState(eqx.Module):
    """A state of :func:`transformer_pde.solve`: the arrays that move and how they move."""

    @abc.abstractmethod
    def prepare(self, dynamics) -> "AbstractState":
        """This state checked against ``dynamics`` (ValueError naming what is wrong), with every
        default filled in (weights)."""

    @property
    @abc.abstractmethod
    def y(self) -> Any:
        """The arrays that move (the diffrax state)."""

    @abc.abstractmethod
    def vector_field(self, dynamics, t, y) -> Any:
        """dy/dt under ``dynamics`` (unchecked; traced inside the solve)."""

    def term(self, dynamics) -> diffrax.AbstractTerm:
        """The diffrax term of dy/dt (a state with a stiff part splits it: a ``MultiTerm`` of an
        explicit and an implicit part, for IMEX solvers)."""
        return diffrax.ODETerm(lambda t, y, args: self.vector_field(dynamics, t, y))

    def default_solver(self) -> diffrax.AbstractSolver:
        """The solver of ``tp.solve(..., solver=None)``."""
        return diffrax.Tsit5()

    def default_controller(self) -> diffrax.AbstractStepSizeController:
        """The step-size controller of ``tp.solve(..., stepsize_controller=None)``."""
        return diffrax.ConstantStepSize()

    @property
    def dtype(self):
        """The precision of the run: the dtype of the moving arrays."""
        return jax.tree_util.tree_leaves(self.y)[0].dtype

    def retracts(self, dynamics) -> bool:
        """Whether every step ends with the dynamics' retraction."""
        return False

    @abc.abstractmethod
    def restart(self, value) -> "AbstractState":
        """This state started again from ``value``, what a save of it saw (the start of the next
        chunk of a resumable run, :func:`transformer_pde.runs.solve_checkpointed`)."""

    def saved_values(self, solution) -> Any:
        """What the saves of a solution of this state hold, one entry per save time."""
        return solution.xs

    def retract_step(self, dynamics, y, t0, t1):
        return y

    def value(self, dynamics, y, t):
        """What a save sees at time t (a dense-output state mapped where states live)."""
        return y

    def resolve(self, event: AbstractBlowUp) -> Any:
        """The stop criterion ``event`` means for this state, with its defaults filled in (a
        Gaussian's threshold); handed back to :meth:`blown_up`."""
        return None

    def blown_up(self, criterion, y):
        """True once the state has left every bounded set (default: a NaN or inf anywhere)."""
        return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(y)]))

    def check_statistics(self) -> None:
        """ValueError if this state cannot save ``SaveAt(fn=...)`` statistics."""

    def final_value(self, y):
        """What the solution keeps of the state where the run stopped (default: nothing)."""
        return None

    def solution(self, ts, saved, statistics: bool, stop_time, final, num_steps, result, criterion):
        """The solution of a run: ``saved`` are the values (or statistics) at ``ts``, ``stop_time``
        the time a blow-up stopped the run (``inf`` if none; None when unwatched)."""
        return Solution(ts=ts, xs=None if statistics else saved, stats=saved if statistics else None,
                        weights=None, num_steps=num_steps, result=result, nonfinite_time=stop_time)


class AbstractNoisyState(AbstractState):
    """A state that takes independent noise (docs: math/noise.md#independent-noise; ``tp.Noise``):
    it says which Brownian motion it needs and how an increment moves it. ``tp.solve`` refuses
    noise on any other state, naming it."""

    @abc.abstractmethod
    def noise_shape(self, dynamics) -> Any:
        """The Brownian motion this state needs: a pytree of ``jax.ShapeDtypeStruct`` (None where
        the noise acts deterministically, as on a Gaussian's moments)."""

    @abc.abstractmethod
    def diffusion(self, dynamics, t, y, dB) -> Any:
        """The increment of y for a Brownian increment dB (unit σ; linear in dB)."""

    @abc.abstractmethod
    def additive_noise(self, dynamics) -> bool:
        """Whether the increment is σ dB itself (solvers for additive noise, such as
        ``diffrax.ShARK``, then apply)."""

    def noise_drift(self, dynamics, t, y, sigma) -> Any:
        """What noise of strength σ adds to dy/dt deterministically (None: nothing)."""
        return None

    def check_noise(self, dynamics) -> None:
        """ValueError if a part of this state cannot take noise (naming it)."""


def _dynamics_name(dynamics) -> str:
    return type(dynamics).__name__


class Particles(AbstractNoisyState):
    """Tokens with weights, μ = Σ_j w_j δ_{x_j} (docs: math/attention.md#conventions): the state of every particle
    dynamics. The weights are fixed in time (masses of a quadrature rule, a weighted sample).

    Args:
        x: tokens, shape ``(n, d)``.
        weights: shape ``(n,)``, non-negative, summing to one (None: uniform).

    Example:
        ```python
        import jax.numpy as jnp, transformer_pde as tp

        x = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
        mu = tp.Particles(x, weights=jnp.array([0.25, 0.25, 0.5]))   # μ = Σ_j w_j δ_{x_j}
        sol = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(d=2, beta=1.0)), mu, t1=1.0, dt0=0.1)
        sol.weights                                             # the same weights: they do not move
        ```
    """

    x: jax.Array
    weights: jax.Array | None

    def __init__(self, x: PointsLike, weights: WeightsLike | None = None):
        # checked once here (concrete: ValueError; traced: eqx.error_if), never per step
        self.x = check_points(x, "Particles.x")
        if weights is None:
            self.weights = None
        else:
            # kept in their dtype; the sum to the looser tolerance (prepare() checks in x's dtype)
            self.weights = check_weights_of(weights, self.x.dtype, self.x.shape[0], "Particles.weights")

    def prepare(self, dynamics):
        if not isinstance(dynamics, AbstractDynamics):
            raise ValueError(f"dynamics must be an attention or tp.Sphere(attention) (a tp.AbstractDynamics "
                             f"of tokens), got {_dynamics_name(dynamics)}")
        x = dynamics.check_state(self.x, "x0")
        # the checked values in place (not Particles(...), whose __init__ would check them again)
        return eqx.tree_at(lambda p: (p.x, p.weights), self, (x, check_weights(self.weights, x.shape[0], x.dtype)),
                           is_leaf=lambda v: v is None)

    @property
    def y(self):
        return self.x

    def restart(self, value):
        return eqx.tree_at(lambda p: p.x, self, value)

    def vector_field(self, dynamics, t, y):
        # the state's dtype sets the precision of the run: float32 tokens with float64
        # parameters (e.g. under x64) integrate in float32 instead of failing on a dtype mismatch
        return dynamics.vector_field(y, self.weights, t).astype(y.dtype)

    def retracts(self, dynamics):
        return isinstance(dynamics, AbstractRetractedDynamics)

    def retract_step(self, dynamics, y, t0, t1):
        return retract_step(dynamics, y, t0, t1)

    def value(self, dynamics, y, t):
        return retract_at(dynamics, y, t)

    def noise_shape(self, dynamics):
        return jax.ShapeDtypeStruct(self.x.shape, self.x.dtype)

    def diffusion(self, dynamics, t, y, dB):
        return dynamics.diffusion(y, dB, t).astype(y.dtype)

    def additive_noise(self, dynamics):
        return dynamics.additive_noise

    def solution(self, ts, saved, statistics, stop_time, final, num_steps, result, criterion):
        sol = super().solution(ts, saved, statistics, stop_time, final, num_steps, result, criterion)
        return eqx.tree_at(lambda s: s.weights, sol, self.weights, is_leaf=lambda v: v is None)

    def field_at(self, dynamics, queries, y, t):
        """Γ_μ(queries) for μ = Σ_j w_j δ_{y_j}: the velocity of test particles."""
        return _field_at(dynamics, queries, y, self.weights, t)

    def check_field(self, dynamics):
        """ValueError unless the dynamics has a field at arbitrary points."""
        inner = dynamics.dynamics if isinstance(dynamics, Sphere) else dynamics
        if not isinstance(inner, AbstractFieldAttention):
            raise ValueError(f"{_dynamics_name(dynamics)} has no field at arbitrary points (a causal "
                             "attention's depends on positions); test particles need a position-free "
                             "attention or Sphere(attention)")


    def divergence_at(self, dynamics, queries, y, t):
        """div Γ_μ(queries), μ = Σ_j w_j δ_{y_j} held fixed (surface divergence on the sphere)."""
        return dynamics.divergence(queries, y, self.weights, t)

    def check_divergence(self, dynamics):
        """ValueError unless the dynamics' field has a divergence at arbitrary points."""
        if not _has_divergence(dynamics):
            raise ValueError(f"{_dynamics_name(dynamics)} has no field with a divergence at arbitrary "
                             "points: a density along characteristics needs a position-free field "
                             "(tp.AbstractFieldDynamics: a field attention, tp.MLP) or "
                             "tp.Sphere(one of them); causal attentions, PostLN and retracted blocks have none")

    def tracked_divergence(self, dynamics, t, y):
        """div of the field at the tracked tokens (the particles themselves), shape ``(n,)``."""
        return self.divergence_at(dynamics, y, y, t)


def _has_divergence(dynamics) -> bool:
    return isinstance(dynamics, AbstractFieldDynamics) or (isinstance(dynamics, Sphere) and dynamics.has_field)


def _field_at(dynamics, queries, x, weights, t):
    """Γ_μ(queries) for μ = Σ_j w_j δ_{x_j}, tangent on the sphere for ``Sphere(attention)``."""
    if isinstance(dynamics, Sphere):
        return unchecked_tangent_projection(queries, _field_at(dynamics.dynamics, queries, x, weights, t))
    return dynamics.query_field(queries, x, weights, t)


def default_blowup_factor(dtype) -> float:
    """tr Σ / tr Σ0 that counts as a blow-up: 1e10 in float64; in lower precision the largest
    growth the time grid can still resolve, 1e-3/eps (8.4e3 in float32). Near a Riccati pole
    Σ ~ 1/(t* − t), and t* − t cannot go below eps·t*: a larger threshold is never reached, the
    adaptive steps shrink to nothing and the solve ends on max_steps instead of the blow-up."""
    return float(min(1e10, 1e-3 / float(jnp.finfo(dtype).eps)))


class Gaussian(AbstractNoisyState):
    """A Gaussian measure N(mean, cov) (docs: math/gaussian.md#moment-equations): under an attention with a Gaussian
    closure (:class:`~transformer_pde.models.AbstractGaussianClosure`) it stays Gaussian, and
    ``tp.solve`` integrates the moment ODEs α' = Jα + c, Σ' = JΣ + ΣJᵀ.

    Args:
        mean: shape ``(d,)``.
        cov: shape ``(d, d)``, symmetric positive definite.

    Example:
        ```python
        import jax.numpy as jnp, transformer_pde as tp

        g0 = tp.Gaussian(mean=jnp.zeros(2), cov=jnp.eye(2))
        sol = tp.solve(tp.SoftmaxAttention.identity(d=2, beta=1.0), g0, t1=1.0, dt0=0.1)   # the moment ODEs
        sol.means.shape, sol.covs.shape                         # (1, 2), (1, 2, 2): a GaussianSolution
        ```
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
        # singular up to round-off counts as singular: the closure needs cov^{-1}
        cov = check_covariance(cov, "Gaussian.cov", definite=True)
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
        against N(mean, cov). ``tp.Particles(points, weights)`` is then a state of the particle
        solver whose moments follow the Gaussian closure to quadrature accuracy
        (docs: math/attention.md#conventions, weighted measures).
        """
        if int(order) < 1:
            raise ValueError(f"Gauss–Hermite order must be >= 1, got {order}")
        if int(order) ** self.dim > 10**7:
            raise ValueError(f"order**d = {int(order)}**{self.dim} points is too many for a tensor "
                             "grid; lower the order")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            z, w = np.polynomial.hermite_e.hermegauss(int(order))  # weight e^{-z^2/2}
        if not np.isfinite(w).all():  # NumPy's weights overflow past order ~365
            raise ValueError(f"Gauss–Hermite order={order} is beyond what NumPy's hermegauss computes (its "
                             "weights overflow); lower the order")
        w = w / w.sum()
        grids = np.meshgrid(*([z] * self.dim), indexing="ij")
        pts = np.stack([g.ravel() for g in grids], axis=-1)
        wts = np.ones(pts.shape[0])
        for ws in np.meshgrid(*([w] * self.dim), indexing="ij"):
            wts = wts * ws.ravel()
        L = jnp.linalg.cholesky(self.cov)
        x = self.mean[None, :] + jnp.asarray(pts, self.mean.dtype) @ L.T
        return x, jnp.asarray(wts / wts.sum(), self.mean.dtype)

    # --- as a state of tp.solve ---------------------------------------------------------------
    def prepare(self, dynamics):
        if not isinstance(dynamics, AbstractGaussianClosure):
            raise ValueError(
                f"{_dynamics_name(dynamics)} has no Gaussian closure: its field of a Gaussian is not "
                "affine in x (sigmoid, unnormalized and causal attention: a causal field depends on "
                "positions), or tokens live on the "
                "sphere, where no Gaussian on R^d is a state (the Gaussian closure, docs/math/gaussian.md, "
                "needs an affine field)")
        if dynamics.dim is not None and self.dim != dynamics.dim:
            raise ValueError(f"Gaussian has dimension {self.dim} but the dynamics act on d={dynamics.dim}")
        jax.eval_shape(dynamics.moment_velocity, self.mean, self.cov, jnp.zeros((), self.dtype))
        return self

    @property
    def y(self):
        return self.mean, self.cov

    def restart(self, value):
        return eqx.tree_at(lambda g: (g.mean, g.cov), self, tuple(value))

    def saved_values(self, solution):
        return solution.means, solution.covs

    def vector_field(self, dynamics, t, y):
        m, c = y
        dm, dc = dynamics.moment_velocity(m, c, t)
        # the state's dtype rules (float32 moments with float64 parameters stay float32)
        return dm.astype(m.dtype), dc.astype(c.dtype)

    def noise_shape(self, dynamics):
        return None  # isotropic additive noise keeps a Gaussian Gaussian: Σ' += σ²I, no path

    def diffusion(self, dynamics, t, y, dB):
        return jax.tree.map(jnp.zeros_like, y)

    def additive_noise(self, dynamics):
        return False  # the moments take no increment (a tracer's does: Tracers asks its own)

    def noise_drift(self, dynamics, t, y, sigma):
        """dX = (JX + c)dt + σ dB keeps N(α, Σ) Gaussian with α' = Jα + c, Σ' = JΣ + ΣJᵀ + σ²I
        (Itô's formula for the second moments; the field depends on μ only through (α, Σ))."""
        m, c = y
        return jnp.zeros_like(m), (sigma ** 2 * jnp.eye(m.shape[0])).astype(c.dtype)

    def field_at(self, dynamics, queries, y, t):
        """The affine field J z + c of N(mean, cov) at test particles z."""
        J, c = dynamics.affine_field(*y, t)
        return queries @ J.T + c[None, :]

    def check_field(self, dynamics):
        pass  # prepare() checked the closure

    def divergence_at(self, dynamics, queries, y, t):
        """div (Jz + c) = tr J at every query: the Gaussian closure's field is affine."""
        J, _ = dynamics.affine_field(*y, t)
        return jnp.broadcast_to(jnp.trace(J), queries.shape[:1])

    def check_divergence(self, dynamics):
        pass  # prepare() checked the closure

    def resolve(self, event: AbstractBlowUp):
        """The threshold on tr Σ: ``event.threshold``, default :func:`default_blowup_factor` · tr Σ0."""
        if event.threshold is None:
            return (default_blowup_factor(self.dtype) * jnp.trace(self.cov)).astype(self.dtype)
        threshold = jnp.asarray(event.threshold, self.dtype)
        if is_concrete(threshold) and is_concrete(self.cov) and not (
                float(threshold) > float(np.trace(np.asarray(self.cov)))):
            raise ValueError(f"BlowUp threshold={float(threshold)} must exceed tr Σ0 = "
                             f"{float(np.trace(np.asarray(self.cov)))}")
        return threshold

    def blown_up(self, threshold, y):
        m, c = y
        # `~(tr <= threshold)` is also true for NaN: a step that overflowed stops the solve too
        return ~(jnp.trace(c) <= threshold) | ~jnp.all(jnp.isfinite(m))

    def final_value(self, y):
        return y

    def check_statistics(self):
        raise ValueError("SaveAt(fn=...) statistics apply to particles; a Gaussian solve saves the "
                         "moments (means, covs), at one set of times (no SaveAt(subs=[...]))")

    def solution(self, ts, saved, statistics, stop_time, final, num_steps, result, threshold):
        means, covs = saved
        final_time, (final_mean, final_cov) = final
        # diffrax marks save times after the stop with inf; a save inside a final step that
        # overflowed is interpolated from non-finite values: mark those inf as well.
        bad = ~(jnp.all(jnp.isfinite(covs), axis=(1, 2)) & jnp.all(jnp.isfinite(means), axis=1))
        means = jnp.where(bad[:, None], jnp.inf, means)
        covs = jnp.where(bad[:, None, None], jnp.inf, covs)
        if stop_time is None:
            stop_time = jnp.asarray(jnp.inf, ts.dtype)
            threshold = jnp.asarray(jnp.nan, ts.dtype)
        return GaussianSolution(ts=ts, means=means, covs=covs, blowup_time=stop_time.astype(ts.dtype),
                                final_time=final_time, final_mean=final_mean, final_cov=final_cov,
                                threshold=threshold, num_steps=num_steps, result=result)


class Tracers(AbstractNoisyState):
    """Test particles z moved by the field of a carrier state without acting on it:
    dz_i/dt = Γ_{μ_t}(z_i), with μ_t the carrier (:class:`Particles` or :class:`Gaussian`)
    evolving under the same dynamics. Started at i.i.d. samples of μ_0, the z_i(t) are i.i.d.
    samples of μ_t: the characteristics of the mean field.

    Args:
        carrier: the state whose field moves the tracers.
        z: tracers, shape ``(m, d)``.
    """

    carrier: Particles | Gaussian
    z: jax.Array

    def __init__(self, carrier: Particles | Gaussian, z: PointsLike):
        if not isinstance(carrier, (Particles, Gaussian)):
            raise ValueError(f"Tracers need a carrier tp.Particles or tp.Gaussian, got {type(carrier).__name__}")
        self.carrier = carrier
        self.z = check_points(z, "Tracers.z")

    def prepare(self, dynamics):
        carrier = self.carrier.prepare(dynamics)
        carrier.check_field(dynamics)
        return Tracers(carrier, dynamics.check_state(check_finite(self.z, "Tracers.z"), "Tracers.z"))

    @property
    def y(self):
        return self.carrier.y, self.z

    def restart(self, value):
        vc, z = value
        return eqx.tree_at(lambda s: (s.carrier, s.z), self, (self.carrier.restart(vc), z))

    def vector_field(self, dynamics, t, y):
        yc, z = y
        return self.carrier.vector_field(dynamics, t, yc), self.carrier.field_at(dynamics, z, yc, t)

    def retracts(self, dynamics):
        return isinstance(dynamics, AbstractRetractedDynamics)

    def retract_step(self, dynamics, y, t0, t1):
        yc, z = y
        return self.carrier.retract_step(dynamics, yc, t0, t1), retract_step(dynamics, z, t0, t1)

    def value(self, dynamics, y, t):
        yc, z = y
        return self.carrier.value(dynamics, yc, t), retract_at(dynamics, z, t)

    def noise_shape(self, dynamics):
        """The carrier's noise and the tracers' own, independent of it: started at samples of
        μ_0, the tracers are then i.i.d. samples of the noisy mean field (McKean–Vlasov)."""
        return self.carrier.noise_shape(dynamics), jax.ShapeDtypeStruct(self.z.shape, self.z.dtype)

    def diffusion(self, dynamics, t, y, dB):
        (yc, z), (dc, dz) = y, dB
        return self.carrier.diffusion(dynamics, t, yc, dc), dynamics.diffusion(z, dz, t).astype(z.dtype)

    def noise_drift(self, dynamics, t, y, sigma):
        yc, z = y
        drift = self.carrier.noise_drift(dynamics, t, yc, sigma)
        return None if drift is None else (drift, jnp.zeros_like(z))

    def additive_noise(self, dynamics):
        return self.carrier.additive_noise(dynamics) and dynamics.additive_noise

    def resolve(self, event):
        return self.carrier.resolve(event)

    def blown_up(self, criterion, y):
        yc, z = y
        return self.carrier.blown_up(criterion, yc) | ~jnp.all(jnp.isfinite(z))

    def check_divergence(self, dynamics):
        self.carrier.check_divergence(dynamics)

    def tracked_divergence(self, dynamics, t, y):
        """div of the carrier's field at the tracers, shape ``(m,)``."""
        yc, z = y
        return self.carrier.divergence_at(dynamics, z, yc, t)


class WithLogDensity(AbstractState):
    r"""Tokens carrying the log-density of their law along their paths
    (docs: math/mean_field.md#densities-along-characteristics):

    $$\frac{d}{dt}\log\rho(t, X_t) = -\operatorname{div}\Gamma_{\mu_t}(X_t),$$

    the instantaneous change of variables of continuous normalizing flows (Chen et al., arXiv
    1806.07366), with the divergence of the field in x at fixed μ
    (:meth:`~transformer_pde.models.AbstractFieldDynamics.divergence`: closed form for softmax
    attention and MLPs, autodiff otherwise; on the sphere the surface divergence, so ρ is a
    density w.r.t. the surface measure). Started at ρ_0 at the tracked tokens, ``log_rho`` is
    log ρ_t where they are at every save.

    Args:
        tokens: ``tp.Particles(x, weights)`` (a bare ``(n, d)`` array: uniform weights), whose own
            measure moves them (the density of the mean field, up to the particles' error in the
            field), or ``tp.Tracers(carrier, z)``, tracers moved by a carrier's field (a
            ``tp.Gaussian`` carrier: the exact mean-field density along exact characteristics).
        log_rho0: log ρ_0 at the tracked tokens (the particles, or the tracers), shape ``(n,)``.

    ``tp.solve(dyn, tp.WithLogDensity(x0, log_rho0), ...)`` returns a :class:`Solution` whose
    ``xs`` is the pair ``(tokens, log_rho)`` (``(T, n, d)`` and ``(T, n)`` for particles); a
    ``SaveAt(fn=...)`` statistic sees ``(x, log_rho)``.
    """

    tokens: Particles | Tracers
    log_rho0: jax.Array

    def __init__(self, tokens, log_rho0):
        if not isinstance(tokens, (Particles, Tracers)):
            if isinstance(tokens, AbstractState):
                raise ValueError(f"WithLogDensity carries a density on tp.Particles or tp.Tracers, got "
                                 f"{type(tokens).__name__}")
            tokens = Particles(tokens)
        self.tokens = tokens
        log_rho0 = as_float_array(log_rho0, "WithLogDensity.log_rho0")
        m = self._tracked().shape[0]
        if log_rho0.shape != (m,):
            raise ValueError(f"WithLogDensity.log_rho0 must have shape ({m},), one value per tracked "
                             f"token, got {log_rho0.shape}")
        # finite (the tokens sit where ρ_0 > 0): ValueError naming it now, eqx.error_if when traced
        self.log_rho0 = check_finite(log_rho0, "WithLogDensity.log_rho0")

    def _tracked(self):
        return self.tokens.z if isinstance(self.tokens, Tracers) else self.tokens.x

    def prepare(self, dynamics):
        tokens = self.tokens.prepare(dynamics)
        tokens.check_divergence(dynamics)
        m = self._tracked().shape[0]
        if self.log_rho0.shape != (m,):
            raise ValueError(f"WithLogDensity.log_rho0 must have shape ({m},), one value per tracked "
                             f"token, got {self.log_rho0.shape}")
        log_rho0 = self.log_rho0
        if is_concrete(log_rho0):
            bad = ~np.isfinite(np.asarray(log_rho0))
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"WithLogDensity.log_rho0 must be finite (the tokens sit where ρ_0 > 0), "
                                 f"got log_rho0[{i}] = {float(np.asarray(log_rho0)[i])}")
        else:
            log_rho0 = runtime_check(log_rho0, ~jnp.all(jnp.isfinite(log_rho0)),
                                     "WithLogDensity.log_rho0 must be finite (tokens where ρ_0 > 0)")
        return WithLogDensity(tokens, log_rho0.astype(tokens.dtype))

    @property
    def y(self):
        return self.tokens.y, self.log_rho0

    def restart(self, value):
        vt, log_rho = value
        return eqx.tree_at(lambda s: (s.tokens, s.log_rho0), self, (self.tokens.restart(vt), log_rho))

    def vector_field(self, dynamics, t, y):
        yt, log_rho = y
        div = self.tokens.tracked_divergence(dynamics, t, yt)
        return self.tokens.vector_field(dynamics, t, yt), (-div).astype(log_rho.dtype)

    def retracts(self, dynamics):
        return self.tokens.retracts(dynamics)

    def retract_step(self, dynamics, y, t0, t1):
        yt, log_rho = y
        return self.tokens.retract_step(dynamics, yt, t0, t1), log_rho

    def value(self, dynamics, y, t):
        yt, log_rho = y
        return self.tokens.value(dynamics, yt, t), log_rho

    def resolve(self, event):
        return self.tokens.resolve(event)

    def blown_up(self, criterion, y):
        yt, log_rho = y
        return self.tokens.blown_up(criterion, yt) | ~jnp.all(jnp.isfinite(log_rho))

    def solution(self, ts, saved, statistics, stop_time, final, num_steps, result, criterion):
        return self.tokens.solution(ts, saved, statistics, stop_time, final, num_steps, result, criterion)


class Coupled(AbstractNoisyState):
    """Several states evolved side by side by one dynamics, on one step sequence (e.g. a
    particle system and a large reference system with its tracers). Saves see the tuple of the
    parts' values."""

    parts: tuple[AbstractState, ...]

    def __init__(self, *parts):
        for p in parts:
            if not isinstance(p, AbstractState):
                raise ValueError(f"Coupled parts must be states (tp.Particles, tp.Gaussian, tp.Tracers), "
                                 f"got {type(p).__name__}")
        if not parts:
            raise ValueError("Coupled needs at least one state")
        self.parts = tuple(parts)

    def prepare(self, dynamics):
        return Coupled(*(p.prepare(dynamics) for p in self.parts))

    @property
    def y(self):
        return tuple(p.y for p in self.parts)

    def restart(self, value):
        return eqx.tree_at(lambda s: s.parts, self, tuple(p.restart(v) for p, v in zip(self.parts, value)))

    def vector_field(self, dynamics, t, y):
        return tuple(p.vector_field(dynamics, t, yp) for p, yp in zip(self.parts, y))

    def retracts(self, dynamics):
        return any(p.retracts(dynamics) for p in self.parts)

    def retract_step(self, dynamics, y, t0, t1):
        return tuple(p.retract_step(dynamics, yp, t0, t1) for p, yp in zip(self.parts, y))

    def value(self, dynamics, y, t):
        return tuple(p.value(dynamics, yp, t) for p, yp in zip(self.parts, y))

    def resolve(self, event):
        return tuple(p.resolve(event) for p in self.parts)

    def check_noise(self, dynamics):
        for i, p in enumerate(self.parts):
            if not isinstance(p, AbstractNoisyState):
                raise ValueError(f"Coupled part {i} ({type(p).__name__}) cannot take noise: independent "
                                 "noise moves tokens (tp.Particles, tp.Tracers) or a Gaussian's moments")
            p.check_noise(dynamics)

    def noise_shape(self, dynamics):
        """Each part its own independent noise."""
        return tuple(p.noise_shape(dynamics) for p in self.parts)

    def diffusion(self, dynamics, t, y, dB):
        return tuple(p.diffusion(dynamics, t, yp, db) for p, yp, db in zip(self.parts, y, dB))

    def noise_drift(self, dynamics, t, y, sigma):
        drifts = [p.noise_drift(dynamics, t, yp, sigma) for p, yp in zip(self.parts, y)]
        if all(d is None for d in drifts):
            return None
        return tuple(jax.tree.map(jnp.zeros_like, yp) if d is None else d for d, yp in zip(drifts, y))

    def additive_noise(self, dynamics):
        return all(p.additive_noise(dynamics) for p in self.parts)

    def blown_up(self, criteria, y):
        return jnp.any(jnp.stack([p.blown_up(c, yp) for p, c, yp in zip(self.parts, criteria, y)]))


class ODEState(AbstractState):
    """A pytree of arrays evolving under an :class:`AbstractODE` (``tp.solve(ode, y0)``)."""

    y0: Any

    def prepare(self, dynamics):
        if not isinstance(dynamics, AbstractODE):
            raise ValueError(f"a plain array state needs an ODE (tp.solvers.AbstractODE), got "
                             f"{_dynamics_name(dynamics)}")
        leaves = jax.tree_util.tree_leaves(self.y0)
        if not leaves:
            raise ValueError("the ODE state holds no array")
        y0 = jax.tree.map(lambda a: as_float_array(a, "y0"), self.y0)
        return ODEState(y0)

    @property
    def y(self):
        return self.y0

    def restart(self, value):
        return ODEState(value)

    def vector_field(self, dynamics, t, y):
        return jax.tree.map(lambda d, a: jnp.asarray(d).astype(a.dtype), dynamics.rhs(t, y), y)


def as_state(dynamics, state0) -> AbstractState:
    """``state0`` as a state: a state as given; an array or pytree as :class:`ODEState` under an
    :class:`AbstractODE`, as :class:`Particles` (uniform weights) otherwise."""
    if isinstance(state0, AbstractState):
        return state0
    if isinstance(dynamics, AbstractODE):
        return ODEState(state0)
    return Particles(check_points(state0, "x0"))


__all__ = ["AbstractNoisyState", "AbstractODE", "AbstractState", "Coupled", "Gaussian", "ODEState", "Particles",
           "Tracers", "WithLogDensity", "as_state", "default_blowup_factor"]
