r"""Independent noise on every token (docs: math/noise.md#independent-noise):
``tp.solve(..., noise=tp.Noise(σ), key=key)``.

Every token gets its own Brownian motion,

$$dX_i = \Gamma_{\mu^n}(X_i)\,dt + \sigma(t)\,dB_i \quad\text{on } \mathbb R^d,\qquad
dX_i = P^\perp_{X_i}\Gamma_{\mu^n}(X_i)\,dt + \sigma(t)\,P^\perp_{X_i}\circ dB_i \quad\text{on } S^{d-1},$$

the second a Stratonovich SDE whose diffusion part is (σ²/2)Δ_S (its Itô form adds the drift
−(d−1)(σ²/2)X_i). The mean field is the nonlinear Fokker–Planck equation
∂_tρ + div(ρΓ_ρ) = (σ²/2)Δρ. How an increment moves the tokens is the dynamics' own
(:meth:`~transformer_pde.models.AbstractDynamics.diffusion`: additive in R^d and for the
normalization schemes, whose retraction ends the step; projected on :class:`~transformer_pde.Sphere`);
how it acts on a state is the state's (:mod:`.states`: particles and tracers move, a
:class:`~transformer_pde.Gaussian` gains Σ' += σ²I, a plain ODE refuses noise).

``tp.solve`` integrates the SDE with diffrax: ``MultiTerm(ODETerm(drift), ControlTerm(diffusion,
VirtualBrownianTree(...)))``, one Brownian tree per run from one key (same key, same path; adaptive
steps and gradients supported), with any diffrax SDE solver: Itô (``Euler``) or Stratonovich
(``EulerHeun``, ``Heun``, ``Midpoint``, ``ReversibleHeun``, ``SPaRK``, ``GeneralShARK``,
``SlowRK``), and for additive noise also ``ShARK``, ``SRA1``, ``SEA``. On the sphere Itô and
Stratonovich solvers converge to the same process: the retraction x/|x| that ends each step adds
the Itô drift (N(x + σP⊥ΔB) = x + σP⊥ΔB − (d−1)(σ²h/2)x + o(h) in mean). ``tp.layers`` with
noise is the noisy residual layer x ← R(x + hΓ + σ√h ξ).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar, is_concrete

__all__ = ["AbstractBrownian", "BrownianIncrements", "BrownianTree", "Noise", "check_sde_solver",
           "brownian_levy_area"]


class AbstractBrownian(eqx.Module):
    """How a noisy run draws its Brownian path (a value given to :class:`Noise`)."""

    @abc.abstractmethod
    def path(self, t0, t1, dt0, adaptive: bool, shape, key, levy_area):
        """The ``diffrax.AbstractBrownianPath`` of a run over [t0, t1] (traced)."""

    def check(self, adaptive: bool) -> None:
        """ValueError if this path cannot serve the step-size control."""

    def default_adjoint(self):
        """The adjoint of ``tp.solve`` when none is given."""
        return diffrax.RecursiveCheckpointAdjoint()


class BrownianTree(AbstractBrownian):
    """A ``diffrax.VirtualBrownianTree`` over the run (the default): any steps, adaptive ones
    included; a run and its refinement see one path (strong errors), chunks of a run too.

    Args:
        tol: the resolution (default ``dt0/2`` for constant steps, diffrax's advice;
            ``(t1 − t0)·2^-20`` for adaptive ones); below it the path is a Brownian-bridge spline.
            Give runs compared path by path one ``tol`` below the smallest step. Each halving
            costs a normal draw per token at every evaluation: on S² at n = 2·10⁴ one tree
            evaluation (5 levels) cost ~10 normal draws of all tokens here.
    """

    tol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if self.tol is not None:
            check_scalar(self.tol, "BrownianTree.tol", positive=True)

    def path(self, t0, t1, dt0, adaptive, shape, key, levy_area):
        if self.tol is not None:
            tol = jnp.asarray(self.tol, t0.dtype)
        elif dt0 is not None and not adaptive:
            tol = dt0 / 2
        else:
            tol = (t1 - t0) * 2.0**-20
        return diffrax.VirtualBrownianTree(t0, t1, tol=tol, shape=shape, key=key, levy_area=levy_area)


class BrownianIncrements(AbstractBrownian):
    """One independent draw per step (``diffrax.UnsafeBrownianPath``, keyed by the step's times):
    the cheapest path (one normal per token and step), for constant steps only. Reproducible for
    a fixed key and step grid, but a run with another step (or cut into chunks) sees another
    Brownian motion: use :class:`BrownianTree` for strong errors and chunked runs. diffrax cannot
    reverse-differentiate through it (the solve's default adjoint is then ``DirectAdjoint``, for
    forward runs and ``jax.jvp``): use :class:`BrownianTree` for ``jax.grad``."""

    def default_adjoint(self):
        return diffrax.DirectAdjoint()

    def path(self, t0, t1, dt0, adaptive, shape, key, levy_area):
        return diffrax.UnsafeBrownianPath(shape=shape, key=key, levy_area=levy_area)

    def check(self, adaptive):
        if adaptive:
            raise ValueError("BrownianIncrements draws one increment per step and cannot serve "
                             "adaptive steps; use tp.BrownianTree() (the default)")


class Noise(eqx.Module):
    r"""Independent noise of strength σ on every token: dX_i = Γ dt + σ(t) dB_i
    (docs: math/noise.md#independent-noise).

    Args:
        sigma: σ >= 0, a float (a differentiable parameter) or a function ``t ↦ σ(t)``
            (traceable: JAX operations on a scalar time). σ = 1 on the sphere is standard
            spherical Brownian motion (generator ½Δ_S).
        path: how the Brownian path is drawn: :class:`BrownianTree` ``(tol=None)`` (default: a
            virtual Brownian tree, any steps, one path for a run and its refinements and chunks)
            or :class:`BrownianIncrements` ``()`` (one draw per step, constant steps only, cheaper).

    ``tp.solve(dynamics, x0, t1=..., dt0=..., noise=tp.Noise(0.5), key=jax.random.key(0))``.
    A negative or non-finite σ is an error naming it (a ValueError when concrete, ``eqx.error_if``
    under jit and for σ(t) along the run).
    """

    sigma: jax.Array | Callable
    path: AbstractBrownian

    def __init__(self, sigma, *, path: AbstractBrownian | None = None):
        if callable(sigma):
            self.sigma = sigma
        else:
            sigma = check_scalar(sigma, "Noise.sigma", nonnegative=True)
            self.sigma = sigma if isinstance(sigma, jax.Array) else jnp.asarray(sigma, dtype=float)
        if path is None:
            path = BrownianTree()
        if not isinstance(path, AbstractBrownian):
            raise ValueError(f"Noise.path must be tp.BrownianTree(...) or tp.BrownianIncrements(), got {path!r}")
        self.path = path

    @property
    def time_dependent(self) -> bool:
        return callable(self.sigma)

    def at(self, t, dtype=None):
        """σ(t), checked (>= 0 and finite) inside jit."""
        s = self.sigma(t) if self.time_dependent else self.sigma
        s = jnp.asarray(s, dtype=dtype if dtype is not None else jnp.result_type(s))
        if jnp.ndim(s) != 0:
            raise ValueError(f"Noise.sigma(t) must be a scalar, got shape {jnp.shape(s)}")
        if is_concrete(s):
            v = float(s)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"Noise.sigma must be finite and >= 0, got sigma(t={float(t):.6g}) = {v}"
                                 if is_concrete(t) else f"Noise.sigma must be finite and >= 0, got {v}")
            return s
        return eqx.error_if(s, ~(jnp.isfinite(s) & (s >= 0)),
                            "Noise.sigma(t) must be finite and >= 0 (got a negative or non-finite value)")

    def check(self, t0, dtype) -> None:
        """ValueError if σ(t0) is negative or non-finite (concrete values; jit checks the run)."""
        self.at(t0, dtype)


def check_sde_solver(solver, additive: bool, adaptive: bool) -> None:
    """ValueError unless ``solver`` integrates an SDE with this noise and step-size control."""
    name = type(solver).__name__
    if not isinstance(solver, (diffrax.AbstractItoSolver, diffrax.AbstractStratonovichSolver)):
        raise ValueError(
            f"solver {name} does not apply under noise: it is an ODE solver, not marked as "
            "converging to the Itô or Stratonovich solution of an SDE; use diffrax.Euler() (Itô, "
            "the noisy residual layer), diffrax.EulerHeun(), diffrax.Heun(), diffrax.SPaRK() "
            "(adaptive), or diffrax.ShARK() (additive noise)")
    if isinstance(solver, (diffrax.ItoMilstein, diffrax.StratonovichMilstein)):
        raise ValueError(f"solver {name} does not apply under noise: diffrax's Milstein needs the "
                         "diffusion as a diagonal matrix field; use diffrax.Heun(), diffrax.SPaRK() "
                         "or diffrax.ShARK() (additive noise, strong order 1.5)")
    if not additive and _additive_only(solver):
        raise ValueError(
            f"solver {name} is for additive noise only, but this noise is not additive (on the "
            "sphere it is projected: σP⊥_x ∘ dB); use diffrax.SPaRK(), diffrax.GeneralShARK(), "
            "diffrax.Heun() or diffrax.Euler()")
    if adaptive and isinstance(solver, diffrax.Euler):
        raise ValueError("solver Euler does not converge with adaptive step sizes for an SDE; use "
                         "constant steps (dt0) or diffrax.Heun() / diffrax.SPaRK() with a PIDController")


def _additive_only(solver) -> bool:
    return isinstance(solver, diffrax.AbstractSRK) and bool(solver.tableau.is_additive_noise())


def brownian_levy_area(solver):
    """The Lévy area the solver's Brownian path must carry (space-time for the SRK solvers)."""
    if isinstance(solver, diffrax.AbstractSRK):
        needed = solver.minimal_levy_area
        if issubclass(needed, diffrax.AbstractSpaceTimeTimeLevyArea):
            return diffrax.SpaceTimeTimeLevyArea
        if issubclass(needed, diffrax.AbstractSpaceTimeLevyArea):
            return diffrax.SpaceTimeLevyArea
    return diffrax.BrownianIncrement
