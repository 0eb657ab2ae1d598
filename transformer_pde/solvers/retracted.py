"""A diffrax solver wrapper that ends every accepted step with a retraction."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp

from ..models.base import AbstractRetraction


class RetractedInterpolation(diffrax.AbstractLocalInterpolation):
    """The solver's interpolation on a step [t0, t1], moved to end at the retracted state.

    ``y(t) = p(t) + s (y1 - p(t1))`` with s = (t - t0)/(t1 - t0): ``p`` is the underlying
    solver's interpolant (which ends at the unretracted step), ``y1`` the retracted end. It starts
    at the (retracted) start of the step and ends exactly where the step ended, so a save at a
    step time is the retracted state, and saves between step times keep the solver's order.
    """

    t0: object
    t1: object
    inner: diffrax.AbstractLocalInterpolation
    y1: object

    def evaluate(self, t0, t1=None, left=True):
        if t1 is not None:
            return jax.tree.map(lambda a, b: a - b, self.evaluate(t1, left=left), self.evaluate(t0, left=left))
        s = (t0 - self.t0) / (self.t1 - self.t0)
        end = self.inner.evaluate(self.t1, left=left)
        return jax.tree.map(lambda p, e, y: p + jnp.asarray(s, p.dtype) * (y - e),
                            self.inner.evaluate(t0, left=left), end, self.y1)


class Retracted(diffrax.AbstractWrappedSolver):
    """Wrap a diffrax solver so that every accepted step ends on the manifold.

    Saves between steps (``SaveAt(ts=...)``, dense output) read :class:`RetractedInterpolation`,
    which ends every step at the retracted state: a save at a step time is on the manifold.
    Projection methods keep the order of the underlying solver (Hairer–Lubich–Wanner,
    §IV.4). ``made_jump=True`` forces FSAL solvers to re-evaluate the field at the
    retracted point rather than reuse the pre-retraction value.

    Args:
        solver: any diffrax solver.
        retraction: a :class:`transformer_pde.models.AbstractRetraction` (its
            ``retract_step(y, t0, t1)``, which may depend on the step): a retracted dynamics
            such as ``tp.Sphere(attn)``, or ``tp.models.UnitSphere()`` for a bare state.
    """

    solver: diffrax.AbstractSolver
    retraction: AbstractRetraction

    def __check_init__(self):
        if not isinstance(self.solver, diffrax.AbstractSolver):
            raise ValueError(f"Retracted.solver must be a diffrax solver such as diffrax.Heun(), got "
                             f"{type(self.solver).__name__}")
        if not isinstance(self.retraction, AbstractRetraction):
            raise ValueError(f"Retracted.retraction must be a retraction such as tp.Sphere(attn) or "
                             f"tp.models.UnitSphere(), got {type(self.retraction).__name__}")

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def term_compatible_contr_kwargs(self):  # SRK solvers ask the Brownian path for Lévy areas
        return self.solver.term_compatible_contr_kwargs

    @property
    def interpolation_cls(self):  # pyright: ignore
        return RetractedInterpolation

    @property
    def scan_kind(self):  # diffrax's DirectAdjoint reads it of a Runge–Kutta solver (the wrapped one)
        return self.solver.scan_kind

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
        y1 = self.retraction.retract_step(y1, t0, t1)
        # saves (SaveAt(ts=...), dense output) read the interpolant: it must end where the step does
        inner = self.solver.interpolation_cls(t0=t0, t1=t1, **dense)
        return y1, err, dict(inner=inner, y1=y1), state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


__all__ = ["Retracted", "RetractedInterpolation"]
