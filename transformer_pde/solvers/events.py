"""Blow-up watches of :func:`transformer_pde.solve`, as values (its ``event=``).

A finite-time blow-up (Riccati covariances, unnormalized attention, a step too large for the
parameters) must stop a run or at least say when, never fill it with NaN silently. Two watches,
one criterion (the state's :meth:`~transformer_pde.solvers.AbstractState.blown_up`):

* :class:`BlowUp` (the default) checks after every accepted step (a ``diffrax.Event``) and stops
  the run there;
* :class:`BlowUpAtSaves` checks the states at the save times (and at t1) and lets the run go on.
  No event makes the solver's loop the cheaper kind: for many small vmapped systems (a phase
  diagram) the event's extra tracing and compiling are a visible part of the run.

The time found is reported by the solution (``Solution.nonfinite_time``,
``GaussianSolution.blowup_time``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import diffrax
import equinox as eqx
import jax

from .._checks import check_scalar


class AbstractBlowUp(eqx.Module):
    """A watch for blow-up: what leaving every bounded set means (``threshold``) and where it is
    checked (each subclass).

    Args:
        threshold: the largest tr Σ of a Gaussian state (default: 1e10 · tr Σ0 in float64, the
            largest growth the time grid resolves in lower precision,
            :func:`~transformer_pde.solvers.states.default_blowup_factor`). Particles blow up on
            non-finite values only.
    """

    threshold: eqx.AbstractVar[float | jax.Array | None]

    def __check_init__(self):
        if self.threshold is not None:
            check_scalar(self.threshold, f"{type(self).__name__}.threshold", positive=True)

    @abc.abstractmethod
    def stop_event(self, blown_up: Callable) -> diffrax.Event | None:
        """The diffrax event that stops the run once ``blown_up(y)`` (None: the run goes on)."""

    @abc.abstractmethod
    def save_check(self, blown_up: Callable) -> Callable | None:
        """What each save records beside its value, ``blown_up(y)`` (None: nothing)."""

    def check_controller(self, controller: diffrax.AbstractStepSizeController) -> None:
        """ValueError if this watch cannot watch a run under ``controller``."""

    @abc.abstractmethod
    def time_found(self) -> str:
        """What the reported time is, for error messages."""


class BlowUp(AbstractBlowUp):
    """Stop at the first step whose state has left every bounded set: a NaN or inf anywhere,
    and for a :class:`~transformer_pde.Gaussian` a covariance trace above ``threshold``
    (see :class:`AbstractBlowUp`). The reported time is the end of that step.

    ``tp.solve(..., event=tp.BlowUp())`` is the default; ``event=None`` integrates on whatever
    happens.
    """

    threshold: float | jax.Array | None = None

    def stop_event(self, blown_up):
        return diffrax.Event(lambda t, y, args, **kwargs: blown_up(y))

    def save_check(self, blown_up):
        return None

    def time_found(self):
        return "end of the first step that produced it; the run was stopped there"


class BlowUpAtSaves(AbstractBlowUp):
    """Check the state at every save time and at t1, not at every step, and do not stop the run:
    the reported time is the first save time (or t1) whose state had left every bounded set, and
    saves from it on are ``inf``, as after :class:`BlowUp` (integer statistics cannot be: read
    them before that time only); the solve then raises (or, with ``throw=False``,
    ``Solution.result`` is ``RESULTS.event_occurred``). A statistic's own NaN check of the tokens a
    save hands it (``tp.diagnostics.cluster_count`` and the like) is left to this watch.

    Cheaper than :class:`BlowUp`: with no event diffrax traces and compiles its loop once less (at
    phase-diagram's peer settings its whole process took 8.56 → 8.30 s). The time is known to the
    save grid only, and a run that blows up computes on to t1. Constant steps only: after a non-finite
    step an adaptive controller rejects every step until ``max_steps``.
    """

    threshold: float | jax.Array | None = None

    def stop_event(self, blown_up):
        return None

    def save_check(self, blown_up):
        return blown_up

    def time_found(self):
        return "the first save time, or t1, whose state held it (BlowUpAtSaves)"

    def check_controller(self, controller):
        if isinstance(controller, diffrax.AbstractAdaptiveStepSizeController):
            raise ValueError(f"BlowUpAtSaves watches constant-step runs (after a non-finite step an adaptive "
                             f"controller rejects every step until max_steps): use tp.BlowUp() with "
                             f"{type(controller).__name__}")


__all__ = ["AbstractBlowUp", "BlowUp", "BlowUpAtSaves"]
