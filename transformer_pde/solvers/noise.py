r"""Noise as a family of values given to ``tp.solve(..., noise=..., key=key)``
(docs: math/noise.md): each noise builds the SDE's terms from the state, the dynamics and a
Brownian path (:mod:`.brownian`).

* :class:`Noise` — independent noise, every token its own Brownian motion,

  $$dX_i = \Gamma_{\mu^n}(X_i)\,dt + \sigma(t)\,dB_i \quad\text{on } \mathbb R^d,\qquad
  dX_i = P^\perp_{X_i}\Gamma_{\mu^n}(X_i)\,dt + \sigma(t)\,P^\perp_{X_i}\circ dB_i \quad\text{on } S^{d-1},$$

  the second a Stratonovich SDE whose diffusion part is (σ²/2)Δ_S (its Itô form adds the drift
  −(d−1)(σ²/2)X_i); the mean field is the nonlinear Fokker–Planck equation
  ∂_tρ + div(ρΓ_ρ) = (σ²/2)Δρ. How an increment moves the tokens is the dynamics' own
  (:meth:`~transformer_pde.models.AbstractDynamics.diffusion`: additive in R^d and for the
  normalization schemes, whose retraction ends the step; projected on
  :class:`~transformer_pde.Sphere`); how it acts on a state is the state's
  (:class:`~transformer_pde.solvers.states.AbstractNoisyState`: particles and tracers move, a
  :class:`~transformer_pde.Gaussian` gains Σ' += σ²I; other states are refused by type).
* :class:`CommonNoise` — one Brownian motion W shared by every token, dX_i = ... + σ(t) g(X)_i dW
  + a(X)_i dt, with g and a an :class:`~transformer_pde.models.AbstractCommonDiffusion` of the model
  (random heads: :class:`~transformer_pde.CommonNoiseSDE`); particles only.

A new kind (multiplicative noise, say) is a final subclass of :class:`AbstractNoise`: its
Brownian shape, whether it is additive, and its increment (``tests/solvers/test_noise_family.py``
builds one outside the package).

``tp.solve`` integrates the SDE with diffrax, ``MultiTerm(ODETerm(drift), noise term)``, one
Brownian path per run from one key (same key, same path; chunks and gradients supported):
drawn cell by cell on the grid of dt0 for constant steps (:class:`BrownianGrid`), a virtual
Brownian tree for adaptive steps and Lévy area (:class:`BrownianTree`), with any diffrax SDE
solver: Itô (``Euler``) or Stratonovich (``EulerHeun``, ``Heun``, ``Midpoint``,
``ReversibleHeun``, ``SPaRK``, ``GeneralShARK``, ``SlowRK``), and for additive noise also
``ShARK``, ``SRA1``, ``SEA``. On the sphere Itô and Stratonovich solvers converge to the same
process: the retraction x/|x| that ends each step adds the Itô drift (N(x + σP⊥ΔB) = x + σP⊥ΔB −
(d−1)(σ²h/2)x + o(h) in mean). ``tp.layers`` with noise is the noisy residual layer
x ← R(x + hΓ + σ√h g(x, ξ)), with the same increment (:meth:`AbstractNoise.increment`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar, is_concrete, runtime_check
from ..models.base import AbstractCommonDiffusion
from .brownian import AbstractBrownian, BrownianGrid, BrownianTree, brownian_levy_area
from .states import AbstractNoisyState, Particles

__all__ = ["AbstractNoise", "CommonNoise", "Noise", "brownian_spec", "check_key", "check_sde_solver", "noisy_terms"]


class AbstractNoise(eqx.Module):
    """A noise of ``tp.solve``: what Brownian motion it needs of a state, and how an increment of it
    moves the state (σ(t) times a unit-σ increment, linear in dW)."""

    sigma: eqx.AbstractVar[jax.Array | Callable]
    path: eqx.AbstractVar[AbstractBrownian | None]

    @abc.abstractmethod
    def check_state(self, state, dynamics) -> None:
        """ValueError naming the state if this noise cannot act on it."""

    @abc.abstractmethod
    def brownian_shape(self, state, dynamics):
        """The Brownian motion of a run: a pytree of ``jax.ShapeDtypeStruct`` (empty where the
        noise acts deterministically, as on a Gaussian's moments)."""

    @abc.abstractmethod
    def additive(self, state, dynamics) -> bool:
        """Whether the increment is σ dW itself, independent of the state (solvers for additive
        noise, such as ``diffrax.ShARK``, then apply)."""

    @abc.abstractmethod
    def unit_increment(self, state, dynamics, t, y, dW):
        """The increment of y for a Brownian increment dW at unit σ (linear in dW; y is None when
        :meth:`additive`)."""

    def drift(self, state, dynamics, t, y, sigma):
        """What the noise adds to dy/dt deterministically (None: nothing)."""
        return None

    def increment(self, state, dynamics, t, y, dW, sigma):
        """σ · :meth:`unit_increment`, in the state's dtype."""
        g = self.unit_increment(state, dynamics, t, y, dW)
        return jax.tree.map(lambda a: (sigma * a).astype(a.dtype), g)

    @property
    def time_dependent(self) -> bool:
        return callable(self.sigma)

    def at(self, t, dtype=None, *, checked: bool = False):
        """σ(t), checked (>= 0 and finite) inside jit unless ``checked``: a constant σ that was
        checked before the program (a runtime check is a host callback, which keeps the program
        out of JAX's persistent cache)."""
        name = type(self).__name__
        s = self._sigma_of(t, name) if self.time_dependent else self.sigma
        if not isinstance(s, (int, float, np.ndarray, np.generic, jax.Array)) or jnp.iscomplexobj(s) or not (
                jnp.issubdtype(jnp.result_type(s), jnp.number) or jnp.result_type(s) == bool):
            raise ValueError(f"{name}.sigma(t) must be a real scalar, got {s!r}"[:300])
        s = jnp.asarray(s, dtype=dtype if dtype is not None else jnp.result_type(s))
        if jnp.ndim(s) != 0:
            raise ValueError(f"{name}.sigma(t) must be a scalar, got shape {jnp.shape(s)}")
        if is_concrete(s):
            v = float(s)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name}.sigma must be finite and >= 0, got sigma(t={float(t):.6g}) = {v}"
                                 if is_concrete(t) else f"{name}.sigma must be finite and >= 0, got {v}")
            return s
        if checked:
            return s
        return runtime_check(s, ~(jnp.isfinite(s) & (s >= 0)),
                             f"{name}.sigma(t) must be finite and >= 0 (got a negative or non-finite value)")

    def _sigma_of(self, t, name):
        """σ(t) from the user's function, whose failures are named as σ's."""
        try:
            return self.sigma(t)
        except jax.errors.ConcretizationTypeError:
            raise ValueError(f"{name}.sigma(t) must be traceable (JAX operations on a scalar time t, no "
                             "float(t) or Python branches on t): it is evaluated inside jit") from None
        except TypeError as e:
            raise ValueError(f"{name}.sigma must be a function of the time alone, t ↦ σ(t); calling it "
                             f"with t failed: {e}") from None

    def check(self, state, dynamics, t0, dtype) -> None:
        """ValueError if the state cannot take this noise or σ(t0) is negative or non-finite
        (concrete values; jit checks the run)."""
        self.check_state(state, dynamics)
        self.at(t0, dtype)

    def path_for(self, adaptive: bool, levy_area) -> AbstractBrownian:
        """The path of a run: the given one, else :class:`BrownianGrid` for constant steps and
        increments-only solvers, :class:`BrownianTree` for adaptive steps or Lévy area."""
        if self.path is not None:
            return self.path
        if adaptive or levy_area is not diffrax.BrownianIncrement:
            return BrownianTree()
        return BrownianGrid()


