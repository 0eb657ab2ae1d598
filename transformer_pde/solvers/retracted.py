"""A diffrax solver wrapper that ends every accepted step with a retraction."""

from __future__ import annotations

import diffrax

from ..models.base import AbstractRetraction


class Retracted(diffrax.AbstractWrappedSolver):
    """Wrap a diffrax solver so that every accepted step ends on the manifold.

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

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def term_compatible_contr_kwargs(self):  # SRK solvers ask the Brownian path for Lévy areas
        return self.solver.term_compatible_contr_kwargs

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
        return self.retraction.retract_step(y1, t0, t1), err, dense, state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


__all__ = ["Retracted"]
