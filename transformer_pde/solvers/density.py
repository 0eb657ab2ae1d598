r"""Densities evolved by their Fokker–Planck equation, and :func:`solve_density`: a ``tp.solve``
checked for resolution in space and in time (docs: math/noise.md#spectral-solver-on-the-circle).

A density state (:class:`AbstractDensity`: ``tp.CircleDensity`` on S¹, ``tp.SphereDensity`` on S²,
``tp.ZonalDensity`` zonal on S^{d−1})
knows how to refine itself (twice the modes or degree) and how to show a run's saves as values on
a grid. :func:`solve_density` runs three solves and compares them at the saves:

* the run asked for (N modes, the given step-size control);
* the same run at twice the resolution (2N, the same control): their difference is the spatial
  error (the time-step errors of the two runs nearly cancel, their resolved modes being the same);
* the same run at N with the control tightened (rtol and atol divided by
  :data:`TIGHTEN`, or half the constant step): their difference, scaled as for an error
  proportional to the tolerance (× TIGHTEN/(TIGHTEN − 1); a halved constant step: × 2), is the
  time-step error.

The reported ``resolution_error`` is the sum of the two. (Comparing N with 2N alone reported 2e-13
for a circle run whose error against a tight reference was 1e-7: the time step's.)
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import check_scalar, is_concrete
from ..models.attention.softmax import SoftmaxAttention
from ..models.attention.unnormalized import UnnormalizedAttention
from ..models.sphere import Sphere
from .solve import solve
from .states import AbstractState

TIGHTEN = 10.0
"""How much :func:`solve_density` tightens an adaptive control (rtol, atol ÷ 10) for its time-step
check; a constant step is halved."""

_ROUND_OFF = 100
"""How many ulps (of the largest grid value) :func:`solve_density` counts as round-off: a
difference between the N- and 2N-mode answers below it says nothing about the modes (measured:
float32 runs differ by 3–7 ulps where float64 shows 1e-10)."""


class UnderResolvedError(ValueError):
    """The density needs more modes (or a finer time step) than it was given for the requested accuracy."""


class AbstractDensity(AbstractState):
    """A density on a manifold held by a spectral discretization, moving by its Fokker–Planck
    equation: what :func:`solve_density` checks."""

    @property
    @abc.abstractmethod
    def resolution(self) -> str:
        """The discretization in words, for messages ("16 modes", "degree 16")."""

    @abc.abstractmethod
    def refined(self) -> "AbstractDensity":
        """The same density at twice the resolution (spectral interpolation)."""

    @abc.abstractmethod
    def grid_values(self, saved, on: "AbstractDensity") -> jax.Array:
        """The saves ``(T, ...)`` of a run of this density as values on the grid of ``on`` (a
        coarser or equal discretization of the same density)."""

    @abc.abstractmethod
    def masses(self, saved) -> jax.Array:
        """∫ρ at each save, ``(T,)``."""

    @abc.abstractmethod
    def order_parameter(self, saved) -> jax.Array:
        """|∫ x ρ| at each save, ``(T,)``."""

    @abc.abstractmethod
    def transport(self, dynamics, y):
        """The explicit part of the right-hand side: −div(ρ Γ_ρ) in this discretization."""

    @abc.abstractmethod
    def diffusion(self, y):
        """The stiff, linear part: (σ²/2)Δρ, solved implicitly by the IMEX solver."""

    def vector_field(self, dynamics, t, y):
        return self.transport(dynamics, y) + self.diffusion(y)

    def term(self, dynamics):
        return diffrax.MultiTerm(diffrax.ODETerm(lambda t, y, args: self.transport(dynamics, y)),
                                 diffrax.ODETerm(lambda t, y, args: self.diffusion(y)))

    @abc.abstractmethod
    def stage_solver(self) -> lx.AbstractLinearSolver:
        """The exact linear solve of an implicit stage, (I − hγ·diffusion)x = b: :class:`CirculantSolve`
        on the circle's grid, :class:`DiagonalSolve` where the diffusion is diagonal in the coefficients."""

    def default_solver(self):
        """IMEX ``KenCarp4``: transport explicit, diffusion implicit, each stage one exact linear solve."""
        return diffrax.KenCarp4(root_finder=LinearStageSolve(linear_solver=self.stage_solver()))

    def default_controller(self):
        # in float32 too: a looser rtol (ten ulps) lets the time error reach the resolution check
        return diffrax.PIDController(rtol=1e-8, atol=1e-10)


