"""``solve``: integrate the particle system (or the Gaussian closure) with diffrax.

One entry point per job (STYLE.md): ``solve(dynamics, state0, t1=..., ...)`` reads like the
equation dx_i/dt = v(t, x_i; μ_t); strategies (solver, step-size controller, adjoint) are
diffrax objects passed as values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import NonFiniteStateError, check_int, check_scalar, check_weights, is_concrete
from .dynamics import AbstractDynamics
from .measures import Gaussian


class Solution(eqx.Module):
    """Result of :func:`solve` for particles.

    Attributes:
        ts: save times, shape ``(T,)``.
        xs: states at ``ts``, shape ``(T, n, d)`` (None when only statistics were saved).
        stats: the pytree returned by ``stats(t, x)`` at each save time (or None).
        weights: token weights, shape ``(n,)``.
        num_steps: accepted solver steps.
        result: diffrax's result code (success unless ``throw=False`` and it failed;
            ``RESULTS.event_occurred`` when the run stopped on a non-finite state).
        nonfinite_time: end of the first solver step whose state held a NaN or inf (the run
            stops there); ``inf`` when the state stayed finite. Saves after it are ``inf``.
    """

    ts: jax.Array
    xs: jax.Array | None
    stats: Any
    weights: jax.Array
    num_steps: jax.Array
    result: diffrax.RESULTS
    nonfinite_time: jax.Array | None = None

    @property
    def final(self):
        """The last saved state, shape ``(n, d)``."""
        if self.xs is None:
            raise ValueError("this solution saved statistics only (stats=...); no states")
        return self.xs[-1]

    @property
    def succeeded(self):
        return self.result == diffrax.RESULTS.successful


class _Retracted(diffrax.AbstractWrappedSolver):
    """Wrap a diffrax solver so that every accepted step ends on the manifold.

    Projection methods keep the order of the underlying solver (Hairer–Lubich–Wanner,
    §IV.4). ``made_jump=True`` forces FSAL solvers to re-evaluate the field at the
    retracted point rather than reuse the pre-retraction value.
    """

    solver: diffrax.AbstractSolver
    manifold: eqx.Module
    """Anything with a ``retract(y)`` method, usually the dynamics itself."""

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, err, dense, state, result = self.solver.step(terms, t0, t1, y0, args, solver_state, True)
        return self.manifold.retract(y1), err, dense, state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


def _as_time(value, name, dtype):
    check_scalar(value, name)
    return jnp.asarray(value, dtype=dtype)


def _check_times(t0, t1, dt0, saveat, dtype):
    check_scalar(t0, "t0")
    check_scalar(t1, "t1")
    if is_concrete(t0) and is_concrete(t1) and not float(t1) > float(t0):
        raise ValueError(f"Must have t1 > t0, got t0={float(t0)} and t1={float(t1)}")
    if dt0 is not None:
        check_scalar(dt0, "dt0", positive=True)
    if saveat is None:
        return jnp.asarray([t1], dtype=dtype)
    ts = jnp.asarray(saveat, dtype=dtype)
    if ts.ndim != 1 or ts.shape[0] < 1:
        raise ValueError(f"saveat must be a non-empty 1-D array of times, got shape {ts.shape}")
    if is_concrete(ts) and is_concrete(t0) and is_concrete(t1):
        a = np.asarray(ts)
        if not np.isfinite(a).all():
            raise ValueError(f"saveat must be finite, got {a}")
        if np.any(np.diff(a) < 0):
            raise ValueError(f"saveat times must be non-decreasing, got {a}")
        slack = 1e-6 * max(1.0, abs(float(t1)))
        if a[0] < float(t0) - slack or a[-1] > float(t1) + slack:
            raise ValueError(f"saveat times must lie in [t0, t1] = [{float(t0)}, {float(t1)}], "
                             f"got [{a[0]}, {a[-1]}]")
        ts = jnp.clip(ts, t0, t1)
    return ts


def _default_max_steps(t0, t1, dt0, controller):
    if isinstance(controller, diffrax.ConstantStepSize) and dt0 is not None and all(
        is_concrete(v) for v in (t0, t1, dt0)
    ):
        steps = int(np.ceil((float(t1) - float(t0)) / float(dt0) * (1 + 1e-6))) + 1
        # round up to a power of two: a new horizon reuses the compiled program
        return max(16, 1 << (steps - 1).bit_length())
    return 100_000


def solve(
    dynamics: AbstractDynamics,
    x0,
    *,
    t1,
    t0=0.0,
    dt0=None,
    saveat=None,
    weights=None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    stats: Callable | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    throw: bool = True,
    stop_on_nonfinite: bool = True,
):
    """Integrate dx_i/dt = v(t, x_i; μ_t), μ_t = Σ_j w_j δ_{x_j(t)}, from t0 to t1.

    Args:
        dynamics: an attention (tokens in R^d) or ``tp.Sphere(attention)``.
        x0: initial tokens ``(n, d)``; or a :class:`Gaussian` to integrate the moment ODEs
            of the Gaussian closure (euclidean.md §4), returning a :class:`GaussianSolution`.
        t1, t0: time span; t1 > t0 (depth = time).
        dt0: initial (or constant) step. Euler with constant ``dt0`` is a residual
            Transformer with layer step ``dt0``.
        saveat: times at which states are returned (default: ``[t1]``).
        weights: token weights ``(n,)`` (uniform if None); fixed in time (euclidean.md §1).
        solver: any diffrax solver (default ``diffrax.Tsit5()``).
        stepsize_controller: default constant steps; pass ``diffrax.PIDController(rtol, atol)``
            for adaptive steps.
        stats: ``stats(t, x) -> pytree`` saved instead of the states (large runs need not
            store every state); results in ``Solution.stats``.
        adjoint: diffrax adjoint for gradients (default: recursive checkpointing).
        max_steps: step cap (default: exact for constant steps, 100 000 otherwise).
        progress: show a progress bar (diffrax's tqdm meter, updated from inside jit).
        throw: raise if the solve fails; otherwise inspect ``Solution.result``.
        stop_on_nonfinite: stop at the first step whose state holds a NaN or inf (finite-time
            blow-up, too large a step) and report its time: with ``throw`` a
            :class:`NonFiniteStateError` naming the time, otherwise
            ``Solution.nonfinite_time`` and ``result == RESULTS.event_occurred``. A
            ``diffrax.Event`` checked after every step; not available with adjoints that
            exclude events (e.g. ``ImplicitAdjoint``), where it is skipped.

    The compiled program depends only on shapes and the static configuration, so repeated
    calls with new values (x0, parameters, t1) do not recompile; ``solve`` works under
    ``jax.vmap`` and ``jax.grad``.
    """
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be an attention or tp.Sphere(attention), got "
                         f"{type(dynamics).__name__}")
    if isinstance(x0, Gaussian):
        from .gaussian_solve import solve_gaussian

        if weights is not None or stats is not None:
            raise ValueError("weights and stats apply to particles, not to a Gaussian initial state")
        return solve_gaussian(dynamics, x0, t0=t0, t1=t1, dt0=dt0, saveat=saveat, solver=solver,
                              stepsize_controller=stepsize_controller, adjoint=adjoint,
                              max_steps=max_steps, progress=progress, throw=throw)
    x0 = dynamics.check_state(x0, "x0")
    dtype = x0.dtype
    w = check_weights(weights, x0.shape[0], dtype)
    ts = _check_times(t0, t1, dt0, saveat, dtype)
    solver = diffrax.Tsit5() if solver is None else solver
    if stepsize_controller is None:
        stepsize_controller = diffrax.ConstantStepSize()
    if dt0 is None and isinstance(stepsize_controller, diffrax.ConstantStepSize):
        raise ValueError("dt0 is required with constant step sizes (pass dt0=..., or an adaptive "
                         "stepsize_controller such as diffrax.PIDController)")
    if max_steps is None:
        max_steps = _default_max_steps(t0, t1, dt0, stepsize_controller)
    check_int(max_steps, "max_steps", minimum=1)
    if stats is not None and not callable(stats):
        raise ValueError(f"stats must be a callable stats(t, x), got {stats!r}")
    t0a, t1a = _as_time(t0, "t0", dtype), _as_time(t1, "t1", dtype)
    dt0a = None if dt0 is None else jnp.asarray(dt0, dtype)
    adjoint = adjoint or diffrax.RecursiveCheckpointAdjoint()
    watch = bool(stop_on_nonfinite) and isinstance(
        adjoint, (diffrax.RecursiveCheckpointAdjoint, diffrax.DirectAdjoint))
    sol = _solve_particles(
        dynamics, x0, w, t0a, t1a, dt0a, ts, solver, stepsize_controller,
        stats, adjoint, int(max_steps), bool(progress), bool(throw), watch,
    )
    if throw and watch:
        sol = _raise_if_nonfinite(sol)
    return sol


def _raise_if_nonfinite(sol: Solution) -> Solution:
    """Report a non-finite state with its time: ValueError-style message when concrete,
    ``eqx.error_if`` under an outer ``jit``/``vmap`` (where the time cannot be formatted)."""
    bad_t = sol.nonfinite_time
    if is_concrete(bad_t):
        t = np.asarray(bad_t)
        if np.ndim(t) == 0 and np.isfinite(t):
            raise NonFiniteStateError(
                f"solve: the state became non-finite (NaN or inf) at t = {float(t):.6g} (end of the "
                "first step that produced it); the run was stopped there. Typical causes: "
                "finite-time blow-up of the dynamics, or a step dt0 too large for the parameters "
                "(beta, token norms). Pass throw=False to get the partial Solution "
                "(Solution.nonfinite_time, saves after it are inf).")
        return sol
    ts = eqx.error_if(sol.ts, jnp.any(jnp.isfinite(bad_t)),
                      "solve: the state became non-finite (NaN or inf) during the run; rerun with "
                      "throw=False and read Solution.nonfinite_time for the time it appeared")
    return eqx.tree_at(lambda s: s.ts, sol, ts)


@eqx.filter_jit
def _solve_particles(dynamics, x0, w, t0, t1, dt0, ts, solver, controller, stats, adjoint,
                     max_steps, progress, throw, watch=False):
    # the state's dtype sets the precision of the run: float32 tokens with float64 parameters
    # (e.g. under x64) integrate in float32 instead of failing on a dtype mismatch
    term = diffrax.ODETerm(lambda t, y, args: dynamics._velocity(y, w, t).astype(y.dtype))
    retract = dynamics.retract
    if type(dynamics).retract is not AbstractDynamics.retract:
        solver = _Retracted(solver, dynamics)
    if stats is None:
        fn = lambda t, y, args: retract(y)  # noqa: E731 - dense output may leave the manifold
    else:
        fn = lambda t, y, args: stats(t, retract(y))  # noqa: E731
    meter = diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter()
    if watch:
        # Stop at the first accepted step with a NaN/inf state; the extra save at t1 records
        # the time the run actually stopped (the event time, or t1).
        saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts, fn=fn),
                                      diffrax.SubSaveAt(t1=True, fn=lambda t, y, args: t)])
        event = diffrax.Event(lambda t, y, args, **kw: ~jnp.all(jnp.isfinite(y)))
    else:
        saveat, event = diffrax.SaveAt(ts=ts, fn=fn), None
    sol = diffrax.diffeqsolve(
        term, solver, t0, t1, dt0, x0, saveat=saveat, stepsize_controller=controller,
        adjoint=adjoint, max_steps=max_steps, throw=throw, progress_meter=meter, event=event,
    )
    if watch:
        (save_ts, _), (ys, t_end) = sol.ts, sol.ys
        stopped = sol.result == diffrax.RESULTS.event_occurred
        nonfinite_time = jnp.where(stopped, t_end[0], jnp.inf)
    else:
        save_ts, ys, nonfinite_time = sol.ts, sol.ys, None
    return Solution(
        ts=save_ts, xs=ys if stats is None else None, stats=None if stats is None else ys,
        weights=w, num_steps=sol.stats["num_accepted_steps"], result=sol.result,
        nonfinite_time=nonfinite_time,
    )


def layers(dynamics: AbstractDynamics, x0, num_layers: int, step, *, weights=None, t0=0.0,
           save_every: int = 1) -> Solution:
    """The discrete residual Transformer: x ← retract(x + h · v(t_l, x)), t_l = t0 + l·h.

    This is explicit Euler with step ``h``; on the sphere it is followed by layer
    normalization x ← x/|x| (spec README, "Conventions"). Returns states after every
    ``save_every`` layers, including the input (layer 0).
    """
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be an attention or tp.Sphere(attention), got "
                         f"{type(dynamics).__name__}")
    if int(num_layers) < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if int(save_every) < 1 or int(num_layers) % int(save_every):
        raise ValueError(f"save_every={save_every} must be >= 1 and divide num_layers={num_layers}")
    check_scalar(step, "step", positive=True)
    x0 = dynamics.check_state(x0, "x0")
    w = check_weights(weights, x0.shape[0], x0.dtype)
    h = jnp.asarray(step, x0.dtype)
    t0 = _as_time(t0, "t0", x0.dtype)
    xs = _layers(dynamics, x0, w, h, t0, int(num_layers), int(save_every))
    ts = t0 + h * jnp.arange(0, int(num_layers) + 1, int(save_every), dtype=x0.dtype)
    if is_concrete(xs):
        finite = np.isfinite(np.asarray(xs)).reshape(xs.shape[0], -1).all(axis=1)
        if not finite.all():
            k = int(np.argmin(finite))
            raise NonFiniteStateError(
                f"layers: the tokens became non-finite (NaN or inf) by layer {k * int(save_every)} "
                f"(t = {float(ts[k]):.6g}); the step or the parameters are too large")
    return Solution(ts=ts, xs=xs, stats=None, weights=w, num_steps=jnp.asarray(int(num_layers)),
                    result=diffrax.RESULTS.successful)


@eqx.filter_jit
def _layers(dynamics, x0, w, h, t0, num_layers, save_every):
    def layer(x, l):
        return dynamics.retract(x + h * dynamics._velocity(x, w, t0 + l * h).astype(x.dtype)), None

    def block(x, b):
        x, _ = jax.lax.scan(layer, x, b * save_every + jnp.arange(save_every))
        return x, x

    _, xs = jax.lax.scan(block, x0, jnp.arange(num_layers // save_every))
    return jnp.concatenate([x0[None], xs], axis=0)
