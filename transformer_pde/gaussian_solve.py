"""Integration of the Gaussian closure: the moment ODEs for (mean, covariance)."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .measures import Gaussian


class GaussianSolution(eqx.Module):
    """Result of :func:`solve` for a Gaussian initial state.

    Attributes:
        ts: save times ``(T,)``; means ``(T, d)``; covs ``(T, d, d)``.
        result: diffrax's result code.
    """

    ts: jax.Array
    means: jax.Array
    covs: jax.Array
    num_steps: jax.Array
    result: diffrax.RESULTS


def solve_gaussian(dynamics, g0: Gaussian, *, t0, t1, dt0, saveat, solver, stepsize_controller,
                   adjoint, max_steps, progress, throw) -> GaussianSolution:
    from .solve import _as_time, _check_times, _default_max_steps

    dtype = g0.mean.dtype
    if g0.dim != dynamics.dim and dynamics.dim is not None:
        raise ValueError(f"Gaussian has dimension {g0.dim} but the dynamics act on d={dynamics.dim}")
    # raises the "no closure" error early, before tracing
    jax.eval_shape(dynamics.gaussian_velocity, g0.mean, g0.cov, jnp.zeros((), dtype))
    ts = _check_times(t0, t1, dt0, saveat, dtype)
    solver = diffrax.Tsit5() if solver is None else solver
    controller = diffrax.ConstantStepSize() if stepsize_controller is None else stepsize_controller
    if dt0 is None and isinstance(controller, diffrax.ConstantStepSize):
        raise ValueError("dt0 is required with constant step sizes")
    if max_steps is None:
        max_steps = _default_max_steps(t0, t1, dt0, controller)
    return _solve_moments(dynamics, g0.mean, g0.cov, _as_time(t0, "t0", dtype),
                          _as_time(t1, "t1", dtype), None if dt0 is None else jnp.asarray(dt0, dtype),
                          ts, solver, controller, adjoint or diffrax.RecursiveCheckpointAdjoint(),
                          int(max_steps), bool(progress), bool(throw))


@eqx.filter_jit
def _solve_moments(dynamics, mean, cov, t0, t1, dt0, ts, solver, controller, adjoint, max_steps,
                   progress, throw):
    def rhs(t, y, args):
        m, c = y
        return dynamics.gaussian_velocity(m, c, t)

    meter = diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter()
    sol = diffrax.diffeqsolve(diffrax.ODETerm(rhs), solver, t0, t1, dt0, (mean, cov),
                              saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller,
                              adjoint=adjoint, max_steps=max_steps, throw=throw,
                              progress_meter=meter)
    means, covs = sol.ys
    return GaussianSolution(ts=sol.ts, means=means, covs=covs,
                            num_steps=sol.stats["num_accepted_steps"], result=sol.result)
