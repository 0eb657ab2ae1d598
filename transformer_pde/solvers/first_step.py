"""A solve's first step given to its step-size controller rather than to ``diffeqsolve``.

Given ``dt0``, ``diffeqsolve`` checks (t1 − t0)·dt0 >= 0 with ``eqx.error_if``, a host callback
when the times are traced (every solve program: they are its arguments), and JAX's persistent
compilation cache keeps no program holding one. ``tp.solve`` checks t1 > t0 and dt0 > 0 itself
(before the program, or as its own reportable check under a caller's trace), calls
``diffeqsolve`` with ``dt0=None`` and hands ``dt0`` to the controller through
:func:`with_first_step`: diffrax's controllers take dt0 only in ``init``, so the steps are the
same, bit for bit.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax

__all__ = ["with_first_step"]


def with_first_step(controller: diffrax.AbstractStepSizeController, dt0: jax.Array):
    """``controller`` whose ``init`` takes ``dt0`` from here (``diffeqsolve`` gets ``dt0=None``),
    adaptive where ``controller`` is (diffrax reads an adaptive controller's tolerances: implicit
    solvers, events)."""
    if isinstance(controller, diffrax.AbstractAdaptiveStepSizeController):
        return _AdaptiveFirstStep(controller, dt0)
    return _FirstStep(controller, dt0)


class _AbstractFirstStep(diffrax.AbstractStepSizeController):
    """Delegates to ``controller``, its first step ``dt0`` (diffrax multiplies a given dt0 by the
    direction of time, as :meth:`wrap` does here, then hands it to ``init``)."""

    controller: eqx.AbstractVar[diffrax.AbstractStepSizeController]
    dt0: eqx.AbstractVar[jax.Array]

    def wrap(self, direction):
        return type(self)(self.controller.wrap(direction), self.dt0 * direction)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        del dt0  # None: diffeqsolve was given none
        return self.controller.init(terms, t0, t1, y0, self.dt0, args, func, error_order)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        return self.controller.adapt_step_size(t0, t1, y0, y1_candidate, args, y_error, error_order,
                                               controller_state)


class _FirstStep(_AbstractFirstStep):
    controller: diffrax.AbstractStepSizeController
    dt0: jax.Array


class _AdaptiveFirstStep(_AbstractFirstStep, diffrax.AbstractAdaptiveStepSizeController):
    controller: diffrax.AbstractAdaptiveStepSizeController
    dt0: jax.Array

    @property
    def rtol(self):
        return self.controller.rtol

    @property
    def atol(self):
        return self.controller.atol

    @property
    def norm(self):
        return self.controller.norm
