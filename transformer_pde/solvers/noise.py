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
path))``, one Brownian path per run from one key (same key, same path; chunks and gradients
supported): drawn cell by cell on the grid of dt0 for constant steps (:class:`BrownianGrid`), a
virtual Brownian tree for adaptive steps and Lévy area (:class:`BrownianTree`), with any diffrax SDE solver: Itô (``Euler``) or Stratonovich
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

__all__ = ["AbstractBrownian", "BrownianGrid", "BrownianIncrements", "BrownianTree", "Noise",
           "check_sde_solver", "brownian_levy_area"]


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
    """A ``diffrax.VirtualBrownianTree`` over the run (the default for adaptive steps and the SRK
    solvers, which need Lévy area): any steps, adaptive ones
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


class BrownianGrid(AbstractBrownian):
    r"""Brownian motion drawn cell by cell on a grid t_k = T0 + kδ (the default for constant
    steps): W(t_{k+1}) − W(t_k) = √δ Z_k with Z_k ~ N(0, I) keyed by the cell index k, and inside a
    cell the Brownian bridge √δ (V_k(u) − u V_k(1)) of a virtual Brownian tree V_k on [0, 1] (keyed
    by k too), so W is one deterministic function of (key, T0, δ) at every time.

    A step on the grid costs one normal draw per token (a step of m cells, m draws); only a step
    end off the grid descends a cell's tree. The virtual tree over the whole run
    (:class:`BrownianTree`) costs ~2(log₂(T/tol) + 2) draws per step instead: at n = 10⁵ on S²
    it made a noisy Euler step 1.5x a deterministic one, this path ~1.05x
    (``benchmarks/noise.py``). Like the tree, and unlike :class:`BrownianIncrements`, a run cut
    into chunks sees one path (the grid is anchored at the Brownian interval's start), runs whose
    steps are multiples of δ see one path (give them one ``dt``, the smallest step), the path is
    reproducible bit for bit and ``jax.grad`` goes through the solve. Adaptive steps work but
    cost one draw per cell crossed (the default there is :class:`BrownianTree`); the stochastic
    Runge–Kutta solvers that need Lévy area (SPaRK, ShARK, ...) take :class:`BrownianTree`.

    Args:
        dt: the cell δ > 0 (default the run's ``dt0``).
        tol: the resolution of the bridge inside a cell, relative to δ (default 2⁻¹⁰).
    """

    dt: float | None = eqx.field(static=True, default=None)
    tol: float = eqx.field(static=True, default=2.0**-10)

    def __check_init__(self):
        if self.dt is not None:
            check_scalar(self.dt, "BrownianGrid.dt", positive=True)
        check_scalar(self.tol, "BrownianGrid.tol", positive=True)

    def path(self, t0, t1, dt0, adaptive, shape, key, levy_area):
        if levy_area is not diffrax.BrownianIncrement:
            raise ValueError(f"BrownianGrid draws increments without Lévy area, which this solver needs "
                             f"({levy_area.__name__}); use tp.BrownianTree()")
        if self.dt is not None:
            cell = jnp.asarray(self.dt, t0.dtype)
        elif dt0 is not None:
            cell = dt0
        else:
            raise ValueError("BrownianGrid() takes its cell from dt0: pass dt0=... or BrownianGrid(dt=...)")
        return _GridPath(t0, cell, shape, key, self.tol)


class _GridPath(diffrax.AbstractBrownianPath):
    """:class:`BrownianGrid`'s path: cell increments keyed by index, bridges inside a cell."""

    start: jax.Array
    cell: jax.Array
    shape: object = eqx.field(static=True)
    key: jax.Array
    tol: float = eqx.field(static=True)
    levy_area: type = eqx.field(static=True, default=diffrax.BrownianIncrement)

    @property
    def t0(self):
        return self.start

    @property
    def t1(self):
        return jnp.inf

    def evaluate(self, t0, t1=None, left=True, use_levy=False):
        del left
        if t1 is None:
            t0, t1 = self.start, t0
        t0, t1 = (jax.lax.stop_gradient(jnp.asarray(t, self.cell.dtype)) for t in (t0, t1))
        c0, f0 = self._locate(t0)
        c1, f1 = self._locate(t1)
        k_cells, k_bridge = jax.random.split(self.key)
        leaves, treedef = jax.tree.flatten(self.shape)
        out = []
        for i, leaf in enumerate(leaves):
            kc, kb = jax.random.fold_in(k_cells, i), jax.random.fold_in(k_bridge, i)
            draw = lambda k, kc=kc, leaf=leaf: jax.random.normal(jax.random.fold_in(kc, k), leaf.shape, leaf.dtype)  # noqa: E731
            # whole cells c0 .. c1 − 1 (one draw each), then the partial cells at both ends
            whole = jax.lax.fori_loop(c0, c1, lambda k, acc, draw=draw: acc + draw(k),
                                      jnp.zeros(leaf.shape, leaf.dtype))
            part = lambda c, f, draw=draw, kb=kb, leaf=leaf: self._partial(draw, kb, leaf, c, f)  # noqa: E731
            w = whole + part(c1, f1) - part(c0, f0)
            out.append(jax.lax.stop_gradient(jnp.sqrt(self.cell).astype(leaf.dtype) * w))
        w = jax.tree.unflatten(treedef, out)
        if use_levy:
            return diffrax.BrownianIncrement(dt=t1 - t0, W=w)
        return w

    def _locate(self, t):
        """(cell index, fraction in [0, 1)) of t; a time within rounding of a grid point is on it."""
        u = (t - self.start) / self.cell
        k = jnp.round(u)
        on = jnp.abs(u - k) <= 64 * jnp.finfo(u.dtype).eps * jnp.maximum(1.0, jnp.abs(u))
        c = jnp.where(on, k, jnp.floor(u))
        f = jnp.where(on, 0.0, u - jnp.floor(u))
        return c.astype(jnp.int32), f

    def _partial(self, draw, kb, leaf, c, f):
        """(W(T0 + (c + f)δ) − W(T0 + cδ))/√δ = f Z_c + V_c(f) − f V_c(1) (zero on the grid)."""
        def bridge(f):
            tree = diffrax.VirtualBrownianTree(0.0, 1.0, tol=self.tol, shape=leaf,
                                               key=jax.random.fold_in(kb, c))
            return f * draw(c) + tree.evaluate(f) - f * tree.evaluate(jnp.ones_like(f))
        return jax.lax.cond(f > 0, bridge, lambda f: jnp.zeros(leaf.shape, leaf.dtype), f)


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
        path: how the Brownian path is drawn: :class:`BrownianGrid` ``(dt=None)`` (one draw per
            token and step on a grid of cells, bridges inside; one path for a run and its chunks,
            gradients), :class:`BrownianTree` ``(tol=None)`` (a virtual Brownian tree over the
            run: any steps, Lévy area for the SRK solvers; ~2 log₂(T/tol) draws per step) or
            :class:`BrownianIncrements` ``()`` (one draw per step keyed by its times: constant
            steps, no chunks or reverse-mode gradients). Default ``None``: ``BrownianGrid()`` for
            constant steps with a solver that needs increments only, ``BrownianTree()`` otherwise
            (:meth:`path_for`).

    ``tp.solve(dynamics, x0, t1=..., dt0=..., noise=tp.Noise(0.5), key=jax.random.key(0))``.
    A negative or non-finite σ is an error naming it (a ValueError when concrete, ``eqx.error_if``
    under jit and for σ(t) along the run).
    """

    sigma: jax.Array | Callable
    path: AbstractBrownian | None

    def __init__(self, sigma, *, path: AbstractBrownian | None = None):
        if callable(sigma):
            self.sigma = sigma
        else:
            sigma = check_scalar(sigma, "Noise.sigma", nonnegative=True)
            self.sigma = sigma if isinstance(sigma, jax.Array) else jnp.asarray(sigma, dtype=float)
        if path is not None and not isinstance(path, AbstractBrownian):
            raise ValueError(f"Noise.path must be tp.BrownianGrid(...), tp.BrownianTree(...) or "
                             f"tp.BrownianIncrements(), got {path!r}")
        self.path = path

    def path_for(self, adaptive: bool, levy_area) -> AbstractBrownian:
        """The path of a run: the given one, else :class:`BrownianGrid` for constant steps and
        increments-only solvers, :class:`BrownianTree` for adaptive steps or Lévy area."""
        if self.path is not None:
            return self.path
        if adaptive or levy_area is not diffrax.BrownianIncrement:
            return BrownianTree()
        return BrownianGrid()

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
