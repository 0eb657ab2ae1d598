"""Particles: integrate dx_i/dt = v(t, x_i; μ_t) with diffrax, and the discrete layers.

Called through :func:`transformer_pde.solve` (``solve/api.py``); strategies (solver, step-size
controller, adjoint) are diffrax objects passed as values.
"""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import NonFiniteStateError, check_int, check_scalar, check_weights, is_concrete
from ..models.base import AbstractDynamics, AbstractRetractedDynamics, retract_at, retract_step, step_velocity
from ..models.switched import AbstractSwitched
from .core import MAX_STEPS, Retracted, as_time, check_times, default_max_steps, integrate, parse_saveat


class Solution(eqx.Module):
    """Result of :func:`solve` for particles.

    Attributes:
        ts: save times, shape ``(T,)``.
        xs: states at ``ts``, shape ``(T, n, d)`` (None when only statistics were saved).
        stats: the pytree returned by ``SaveAt(fn=fn)``'s ``fn(t, x, args)`` at each save time
            (None when states were saved).
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
            raise ValueError("this solution saved statistics only (SaveAt(fn=...)); no states")
        return self.xs[-1]

    @property
    def succeeded(self):
        return self.result == diffrax.RESULTS.successful


def solve_particles(
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
    adjoint: diffrax.AbstractAdjoint | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    throw: bool = True,
    stop_on_nonfinite: bool = True,
):
    """The particle case of :func:`transformer_pde.solve` (same arguments)."""
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be an attention or tp.Sphere(attention), got "
                         f"{type(dynamics).__name__}")
    x0 = dynamics.check_state(x0, "x0")
    dtype = x0.dtype
    w = check_weights(weights, x0.shape[0], dtype)
    save_ts, stats = parse_saveat(saveat)
    ts = check_times(t0, t1, dt0, save_ts, dtype)
    solver = diffrax.Tsit5() if solver is None else solver
    if stepsize_controller is None:
        stepsize_controller = diffrax.ConstantStepSize()
    if dt0 is None and isinstance(stepsize_controller, diffrax.ConstantStepSize):
        raise ValueError("dt0 is required with constant step sizes (pass dt0=..., or an adaptive "
                         "stepsize_controller such as diffrax.PIDController)")
    if isinstance(dynamics, AbstractSwitched):
        dynamics = dynamics.part_on(t0, t1)
    if isinstance(dynamics, AbstractRetractedDynamics) and dynamics.switch_times:
        stepsize_controller, dt0 = jump_at_switches(dynamics, stepsize_controller, t0, t1, dt0, dtype)
    if max_steps is None:
        max_steps = default_max_steps(t0, t1, dt0, stepsize_controller)
    check_int(max_steps, "max_steps", minimum=1)
    if max_steps > MAX_STEPS:
        raise ValueError(f"max_steps={max_steps} exceeds {MAX_STEPS} (diffrax counts steps in int32)")
    t0a, t1a = as_time(t0, "t0", dtype), as_time(t1, "t1", dtype)
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


def jump_at_switches(dynamics: AbstractRetractedDynamics, controller, t0, t1, dt0, dtype):
    """A step-size controller that steps to just before each of the dynamics' ``switch_times`` in
    (t0, t1) and on from just after it, so no solver stage of one part evaluates the other's field
    (:mod:`transformer_pde.models.switched`). Adaptive controllers get diffrax's ``jump_ts``;
    constant steps become the grid t0 + k·dt0 given exactly (``diffrax.StepTo``), with the switch
    point τ replaced by the two floats around it (a step of 2 ulp), which needs τ on the grid."""
    inside = [s for s in dynamics.switch_times if float(t0) < s < float(t1)]
    if not inside:
        return controller, dt0
    if isinstance(controller, diffrax.AbstractAdaptiveStepSizeController):
        return diffrax.ClipStepSizeController(controller, jump_ts=jnp.asarray(inside)), dt0
    name = type(dynamics).__name__
    if not isinstance(controller, diffrax.ConstantStepSize) or not all(
            is_concrete(v) for v in (t0, t1, dt0)):
        raise ValueError(f"{name} changes at t = {inside}: solve it with constant steps (concrete "
                         f"t0, t1, dt0) or an adaptive stepsize_controller, got {type(controller).__name__}")
    t0, t1, dt0 = float(t0), float(t1), float(dt0)
    num = max(int(np.ceil((t1 - t0) / dt0 - 1e-9)), 1)
    grid = list(t0 + dt0 * np.arange(num + 1))
    grid[-1] = t1
    for s in sorted(inside, reverse=True):
        k = int(np.rint((s - t0) / dt0))
        if abs(t0 + k * dt0 - s) > 1e-9 * max(1.0, abs(s)):
            raise ValueError(f"{name} switches at t = {s:g}, which is not on the step grid t0 + k·dt0 "
                             f"(t0 = {t0:g}, dt0 = {dt0:g}); choose dt0 dividing {s - t0:g}, or an "
                             "adaptive stepsize_controller")
        tau = np.asarray(s, dtype)
        grid[k:k + 1] = [np.nextafter(tau, -np.inf), np.nextafter(tau, np.inf)]
    return diffrax.StepTo(ts=np.asarray(grid, dtype)), None


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
    # attached to every output (states, statistics, times), so a jit that keeps any of them
    # keeps the check: a caller who reads only .xs (or a tp.sweep of one number) still gets it
    bad = jnp.any(jnp.isfinite(bad_t))
    msg = ("solve: the state became non-finite (NaN or inf) during the run; rerun with "
           "throw=False and read Solution.nonfinite_time for the time it appeared")
    guarded = jax.tree.map(lambda a: eqx.error_if(a, bad, msg), (sol.ts, sol.xs, sol.stats))
    return eqx.tree_at(lambda s: (s.ts, s.xs, s.stats), sol, guarded, is_leaf=lambda v: v is None)


@eqx.filter_jit
def _solve_particles(dynamics, x0, w, t0, t1, dt0, ts, solver, controller, stats, adjoint,
                     max_steps, progress, throw, watch=False):
    # the state's dtype sets the precision of the run: float32 tokens with float64 parameters
    # (e.g. under x64) integrate in float32 instead of failing on a dtype mismatch
    term = diffrax.ODETerm(lambda t, y, args: dynamics.vector_field(y, w, t).astype(y.dtype))
    if isinstance(dynamics, AbstractRetractedDynamics):
        solver = Retracted(solver, dynamics)
    # saves interpolate between steps (dense output may leave the manifold): retract them
    if stats is None:
        fn = lambda t, y, args: retract_at(dynamics, y, t)  # noqa: E731
    else:
        fn = lambda t, y, args: stats(t, retract_at(dynamics, y, t), args)  # noqa: E731
    if watch:
        # Stop at the first accepted step with a NaN/inf state; the extra save at t1 records
        # the time the run actually stopped (the event time, or t1).
        saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts, fn=fn),
                                      diffrax.SubSaveAt(t1=True, fn=lambda t, y, args: t)])
        event = diffrax.Event(lambda t, y, args, **kw: ~jnp.all(jnp.isfinite(y)))
    else:
        saveat, event = diffrax.SaveAt(ts=ts, fn=fn), None
    sol = integrate(term, solver, t0, t1, dt0, x0, saveat=saveat, stepsize_controller=controller,
                    adjoint=adjoint, max_steps=max_steps, throw=throw, progress=progress, event=event)
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
    num_layers = check_int(num_layers, "num_layers", minimum=1)
    save_every = check_int(save_every, "save_every", minimum=1)
    if int(num_layers) % int(save_every):
        raise ValueError(f"save_every={save_every} must be >= 1 and divide num_layers={num_layers}")
    check_scalar(step, "step", positive=True)
    x0 = dynamics.check_state(x0, "x0")
    w = check_weights(weights, x0.shape[0], x0.dtype)
    h = jnp.asarray(step, x0.dtype)
    t0 = as_time(t0, "t0", x0.dtype)
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
        t = t0 + l * h
        v = step_velocity(dynamics, x, w, t, t + h).astype(x.dtype)
        return retract_step(dynamics, x + h * v, t, t + h), None

    def block(x, b):
        x, _ = jax.lax.scan(layer, x, b * save_every + jnp.arange(save_every))
        return x, x

    _, xs = jax.lax.scan(block, x0, jnp.arange(num_layers // save_every))
    return jnp.concatenate([x0[None], xs], axis=0)