class CirculantSolve(lx.AbstractLinearSolver):
    """Solves M x = b for a circulant M on a 1-D grid (here I − hγ·diffusion, the Jacobian of an
    implicit stage): M's first column c = M e_0 gives its eigenvalues fft(c), so x = ifft(fft(b)/fft(c)).
    Exact for circulant operators only; give it to the implicit stages of an IMEX solver whose
    implicit term is translation invariant."""

    def init(self, operator, options):
        del options
        struct = operator.in_structure()
        leaves = jax.tree_util.tree_leaves(struct)
        if len(leaves) != 1 or len(leaves[0].shape) != 1:
            raise ValueError("CirculantSolve needs an operator on a single 1-D array")
        e0 = jnp.zeros(leaves[0].shape, leaves[0].dtype).at[0].set(1.0)
        return jnp.fft.fft(operator.mv(e0))

    def compute(self, state, vector, options):
        x = jnp.fft.ifft(jnp.fft.fft(vector) / state)
        x = jnp.real(x) if not jnp.iscomplexobj(vector) else x
        return x.astype(vector.dtype), lx.RESULTS.successful, {}

    def transpose(self, state, options):
        return jnp.conj(state), {}  # a real circulant's transpose: conjugate eigenvalues

    def conj(self, state, options):
        return state, {}

    def assume_full_rank(self):
        return True


class LinearStageSolve(optx.AbstractRootFinder):
    """The root finder of an implicit stage whose implicit term is linear: one chord (Newton)
    step with the exact linear solve, then stop. diffrax's ``VeryChord`` instead iterates until
    the contraction rate is measurable, and on a linear term (exact after one step) it reads
    round-off as divergence once the predictor is good, rejecting every step."""

    rtol: float = 1e-10
    atol: float = 1e-12
    norm: Callable = optx.max_norm
    linear_solver: lx.AbstractLinearSolver = CirculantSolve()

    def _chord(self):
        return diffrax.VeryChord(rtol=self.rtol, atol=self.atol, norm=self.norm, linear_solver=self.linear_solver)

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        return self._chord().init(fn, y, args, options, f_struct, aux_struct, tags)

    def step(self, fn, y, args, options, state, tags):
        return self._chord().step(fn, y, args, options, state, tags)

    def terminate(self, fn, y, args, options, state, tags):
        return state.step >= 1, state.result

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


class DiagonalSolve(lx.AbstractLinearSolver):
    """Solves M x = b for a diagonal M (here I − hγ·diffusion, the Jacobian of an implicit stage whose
    term is diagonal in the coefficients: Y_lm on S², Gegenbauer on S^{d−1}): M's diagonal is M·1, so
    x = b / (M·1). Exact for diagonal operators only."""

    def init(self, operator, options):
        del options
        leaves = jax.tree_util.tree_leaves(operator.in_structure())
        if len(leaves) != 1:
            raise ValueError("DiagonalSolve needs an operator on a single array")
        return operator.mv(jnp.ones(leaves[0].shape, leaves[0].dtype))

    def compute(self, state, vector, options):
        return vector / state, lx.RESULTS.successful, {}

    def transpose(self, state, options):
        return state, {}

    def conj(self, state, options):
        return jnp.conj(state), {}

    def assume_full_rank(self):
        return True


class DensitySolution(eqx.Module):
    """:func:`solve_density`'s answer.

    Attributes:
        ts: save times ``(T,)``; densities: ``(T, ...)`` values on the grid of ``density``.
        density: the initial density (its grid: ``tp.solvers.circle.grid(density.modes)``,
            ``density.points`` on the sphere, ``tp.solvers.zonal.nodes(L, d)`` for a zonal density).
        resolution_error: ``spatial_error + time_error``, the estimate of the answer's max-norm error.
        spatial_error: max over saves and grid of |ρ_N − ρ_{2N}| (ρ_{2N}: twice the modes or degree).
        time_error: max over saves and grid of |ρ_N − ρ_N'| (ρ_N': the step-size control
            tightened), × 10/9 (adaptive) or × 2 (constant steps halved).
        min_density: the smallest grid value met at the saves.
        mass_error: max |∫ρ − 1| at the saves.
        resolved: resolution_error <= tol and min_density > −tol.
        solution: the underlying ``tp.solve`` solution (N modes).
        tol: the tolerance it was checked against.
    """

    ts: jax.Array
    densities: jax.Array
    density: AbstractDensity
    resolution_error: float
    spatial_error: float
    time_error: float
    min_density: float
    mass_error: float
    resolved: bool
    solution: Any
    tol: float

    @property
    def order_parameter(self):
        return self.density.order_parameter(self.solution.xs)