def _checked_sigma(sigma, owner):
    if callable(sigma):
        return sigma
    sigma = check_scalar(sigma, f"{owner}.sigma", nonnegative=True)
    return sigma if isinstance(sigma, jax.Array) else jnp.asarray(sigma, dtype=float)


def _checked_path(path, owner):
    if path is not None and not isinstance(path, AbstractBrownian):
        raise ValueError(f"{owner}.path must be tp.BrownianGrid(...), tp.BrownianTree(...) or "
                         f"tp.BrownianIncrements(), got {path!r}")
    return path


class Noise(AbstractNoise):
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

    Example:
        ```python
        import jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=32, d=3)
        model = tp.Sphere(tp.SoftmaxAttention.identity(d=3, beta=1.0))
        sol = tp.solve(model, x0, t1=1.0, dt0=0.05, noise=tp.Noise(0.5), key=jr.key(1))   # spherical Brownian motion
        ```
    """

    sigma: jax.Array | Callable
    path: AbstractBrownian | None

    def __init__(self, sigma, *, path: AbstractBrownian | None = None):
        self.sigma = _checked_sigma(sigma, "Noise")
        self.path = _checked_path(path, "Noise")

    def check_state(self, state, dynamics):
        if not isinstance(state, AbstractNoisyState):
            raise ValueError(f"{type(state).__name__} cannot take noise: independent noise moves tokens "
                             "(tp.Particles, tp.Tracers, tp.Coupled of them) or a Gaussian's moments "
                             "(tp.Gaussian); a plain ODE state has no tokens to move")
        state.check_noise(dynamics)

    def brownian_shape(self, state, dynamics):
        return state.noise_shape(dynamics)

    def additive(self, state, dynamics):
        return state.additive_noise(dynamics)

    def unit_increment(self, state, dynamics, t, y, dW):
        return dW if y is None else state.diffusion(dynamics, t, y, dW)

    def drift(self, state, dynamics, t, y, sigma):
        return state.noise_drift(dynamics, t, y, sigma)


class CommonNoise(AbstractNoise):
    r"""Common noise: one Brownian motion W shared by every token (docs: math/noise.md#common-noise),

    dX_i = Γ dt + σ(t) g(X)_i dW + a(X)_i dt,

    with g and a the model's :class:`~transformer_pde.models.AbstractCommonDiffusion` (random
    heads: :class:`~transformer_pde.CommonNoiseSDE`, the diffusive limit of the random Transformer).
    Unlike independent noise it does not average out as n → ∞: the mean field is a stochastic PDE.

    Args:
        diffusion: the model's g (and a).
        sigma: σ >= 0 (default 1), a float or a function ``t ↦ σ(t)``.
        path: as :class:`Noise` (default ``BrownianGrid()`` for constant steps, ``BrownianTree()``
            for adaptive ones).

    ``tp.solve(dynamics, x0, t1=..., dt0=..., noise=tp.CommonNoise(g), key=key)`` on
    :class:`~transformer_pde.Particles` (an ``(n, d)`` array); the diffusion is not additive
    (it depends on the tokens), so the additive-noise solvers are refused.
    """

    diffusion: AbstractCommonDiffusion
    sigma: jax.Array | Callable
    path: AbstractBrownian | None

    def __init__(self, diffusion: AbstractCommonDiffusion, sigma=1.0, *, path: AbstractBrownian | None = None):
        if not isinstance(diffusion, AbstractCommonDiffusion):
            raise ValueError(f"CommonNoise.diffusion must be a tp.AbstractCommonDiffusion such as "
                             f"tp.CommonNoiseSDE(heads, W, Wp), got {type(diffusion).__name__}")
        self.diffusion = diffusion
        self.sigma = _checked_sigma(sigma, "CommonNoise")
        self.path = _checked_path(path, "CommonNoise")

    def check_state(self, state, dynamics):
        if not isinstance(state, Particles):
            raise ValueError(f"{type(state).__name__} cannot take common noise: it moves the tokens of "
                             "one system (tp.Particles, an (n, d) array)")

    def brownian_shape(self, state, dynamics):
        return self.diffusion.brownian_shape(state.x)

    def additive(self, state, dynamics):
        return False

    def unit_increment(self, state, dynamics, t, y, dW):
        return self.diffusion.diffusion(y, dW, t).astype(y.dtype)

    def drift(self, state, dynamics, t, y, sigma):
        a = self.diffusion.drift(y, t)
        return None if a is None else a.astype(y.dtype)


def check_key(key) -> None:
    """ValueError unless ``key`` is a JAX PRNG key (a noisy run's, required)."""
    if key is None:
        raise ValueError("noise needs a PRNG key: pass key=jax.random.key(seed) (one key per run; "
                         "the same key gives the same Brownian path)")
    if not (isinstance(key, jax.Array) and (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) or (
            key.dtype == jnp.uint32 and key.shape == (2,)))):
        raise ValueError(f"key must be a JAX PRNG key such as jax.random.key(0), got {key!r}")


