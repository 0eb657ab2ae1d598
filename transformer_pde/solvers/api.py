"""``tp.solve``: the one public entry point for particles, the Gaussian closure and
checkpointed runs.

One entry point per job (STYLE.md): ``solve(dynamics, state0, t1=..., ...)`` reads like the
equation dx_i/dt = v(t, x_i; μ_t); strategies (solver, step-size controller, adjoint, saves)
are diffrax objects passed as values.
"""

from __future__ import annotations

import diffrax
from jaxtyping import ArrayLike

from ..measures import Gaussian
from ..models.base import AbstractDynamics
from .checkpoint import Checkpoint, solve_checkpointed
from .gaussian import GaussianSolution, solve_gaussian
from .particles import Solution, solve_particles


def solve(
    dynamics: AbstractDynamics,
    x0,
    *,
    t1,
    t0=0.0,
    dt0=None,
    saveat: diffrax.SaveAt | ArrayLike | None = None,
    weights=None,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    throw: bool = True,
    stop_on_nonfinite: bool = True,
    checkpoint: Checkpoint | None = None,
    blowup_threshold=None,
) -> Solution | GaussianSolution:
    """Integrate dx_i/dt = v(t, x_i; μ_t), μ_t = Σ_j w_j δ_{x_j(t)}, from t0 to t1.

    Args:
        dynamics: an attention (tokens in R^d), ``tp.Sphere(attention)``, or any
            :class:`transformer_pde.models.AbstractDynamics`.
        x0: initial tokens ``(n, d)``; or a :class:`~transformer_pde.Gaussian` to integrate the
            moment ODEs of the Gaussian closure (euclidean.md §4), returning a
            :class:`GaussianSolution` (dynamics must be an
            :class:`~transformer_pde.models.AbstractGaussianClosure`).
        t1, t0: time span; t1 > t0 (depth = time).
        dt0: initial (or constant) step. Euler with constant ``dt0`` is a residual
            Transformer with layer step ``dt0``.
        saveat: ``diffrax.SaveAt(ts=..., fn=...)`` or ``diffrax.SaveAt(t1=True, fn=...)``; an
            array of times is short for ``SaveAt(ts=times)`` (default: ``[t1]``). With
            ``fn(t, x, args)`` the statistic is saved instead of the states (large runs need not
            store every state): ``Solution.stats``; ``x`` is on the manifold.
        weights: token weights ``(n,)`` (uniform if None); fixed in time (euclidean.md §1).
        solver: any diffrax solver (default ``diffrax.Tsit5()``).
        stepsize_controller: default constant steps; pass ``diffrax.PIDController(rtol, atol)``
            for adaptive steps.
        adjoint: diffrax adjoint for gradients (default: recursive checkpointing).
        max_steps: step cap (default: exact for constant steps, 100 000 otherwise).
        progress: show a progress bar (diffrax's tqdm meter, updated from inside jit).
        throw: raise if the solve fails; otherwise inspect ``Solution.result``.
        stop_on_nonfinite: stop at the first step whose state holds a NaN or inf (finite-time
            blow-up, too large a step) and report its time: with ``throw`` a
            :class:`~transformer_pde.NonFiniteStateError` naming the time, otherwise
            ``Solution.nonfinite_time`` and ``result == RESULTS.event_occurred``. A
            ``diffrax.Event`` checked after every step; not available with adjoints that
            exclude events (e.g. ``ImplicitAdjoint``), where it is skipped.
        checkpoint: a :class:`~transformer_pde.Checkpoint`: integrate in fixed chunks of save
            intervals, write each finished chunk atomically, and resume a killed run where it
            stopped (particles only; no gradients).
        blowup_threshold: Gaussian closure only: stop when tr Σ exceeds it (default
            ``1e10 · tr Σ0``), reported in ``GaussianSolution.blowup_time``.

    The compiled program depends only on shapes and the static configuration, so repeated
    calls with new values (x0, parameters, t1) do not recompile; ``solve`` works under
    ``jax.vmap`` and ``jax.grad``.
    """
    common = dict(t0=t0, t1=t1, dt0=dt0, saveat=saveat, solver=solver,
                  stepsize_controller=stepsize_controller, max_steps=max_steps, progress=progress,
                  throw=throw)
    if isinstance(x0, Gaussian):
        if weights is not None or checkpoint is not None:
            raise ValueError("weights and checkpoint apply to particles, not to a Gaussian initial state")
        return solve_gaussian(dynamics, x0, adjoint=adjoint, blowup_threshold=blowup_threshold,
                              **common)
    if blowup_threshold is not None:
        raise ValueError("blowup_threshold applies to a Gaussian initial state (tp.Gaussian)")
    if checkpoint is not None:
        if adjoint is not None:
            raise ValueError("a checkpointed solve writes files between chunks and does not support "
                             "gradients (adjoint=...); use tp.solve without checkpoint")
        return solve_checkpointed(dynamics, x0, weights=weights, checkpoint=checkpoint,
                                  stop_on_nonfinite=stop_on_nonfinite, **common)
    return solve_particles(dynamics, x0, weights=weights, adjoint=adjoint,
                           stop_on_nonfinite=stop_on_nonfinite, **common)