def sphere_attention(dynamics, state: str, solver: str, d: int):
    """The attention of ``tp.Sphere(attention)`` on S^{d−1} for a density solver: SA or USA with
    constant d×d matrices; ValueError naming what does not fit (``state``: the density's class
    name, ``solver``: "circle", "sphere")."""
    space = {2: "S¹", 3: "S²"}.get(d, f"S^{d - 1}" if d >= 2 else "S^{d−1}")
    if not isinstance(dynamics, Sphere):
        raise ValueError(f"the dynamics of a {state} must be tp.Sphere(attention) on {space}, got "
                         f"{type(dynamics).__name__}")
    attn = dynamics.dynamics
    if not isinstance(attn, (SoftmaxAttention, UnnormalizedAttention)):
        raise ValueError(f"the {solver} solver takes Sphere(SoftmaxAttention) (SA) or "
                         f"Sphere(UnnormalizedAttention) (USA), got Sphere({type(attn).__name__})")
    for name, m in (("Q", attn.Q), ("K", attn.K), ("V", attn.V)):
        if not isinstance(m, (jax.Array, np.ndarray)):
            raise ValueError(f"{type(attn).__name__}.{name} depends on time; the {solver} solver needs "
                             "constant matrices")
        if m.shape != (d, d):
            raise ValueError(f"the {solver} solver needs d = {d}, got {type(attn).__name__}.{name} of shape {m.shape}")
    return attn


def round_off(rho) -> float:
    """The level below which grid values of ``rho`` cannot be told apart: _ROUND_OFF ulps of its
    largest value in its dtype (float32: ~1e-5 for a density of order 1)."""
    return _ROUND_OFF * float(jnp.finfo(rho.dtype).eps) * float(jnp.max(jnp.abs(rho)))


def _tightened(controller, dt0):
    """(controller, dt0, factor) of the time-step check: an adaptive control with rtol and atol
    ÷ TIGHTEN, or a constant step halved; ``factor`` turns the difference of the two runs into the
    first run's error, e = factor·|y − y'|, for an error proportional to the tolerance
    (TIGHTEN/(TIGHTEN − 1)), or of order >= 1 in the step (2)."""
    if isinstance(controller, diffrax.PIDController):
        # tolerances as arrays: the two controls then share one compiled solve
        tol = lambda c: (c.rtol, c.atol)  # noqa: E731
        as_arrays = eqx.tree_at(tol, controller, tuple(jnp.asarray(v) for v in tol(controller)))
        tight = eqx.tree_at(tol, as_arrays, tuple(v / TIGHTEN for v in tol(as_arrays)))
        return as_arrays, tight, dt0, TIGHTEN / (TIGHTEN - 1)
    if isinstance(controller, diffrax.ConstantStepSize):
        return controller, controller, None if dt0 is None else dt0 / 2, 2.0
    raise ValueError(f"solve_density checks the time step by tightening the step-size control: it takes "
                     f"diffrax.PIDController or diffrax.ConstantStepSize, got {type(controller).__name__}")