def brownian_spec(noise, shape, key, interval, state, dynamics, solver, controller, t0, t1, dt0, dtype):
    """What the Brownian path of shape ``shape`` (:meth:`AbstractNoise.brownian_shape`) of a noisy run
    is built from (:meth:`AbstractNoise.path_for`); checks the key, the solver and the interval (the
    state and σ are :meth:`AbstractNoise.check`'s, made before)."""
    check_key(key)
    adaptive = isinstance(controller, diffrax.AbstractAdaptiveStepSizeController)
    check_sde_solver(solver, noise.additive(state, dynamics), adaptive)
    T0, T1 = (t0, t1) if interval is None else interval
    check_scalar(T0, "brownian_interval[0]")
    check_scalar(T1, "brownian_interval[1]")
    if all(is_concrete(v) for v in (T0, T1, t0, t1)) and not (float(T0) <= float(t0) < float(t1) <= float(T1)):
        raise ValueError(f"brownian_interval = ({float(T0)}, {float(T1)}) must contain [t0, t1] = "
                         f"[{float(t0)}, {float(t1)}]")
    concrete = all(is_concrete(v) for v in (T0, T1, t0, t1))
    T0, T1 = (jnp.asarray(v, dtype) for v in (T0, T1))
    if not concrete:  # the program leaves diffrax's check of it out
        # on both ends, arrays: a path that reads only T0 (the grid's) keeps the check too
        T0, T1 = runtime_check((T0, T1), ~((T0 <= t0) & (t1 <= T1)), "brownian_interval must contain [t0, t1]")
    levy_area = brownian_levy_area(solver)
    path = noise.path_for(adaptive, levy_area)
    path.check(adaptive)
    path.check_interval(T0, T1)
    dt = None if dt0 is None else jnp.asarray(dt0, dtype)
    return _BrownianSpec(path, T0, T1, dt, adaptive, shape, key, levy_area)


