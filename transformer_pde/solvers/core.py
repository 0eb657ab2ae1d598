"""The one place that calls :func:`diffrax.diffeqsolve`, and what every solve shares.

Particles, the Gaussian closure, SDEs of random-weight models, the coupled runs of the
convergence studies and the reduced ODEs of :mod:`transformer_pde.theory` all integrate
through :func:`integrate`; time checks, default step caps and save-time parsing live here once.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar, is_concrete


class Retracted(diffrax.AbstractWrappedSolver):
    """Wrap a diffrax solver so that every accepted step ends on the manifold.

    Projection methods keep the order of the underlying solver (Hairer–Lubich–Wanner,
    §IV.4). ``made_jump=True`` forces FSAL solvers to re-evaluate the field at the
    retracted point rather than reuse the pre-retraction value.

    Args:
        solver: any diffrax solver.
        manifold: a :class:`transformer_pde.models.AbstractRetractedDynamics` (its
            ``retract_step(y, t0, t1)``, which may depend on the step), or any module with that
            method for non-particle states.
    """

    solver: diffrax.AbstractSolver
    manifold: eqx.Module

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
        return self.manifold.retract_step(y1, t0, t1), err, dense, state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


def as_time(value, name, dtype):
    check_scalar(value, name)
    return jnp.asarray(value, dtype=dtype)


def check_times(t0, t1, dt0, ts, dtype):
    """Check (t0, t1, dt0) and the save times ``ts`` (None: ``[t1]``); returns ``ts`` as an array."""
    check_scalar(t0, "t0")
    check_scalar(t1, "t1")
    if is_concrete(t0) and is_concrete(t1) and not float(t1) > float(t0):
        raise ValueError(f"Must have t1 > t0, got t0={float(t0)} and t1={float(t1)}")
    if dt0 is not None:
        check_scalar(dt0, "dt0", positive=True)
    if ts is None:
        return jnp.asarray([t1], dtype=dtype)
    ts = jnp.asarray(ts, dtype=dtype)
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


_SAVE_Y = diffrax.SaveAt(t1=True).subs.fn


def parse_saveat(saveat):
    """(ts or None, fn or None) of ``saveat``: None (save at t1), an array of times, or a
    ``diffrax.SaveAt(ts=..., fn=...)`` / ``diffrax.SaveAt(t1=True, fn=...)``.

    ``fn(t, y, args)`` is diffrax's statistic signature; None means the states themselves.
    """
    if saveat is None:
        return None, None
    if not isinstance(saveat, diffrax.SaveAt):
        return saveat, None
    sub = saveat.subs
    if not isinstance(sub, diffrax.SubSaveAt) or saveat.dense or sub.t0 or sub.steps or (
            sub.ts is None) == (not sub.t1) or (sub.ts is not None and sub.t1):
        raise ValueError("solve takes diffrax.SaveAt(ts=..., fn=...) or diffrax.SaveAt(t1=True, "
                         f"fn=...) (one of ts, t1; no t0, steps, dense or subs), got {saveat}")
    if not callable(sub.fn):
        raise ValueError(f"SaveAt fn must be a callable fn(t, y, args), got {sub.fn!r}")
    return sub.ts, None if sub.fn is _SAVE_Y else sub.fn


def default_max_steps(t0, t1, dt0, controller):
    if isinstance(controller, diffrax.StepTo):
        return len(controller.ts) - 1  # exactly the steps of the given grid
    if isinstance(controller, diffrax.ConstantStepSize) and dt0 is not None and all(
        is_concrete(v) for v in (t0, t1, dt0)
    ):
        steps = np.ceil((float(t1) - float(t0)) / float(dt0) * (1 + 1e-6)) + 1
        if not steps <= MAX_STEPS:
            raise ValueError(f"dt0={float(dt0):.6g} over [t0, t1] = [{float(t0):.6g}, {float(t1):.6g}] "
                             f"needs {steps:.4g} constant steps, more than {MAX_STEPS} (diffrax counts "
                             "steps in int32); use a larger dt0 or an adaptive stepsize_controller")
        steps = int(steps)
        # round up to a power of two: a new horizon reuses the compiled program
        return min(MAX_STEPS, max(16, 1 << (steps - 1).bit_length()))
    return 100_000


MAX_STEPS = 2**31 - 1
"""diffrax counts steps in int32: no solve can ask for more."""


def integrate(terms, solver, t0, t1, dt0, y0, *, saveat, stepsize_controller=None, adjoint=None,
              max_steps=4096, throw=True, progress=False, event=None, args=None):
    """:func:`diffrax.diffeqsolve` with this package's defaults (constant steps, recursive
    checkpointing, tqdm progress from inside jit): the only call to it in the package."""
    return diffrax.diffeqsolve(
        terms, solver, t0, t1, dt0, y0, args=args, saveat=saveat,
        stepsize_controller=diffrax.ConstantStepSize() if stepsize_controller is None
        else stepsize_controller,
        adjoint=diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint,
        max_steps=max_steps, throw=throw, event=event,
        progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter())