def solve_density(dynamics, density: AbstractDensity, *, t1, saveat=None, tol: float | None = None,
                  throw: bool = True, **kwargs) -> DensitySolution:
    """``tp.solve`` of a density (``tp.CircleDensity``, ``tp.SphereDensity``, ``tp.ZonalDensity``) checked for
    resolution in space and time, and for positivity: the same run with twice the modes (the start
    spectrally interpolated) and the same run with the step-size control tightened (rtol and atol
    ÷ 10, or dt0 halved) are compared at the saves.

    Args:
        dynamics, density, t1, saveat, ``**kwargs``: as for :func:`transformer_pde.solve`
            (``saveat``: an array of times; default [t1]; ``stepsize_controller``: a
            ``diffrax.PIDController`` or constant steps).
        tol: the accepted max-norm error (spatial plus time-step) and the accepted negativity.
            Default: 1e-6, or the density's round-off level if larger (100 ulps of its largest
            value: ~1e-5 in float32, JAX's default dtype; enable float64 with
            ``jax.config.update("jax_enable_x64", True)`` for a smaller one). A ``tol`` below a
            tenth of that level is refused: the dtype cannot resolve it.
        throw: raise :class:`UnderResolvedError` when the answer is not resolved (else flagged).
            A solve that fails (steps shrinking to nothing on an unresolved density, max_steps)
            counts as not resolved. A difference at the round-off level is not blamed on the
            modes: the error says float64 is needed.

    Example:
        ```python
        import numpy as np, transformer_pde as tp

        rho0 = tp.CircleDensity(lambda th: 1 + 0.1 * np.cos(th), sigma=0.5, modes=16)
        sol = tp.solve_density(tp.Sphere(tp.SoftmaxAttention.identity(2, 1.0)), rho0, t1=1.0)
        sol.densities.shape, sol.resolved       # (1, 32), True
        ```
    """
    if not isinstance(density, AbstractDensity):
        raise ValueError(f"density must be a tp.CircleDensity, tp.SphereDensity or tp.ZonalDensity (solve_density "
                         f"refines its modes), got {type(density).__name__}")
    traced = [name for name, v in (("dynamics", dynamics), ("density", density), ("t1", t1))
              if not all(is_concrete(leaf) for leaf in jax.tree_util.tree_leaves(eqx.filter(v, eqx.is_array)))]
    if traced:
        raise ValueError(f"solve_density compares a run with a refined one on the host and reports what it found, "
                         f"so it runs outside jit/vmap: its {', '.join(traced)} is traced here. Under jit, call "
                         f"tp.solve(dynamics, density, ...) (unchecked), or solve_density outside it")
    rho0 = density.grid_values(jnp.asarray(density.y)[None], density)
    floor0 = round_off(rho0)
    if tol is None:
        tol = max(1e-6, floor0)
    check_scalar(tol, "tol", positive=True)
    dtype = rho0.dtype
    if tol < floor0 / 10:
        raise ValueError(f"solve_density: tol={tol:g} is below the round-off of a {dtype} density (~{floor0:.2g}): "
                         f"{dtype} cannot resolve it, whatever the modes; use float64 "
                         "(jax.config.update('jax_enable_x64', True), and a float64 density) or a larger tol")
    if isinstance(saveat, diffrax.SaveAt):
        raise ValueError("solve_density compares densities: pass saveat as an array of times")
    controller = kwargs.pop("stepsize_controller", None)
    controller = density.default_controller() if controller is None else controller
    dt0 = kwargs.pop("dt0", None)
    controller, tight, dt0_tight, factor = _tightened(controller, dt0)
    fine = density.refined()
    kw = dict(t1=t1, saveat=saveat, throw=False, **kwargs)
    runs = {"coarse": (density, controller, dt0), "fine": (fine, controller, dt0), "tight": (density, tight, dt0_tight)}
    sols = {k: solve(dynamics, d, stepsize_controller=c, dt0=h, **kw) for k, (d, c, h) in runs.items()}
    names = {"coarse": density.resolution, "fine": fine.resolution, "tight": f"{density.resolution}, tightened steps"}
    failed = [f"{names[k]}: {sol.result}" for k, sol in sols.items() if not bool(sol.succeeded)]
    rho = density.grid_values(sols["coarse"].xs, density)
    spatial = float(jnp.max(jnp.abs(rho - fine.grid_values(sols["fine"].xs, density))))
    temporal = factor * float(jnp.max(jnp.abs(rho - density.grid_values(sols["tight"].xs, density))))
    if failed or not (np.isfinite(spatial) and np.isfinite(temporal)):
        spatial = temporal = float("inf")
    err = spatial + temporal
    mn = float(jnp.min(rho))
    mass = float(jnp.max(jnp.abs(density.masses(sols["coarse"].xs) - 1)))
    resolved = bool(err <= tol and mn > -tol)
    if throw and not resolved:
        floor = max(floor0, round_off(rho))
        if err <= floor and mn > -floor:
            raise UnderResolvedError(
                f"solve_density: the answers with {density.resolution} and {fine.resolution} (and tightened steps) "
                f"differ by {err:.3g}, at the round-off of {dtype} (~{floor:.2g}), above tol={tol:g}: more modes will "
                "not help; use float64 (jax.config.update('jax_enable_x64', True), and a float64 density) or "
                f"tol >= {floor:.2g}")
        why = f" (the solve failed: {'; '.join(failed)})" if failed else ""
        if np.isfinite(err) and temporal > spatial and mn > -tol:
            raise UnderResolvedError(
                f"solve_density: the time steps do not resolve the density to tol={tol:g}: the run with the "
                f"step-size control tightened (rtol, atol ÷ {TIGHTEN:g}, or dt0 halved) differs by {temporal:.3g} "
                f"(spatial error {spatial:.3g}, {density.resolution} against {fine.resolution}); pass a tighter "
                "stepsize_controller (diffrax.PIDController(rtol=..., atol=...)), or throw=False for the flagged "
                "result")
        raise UnderResolvedError(
            f"solve_density: the density is not resolved to tol={tol:g} with {density.resolution}: the "
            f"answer with {fine.resolution} differs by {spatial:.3g} (time-step error {temporal:.3g}, min density "
            f"{mn:.3g}){why}; use more modes, a shorter t1, or throw=False for the flagged result")
    return DensitySolution(sols["coarse"].ts, rho, density, err, spatial, temporal, mn, mass, resolved,
                           sols["coarse"], tol)


__all__ = ["AbstractDensity", "CirculantSolve", "DensitySolution", "DiagonalSolve", "LinearStageSolve", "TIGHTEN",
           "UnderResolvedError", "round_off", "solve_density", "sphere_attention"]