class _BrownianSpec(eqx.Module):
    """What the Brownian path of a run is built from (the path itself is built inside jit)."""

    kind: object
    t0: jax.Array
    t1: jax.Array
    dt0: jax.Array | None
    adaptive: bool = eqx.field(static=True)
    shape: object = eqx.field(static=True)
    key: jax.Array
    levy_area: type = eqx.field(static=True)

    def tree(self):
        return self.kind.path(self.t0, self.t1, self.dt0, self.adaptive, self.shape, self.key, self.levy_area)


def noisy_terms(dynamics, state, noise, brownian, sigma_checked: bool = False):
    """drift + σ(t)·diffusion ∘ dW: an ODE term (a Gaussian's Σ' += σ²I) or diffrax's SDE terms
    (``sigma_checked``: a constant σ checked before the program, see :meth:`AbstractNoise.at`)."""
    def drift(t, y, args):
        v = state.vector_field(dynamics, t, y)
        extra = noise.drift(state, dynamics, t, y, noise.at(t, state.dtype, checked=sigma_checked))
        return v if extra is None else jax.tree.map(jnp.add, v, extra)

    if brownian is None:
        return diffrax.ODETerm(drift)
    diffusion = _NoiseTerm(brownian.tree(), noise, state, dynamics, noise.additive(state, dynamics), sigma_checked)
    return diffrax.MultiTerm(diffrax.ODETerm(drift), diffusion)


class _Diffusion(eqx.Module):
    """The diffusion coefficient at (t, y) as data (diffrax's SRK solvers vmap and combine it
    linearly): σ(t), and the point where the noise acts (None for additive noise)."""

    sigma: jax.Array
    y: object
    t: jax.Array


class _NoiseTerm(diffrax.AbstractTerm):
    """σ(t)·g(t, y)∘dW with g the noise's :meth:`~AbstractNoise.unit_increment`: the ``ControlTerm``
    of an SDE whose vector field is applied to the increment by the noise, not by a matrix."""

    control: diffrax.AbstractBrownianPath
    noise: AbstractNoise
    state: object
    dynamics: object
    additive: bool = eqx.field(static=True)
    sigma_checked: bool = eqx.field(static=True)

    def vf(self, t, y, args):
        sigma = self.noise.at(t, self.state.dtype, checked=self.sigma_checked)
        return _Diffusion(sigma, None if self.additive else y, jnp.asarray(t, self.state.dtype))

    def contr(self, t0, t1, **kwargs):
        return self.control.evaluate(t0, t1, **kwargs)

    def prod(self, vf, control):
        # additive: y is None and the increment is σ(t) dW itself (independent of y, as ShARK needs)
        return self.noise.increment(self.state, self.dynamics, vf.t, vf.y, control, vf.sigma)


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
