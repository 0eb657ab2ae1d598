r"""A dynamics that changes at a time: one (field, retraction) pair before τ, another after.

Architectures whose layers are not all alike (Mix-LN: Post-LN layers, then Pre-LN layers; a
sphere block stack followed by R^d blocks) are one dynamics, not a chain of runs:

$$\dot x = F_1(t, x)\ (t<\tau),\qquad \dot x = F_2(t, x)\ (t\ge\tau),$$

and a step [t0, t1] belongs to the part of its midpoint: its retraction is that part's, and so is
the field of a discrete layer (:meth:`AbstractSwitched.step_velocity`), so
``tp.layers(switched, x0, L, h)`` is layer l of the first part while t_l + h/2 < τ and of the
second after, whatever t_l = t0 + l·h rounds to. ``tp.solve`` steps to just before τ and on from
just after it (diffrax's ``jump_ts``; with constant steps, the same grid given exactly), so no
solver stage of a step of one part evaluates the other part's field and a solver of any order
keeps its order across the switch; a run on [t0, t1] that lies on one side of τ integrates that
part alone (:meth:`AbstractSwitched.part_on`). A state saved at τ is the first part's (just
retracted by it).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_scalar, is_concrete
from .base import AbstractDynamics, AbstractRetractedDynamics, retract_at, retract_step, step_velocity


class AbstractSwitched(AbstractRetractedDynamics):
    """``before`` on t < ``switch_time``, ``after`` from it on (module docstring)."""

    before: eqx.AbstractVar[AbstractDynamics]
    after: eqx.AbstractVar[AbstractDynamics]
    switch_time: eqx.AbstractVar[float]

    @property
    def dim(self):
        return self.before.dim if self.before.dim is not None else self.after.dim

    def check_state(self, x, name: str = "x"):
        return self.before.check_state(x, name)

    @property
    def switch_times(self) -> tuple[float, ...]:
        inner = lambda d: d.switch_times if isinstance(d, AbstractRetractedDynamics) else ()  # noqa: E731
        tau = self.switch_time
        return tuple(sorted({*(s for s in inner(self.before) if s < tau), tau,
                             *(s for s in inner(self.after) if s > tau)}))

    def part_on(self, t0, t1) -> AbstractDynamics:
        """The part that covers all of [t0, t1] (times that are concrete), else ``self``."""
        if is_concrete(t0) and is_concrete(t1):
            if float(t1) <= self.switch_time:
                return self.before
            if float(t0) >= self.switch_time:
                return self.after
        return self

    def _by_part(self, use_before, fn, dtype):
        """``fn(before)`` where ``use_before``, else ``fn(after)``: one branch is evaluated (a
        kernel sum each), lax.cond, not jnp.where."""
        return jax.lax.cond(use_before, lambda: fn(self.before).astype(dtype),
                            lambda: fn(self.after).astype(dtype))

    def _before_step(self, t0, t1):
        return 0.5 * (jnp.asarray(t0) + jnp.asarray(t1)) < self.switch_time

    def vector_field(self, x, weights, t):
        return self._by_part(jnp.asarray(t) < self.switch_time,
                             lambda part: part.vector_field(x, weights, t), x.dtype)

    def diffusion(self, x, dB, t):
        return self._by_part(jnp.asarray(t) < self.switch_time, lambda part: part.diffusion(x, dB, t), x.dtype)

    @property
    def additive_noise(self):
        return self.before.additive_noise and self.after.additive_noise

    def step_velocity(self, x, weights, t0, t1):
        return self._by_part(self._before_step(t0, t1),
                             lambda part: step_velocity(part, x, weights, t0, t1), x.dtype)

    def retract_step(self, x, t0, t1):
        return self._by_part(self._before_step(t0, t1), lambda part: retract_step(part, x, t0, t1), x.dtype)

    def retract_at(self, x, t):
        return self._by_part(jnp.asarray(t) <= self.switch_time, lambda part: retract_at(part, x, t), x.dtype)


def check_switch_time(value, owner: str) -> float:
    if not is_concrete(value):  # static: it picks the parts a solve integrates between
        raise ValueError(f"{owner}.switch_time must be a concrete number (it is static structure of "
                         f"the model), got a traced value; build the model outside jit")
    check_scalar(value, f"{owner}.switch_time")
    return float(value)


class Switched(AbstractSwitched):
    """Any two dynamics on the same tokens, switched at ``switch_time`` (module docstring).

    Args:
        before: the dynamics (its field and retraction) on t < switch_time.
        after: the dynamics on t >= switch_time.
        switch_time: τ, an absolute time (a float: the switch is part of the model's structure).
    """

    before: AbstractDynamics
    after: AbstractDynamics
    switch_time: float = eqx.field(static=True)

    def __init__(self, before, after, switch_time):
        for field, sub in (("before", before), ("after", after)):
            if not isinstance(sub, AbstractDynamics):
                raise ValueError(f"Switched.{field} must be a dynamics, got {type(sub).__name__}")
        if None not in (before.dim, after.dim) and before.dim != after.dim:
            raise ValueError(f"Switched: before acts on d={before.dim}, after on d={after.dim}")
        self.before, self.after = before, after
        self.switch_time = check_switch_time(switch_time, "Switched")
