"""Steps that stop at the switches of a dynamics: the switch time of a switched dynamics
(:mod:`transformer_pde.models.switched`: Mix-LN) and the layer boundaries of
:class:`~transformer_pde.PiecewiseConstant` parameters, so no solver stage of a step evaluates the
field on the other side of a switch."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import is_concrete, runtime_check
from ..models.base import AbstractRetractedDynamics
from ..params import PiecewiseConstant

__all__ = ["checked_steps", "jump_at_switches", "parameter_switch_times"]


def parameter_switch_times(dynamics, dtype) -> tuple[float, ...]:
    """The layer boundaries of every :class:`~transformer_pde.PiecewiseConstant` in the dynamics
    (with concrete t0, dt), as the floats of ``dtype`` at which the parameter changes."""
    pcs = [p for p in jax.tree.leaves(dynamics, is_leaf=lambda v: isinstance(v, PiecewiseConstant))
           if isinstance(p, PiecewiseConstant) and p.exact_boundaries]
    return tuple(sorted({float(b) for p in pcs for b in p.boundaries(dtype)}))


class _JumpingStepTo(diffrax.StepTo):
    """``StepTo`` whose grid holds pairs (τ⁻, τ⁺), the floats around a switch τ: a step ends at
    τ⁻ and the next starts at τ⁺ (a jump, as ``ClipStepSizeController(jump_ts=...)`` makes; FSAL
    solvers re-evaluate there), so no step, not even one of 2 ulp, straddles τ.
    ``jumps[k]``: ``ts[k]`` is a τ⁻."""

    jumps: jax.Array = eqx.field(converter=jnp.asarray)

    def checked(self, t0, t1):
        """This grid, checked against the run's ``t0 < t1`` (StepTo's checks, in its order: the grid
        increasing in the direction of time, its ends t0 and t1), through this library's
        ``runtime_check``: called by the solve's program before ``diffeqsolve``, so the checks sit
        in the library's own jit, not in diffrax's (a kept program reports them as values, and one
        collecting them, :func:`~transformer_pde._checks.carry_checks`, can reach them there)."""
        direction = jnp.where(t0 < t1, 1, -1)
        ts = runtime_check(self.ts, self.ts[1:] * direction <= self.ts[:-1] * direction,
                           "the step grid must be strictly increasing")
        ts = runtime_check(ts, (t0 != ts[0]) | (t1 != ts[-1]), "Must have `t0==ts[0]` and `t1==ts[-1]`.")
        return type(self)(ts=ts, jumps=self.jumps)

    def wrap(self, direction):  # checked before the solve (checked)
        return type(self)(ts=self.ts * direction, jumps=self.jumps)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        # StepTo's first step; its check of the ends was made before the solve (checked)
        del terms, t0, t1, y0, args, func, error_order
        if dt0 is not None:
            raise ValueError("`dt0` should be `None`. Step location is already determined by "
                             f"{type(self).__name__}(ts=...).")
        return self.ts[1], 2

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        k = controller_state  # t1 == ts[k - 1]
        last = self.ts.shape[0] - 1
        jump = self.jumps[k - 1]
        next_t0 = jnp.where(jump, self.ts[jnp.minimum(k, last)], t1)
        next_t1 = jnp.where(jump, self.ts[jnp.minimum(k + 1, last)], self.ts[jnp.minimum(k, last)])
        return True, next_t0, next_t1, jump, k + jnp.where(jump, 2, 1), diffrax.RESULTS.successful


def checked_steps(controller, t0, t1):
    """The solve's step-size controller with the checks of a grid :func:`jump_at_switches` made
    (:meth:`_JumpingStepTo.checked`), traced in the solve's program before ``diffeqsolve``; any
    other controller as it is."""
    return controller.checked(t0, t1) if isinstance(controller, _JumpingStepTo) else controller


def jump_at_switches(dynamics, controller, t0, t1, dt0, dtype):
    """A step-size controller that steps to just before each switch in (t0, t1) and on from just
    after it, so no solver stage of a step evaluates the field on the other side: the dynamics'
    ``switch_times`` (:mod:`transformer_pde.models.switched`) and the layer boundaries of its
    :class:`~transformer_pde.PiecewiseConstant` parameters. Adaptive controllers get diffrax's
    ``jump_ts``; constant steps become the grid t0 + k·dt0 given exactly with each switch τ
    replaced by the floats τ⁻ < τ < τ⁺ around it and a jump from τ⁻ to τ⁺ (a dynamics' switch
    must lie on the grid; a layer boundary off it is added to it)."""
    structural = dynamics.switch_times if isinstance(dynamics, AbstractRetractedDynamics) else ()
    params = parameter_switch_times(dynamics, dtype)
    if not structural and not params:
        return controller, dt0
    if isinstance(controller, diffrax.AbstractAdaptiveStepSizeController) and not (
            is_concrete(t0) and is_concrete(t1)):  # diffrax ignores the jumps outside (t0, t1)
        jumps = jnp.asarray(sorted({float(np.asarray(s, dtype)) for s in (*structural, *params)}), dtype)
        return diffrax.ClipStepSizeController(controller, jump_ts=jumps), dt0
    if not (is_concrete(t0) and is_concrete(t1)):
        raise ValueError(f"{type(dynamics).__name__} changes at t = {sorted({*structural, *params})}: "
                         "solve it over concrete t0, t1 (the steps must stop at the switches)")
    lo, hi = float(t0), float(t1)
    structural = [s for s in structural if lo < s < hi]
    params = [s for s in params if lo < s < hi]
    if not structural and not params:
        return controller, dt0
    inside = sorted({float(np.asarray(s, dtype)) for s in (*structural, *params)})
    if isinstance(controller, diffrax.AbstractAdaptiveStepSizeController):
        return diffrax.ClipStepSizeController(controller, jump_ts=jnp.asarray(inside, dtype)), dt0
    name = type(dynamics).__name__
    if not isinstance(controller, diffrax.ConstantStepSize) or not all(
            is_concrete(v) for v in (t0, t1, dt0)):
        raise ValueError(f"{name} changes at t = {inside}: solve it with constant steps (concrete "
                         f"t0, t1, dt0) or an adaptive stepsize_controller, got {type(controller).__name__}")
    t0, t1, dt0 = float(t0), float(t1), float(dt0)
    # a switch within round-off of an end (a chunk starting at the switch) is no switch inside
    inside = [s for s in inside if min(abs(s - t0), abs(s - t1)) > 1e-9 * dt0]
    structural = [s for s in structural if min(abs(s - t0), abs(s - t1)) > 1e-9 * dt0]
    if not inside:
        return controller, dt0
    num = max(int(np.ceil((t1 - t0) / dt0 - 1e-9)), 1)
    grid = [float(v) for v in np.asarray(t0 + dt0 * np.arange(num + 1), dtype)]
    grid[-1] = float(np.asarray(t1, dtype))
    for s in structural:
        k = int(np.rint((s - t0) / dt0))
        if abs(t0 + k * dt0 - s) > 1e-9 * max(1.0, abs(s)):
            raise ValueError(f"{name} switches at t = {s:g}, which is not on the step grid t0 + k·dt0 "
                             f"(t0 = {t0:g}, dt0 = {dt0:g}); choose dt0 dividing {s - t0:g}, or an "
                             "adaptive stepsize_controller")
    # a grid point within 1e-9 dt0 of a switch is the switch; other switches are added
    grid = [g for g in grid if all(abs(g - s) > 1e-9 * dt0 for s in inside) or g in (grid[0], grid[-1])]
    ts, jumps = [], []
    for g in sorted(set(grid) | set(inside)):
        if g in inside:
            tau = np.asarray(g, dtype)
            ts += [float(np.nextafter(tau, -np.inf)), float(np.nextafter(tau, np.inf))]
            jumps += [True, False]
        else:
            ts.append(g)
            jumps.append(False)
    return _JumpingStepTo(ts=np.asarray(ts, dtype), jumps=np.asarray(jumps)), None
