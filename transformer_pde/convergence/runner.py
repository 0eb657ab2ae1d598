r"""The one runner of a study: for every seed, the n-particle system evolved beside its reference's
states (one ``tp.Coupled`` state, one step sequence), measured at every save."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._programs import run_program
from ..diagnostics.study_distances import AbstractStudyDistance
from ..solvers import Coupled, Particles, solve
from .metrics import METRICS, measure


class StudySpec(eqx.Module):
    """How every system of a study is run and measured, one value for all of them.

    Attributes:
        ts: measurement times ``(T,)``; t1, dt0: horizon and constant step (scalars, the study's dtype).
        solver: the diffrax solver.
        distance: the transport distance measured (:class:`~transformer_pde.diagnostics.AbstractStudyDistance`).
        w2_max_n: an inexact (Sinkhorn) distance is measured for n <= w2_max_n only (NaN above).
        max_steps: the solver's step budget.
    """

    ts: jax.Array
    t1: jax.Array
    dt0: jax.Array
    solver: diffrax.AbstractSolver
    distance: AbstractStudyDistance
    w2_max_n: int = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)


def run(dynamics, reference, keys, n: int, spec: StudySpec) -> dict:
    """Metric name -> ``(seeds, times)`` for the n-particle systems of ``keys`` against
    ``reference``, with ``reference_error``: for each metric, the change when the reference's
    coarser version replaces it where it has one, its ``own_error`` otherwise. One program per
    ``n``, kept between processes inside :func:`~transformer_pde.runs.kept_programs` (its
    solves are traced inside it, so it is this program that must be kept)."""
    return run_program(_run, _jit_run, (dynamics, reference, keys, n, spec))


def _run(dynamics, reference, keys, n: int, spec: StudySpec) -> dict:
    with_w2 = n <= spec.w2_max_n

    def one(key):
        # independent samples across n (fold in n): the fits treat the n's as independent
        x0, sample_key = reference.initial(jax.random.fold_in(key, n), n)
        w = jnp.full((n,), 1.0 / n, reference.dtype)

        def save(t, y, args):
            x, *parts = y
            out = [measure(x, *c, spec.distance, with_w2) for c in reference.compared(x, x0, sample_key, parts)]
            fine = out[0]
            if len(out) > 1:
                ref_err = {k: jnp.abs(fine[k] - out[1][k]) for k in METRICS}
            else:
                ref_err = {k: jnp.full_like(fine[k], reference.own_error) for k in METRICS}
            return {**fine, "reference_error": ref_err}

        # the system, and the reference's states beside it (tracers from the same starts: the
        # same-seed coupling)
        state = Coupled(Particles(x0, w), *reference.companions(x0))
        return solve(dynamics, state, t1=spec.t1, dt0=spec.dt0, solver=spec.solver, max_steps=spec.max_steps,
                     saveat=diffrax.SaveAt(ts=spec.ts, fn=save)).stats

    return jax.lax.map(one, keys)


_jit_run = eqx.filter_jit(_run)
