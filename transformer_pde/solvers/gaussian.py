"""Integration of the Gaussian closure: the moment ODEs for (mean, covariance) (euclidean.md §4–5).

Softmax and multi-head closures are Riccati equations, Σ' = VΣAΣ + (·)ᵀ, which can blow up
in finite time (euclidean.md §5.1: t* = 1/λmax(Σ0^{1/2}(A+Aᵀ)Σ0^{1/2}) for V = I). The solve
therefore carries a diffrax ``Event`` that stops it as soon as tr Σ exceeds a threshold (or
stops being finite), and reports that time instead of returning NaNs.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar, is_concrete
from ..measures import Gaussian
from ..models.attention.base import AbstractGaussianClosure
from ..models.base import AbstractDynamics
from .core import as_time, check_times, default_max_steps, integrate, parse_saveat

DEFAULT_BLOWUP_FACTOR = 1e10


def default_blowup_factor(dtype) -> float:
    """tr Σ / tr Σ0 that counts as a blow-up: 1e10 in float64; in lower precision the largest
    growth the time grid can still resolve, 1e-3/eps (8.4e3 in float32). Near a Riccati pole
    Σ ~ 1/(t* − t), and t* − t cannot go below eps·t*: a larger threshold is never reached, the
    adaptive steps shrink to nothing and the solve ends on max_steps instead of the blow-up."""
    return float(min(DEFAULT_BLOWUP_FACTOR, 1e-3 / float(jnp.finfo(dtype).eps)))
"""Default threshold: the solve stops once tr Σ > 1e10 · tr Σ0."""


class GaussianSolution(eqx.Module):
    """Result of :func:`solve` for a Gaussian initial state N(mean, cov).

    Attributes:
        ts: the requested save times ``(T,)``.
        means: ``(T, d)``; covs: ``(T, d, d)``, exactly symmetric. Entries at times after
            ``blowup_time`` are ``inf`` (the covariance has left every bounded set).
        blowup_time: the first time at which tr Σ exceeded ``threshold`` (or stopped being
            finite); ``inf`` when it stayed below up to t1. For a Riccati blow-up
            (softmax, multi-head) this is t* up to O(1/threshold) with adaptive steps, up
            to about one step with constant steps.
        final_time, final_mean, final_cov: the state where the integration stopped (t1, or
            the time the threshold was crossed).
        threshold: the trace threshold used.
        num_steps: accepted solver steps.
        result: diffrax's result code (``RESULTS.event_occurred`` after a blow-up).
    """

    ts: jax.Array
    means: jax.Array
    covs: jax.Array
    blowup_time: jax.Array
    final_time: jax.Array
    final_mean: jax.Array
    final_cov: jax.Array
    threshold: jax.Array
    num_steps: jax.Array
    result: diffrax.RESULTS

    @property
    def blew_up(self):
        """True when tr Σ crossed the threshold before t1."""
        return jnp.isfinite(self.blowup_time)

    @property
    def reached(self):
        """Mask ``(T,)`` of the save times reached before the solve stopped."""
        return (self.ts <= self.final_time) & jnp.all(jnp.isfinite(self.covs), axis=(1, 2))

    @property
    def succeeded(self):
        return (self.result == diffrax.RESULTS.successful) | (
            self.result == diffrax.RESULTS.event_occurred)


def solve_gaussian(dynamics, g0: Gaussian, *, t1, t0=0.0, dt0=None, saveat=None, solver=None,
                   stepsize_controller=None, adjoint=None, max_steps=None, progress=False,
                   throw=True, blowup_threshold=None) -> GaussianSolution:
    """Integrate the moment ODEs of the Gaussian closure from N(mean0, cov0) (euclidean.md §4).

    ``tp.solve(attn, tp.Gaussian(mean, cov), ...)`` calls this; call it directly to set
    ``blowup_threshold`` (absolute threshold on tr Σ; default ``1e10 · tr Σ0`` in float64,
    :func:`default_blowup_factor` in lower precision).
    The other arguments are those of :func:`transformer_pde.solve`. For an accurate
    blow-up time pass an adaptive ``stepsize_controller=diffrax.PIDController(...)``: the
    steps then shrink towards the pole.

    Raises:
        NotImplementedError: the dynamics has no Gaussian closure (sigmoid, unnormalized,
            causal attention, the sphere), with the reason.
    """
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be an attention, got {type(dynamics).__name__}")
    if not isinstance(g0, Gaussian):
        raise ValueError(f"g0 must be a tp.Gaussian, got {type(g0).__name__}")
    if not isinstance(dynamics, AbstractGaussianClosure):
        raise NotImplementedError(
            f"{type(dynamics).__name__} has no Gaussian closure: its field of a Gaussian is not "
            "affine in x (sigmoid and unnormalized attention), or tokens live on the sphere, where "
            "no Gaussian on R^d is a state and the tangent projection makes the field non-affine "
            "(euclidean.md §4 needs an affine field)")
    dtype = g0.mean.dtype
    if dynamics.dim is not None and g0.dim != dynamics.dim:
        raise ValueError(f"Gaussian has dimension {g0.dim} but the dynamics act on d={dynamics.dim}")
    # raise the "no closure" error now, with its reason, rather than inside tracing
    jax.eval_shape(dynamics.gaussian_velocity, g0.mean, g0.cov, jnp.zeros((), dtype))
    save_ts, fn = parse_saveat(saveat)
    if fn is not None:
        raise ValueError("SaveAt(fn=...) statistics apply to particles; a Gaussian solve saves "
                         "the moments (means, covs)")
    ts = check_times(t0, t1, dt0, save_ts, dtype)
    solver = diffrax.Tsit5() if solver is None else solver
    controller = diffrax.ConstantStepSize() if stepsize_controller is None else stepsize_controller
    if dt0 is None and isinstance(controller, diffrax.ConstantStepSize):
        raise ValueError("dt0 is required with constant step sizes (pass dt0=..., or an adaptive "
                         "stepsize_controller such as diffrax.PIDController)")
    if max_steps is None:
        max_steps = default_max_steps(t0, t1, dt0, controller)
    if blowup_threshold is None:
        threshold = default_blowup_factor(dtype) * jnp.trace(g0.cov)
    else:
        check_scalar(blowup_threshold, "blowup_threshold", positive=True)
        threshold = jnp.asarray(blowup_threshold, dtype)
        if is_concrete(threshold) and is_concrete(g0.cov) and not (
                float(threshold) > float(np.trace(np.asarray(g0.cov)))):
            raise ValueError(f"blowup_threshold={float(threshold)} must exceed tr Σ0 = "
                             f"{float(np.trace(np.asarray(g0.cov)))}")
    return _solve_moments(dynamics, g0.mean, g0.cov, as_time(t0, "t0", dtype),
                          as_time(t1, "t1", dtype), None if dt0 is None else jnp.asarray(dt0, dtype),
                          ts, threshold.astype(dtype), solver, controller,
                          adjoint or diffrax.RecursiveCheckpointAdjoint(), int(max_steps),
                          bool(progress), bool(throw))


@eqx.filter_jit
def _solve_moments(dynamics, mean, cov, t0, t1, dt0, ts, threshold, solver, controller, adjoint,
                   max_steps, progress, throw):
    def rhs(t, y, args):
        m, c = y
        dm, dc = dynamics.gaussian_velocity(m, c, t)
        # the state's dtype rules (float32 moments with float64 parameters stay float32)
        return dm.astype(m.dtype), dc.astype(c.dtype)

    def exceeded(t, y, args, **kwargs):
        tr = jnp.trace(y[1])
        # `~(tr <= threshold)` is also true for NaN: a step that overflowed stops the solve too
        return ~(tr <= threshold) | ~jnp.all(jnp.isfinite(y[0]))

    sol = integrate(diffrax.ODETerm(rhs), solver, t0, t1, dt0, (mean, cov),
                    saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)]),
                    stepsize_controller=controller, adjoint=adjoint, max_steps=max_steps, throw=throw,
                    progress=progress, event=diffrax.Event(exceeded))
    (means, covs), (final_mean, final_cov) = sol.ys
    event = sol.result == diffrax.RESULTS.event_occurred
    final_time = sol.ts[1][0]
    # diffrax marks save times after the stop with inf; a save inside a final step that
    # overflowed is interpolated from non-finite values: mark those inf as well.
    bad = ~(jnp.all(jnp.isfinite(covs), axis=(1, 2)) & jnp.all(jnp.isfinite(means), axis=1))
    means = jnp.where(bad[:, None], jnp.inf, means)
    covs = jnp.where(bad[:, None, None], jnp.inf, covs)
    return GaussianSolution(
        ts=ts, means=means, covs=covs,
        blowup_time=jnp.where(event, final_time, jnp.inf).astype(ts.dtype),
        final_time=final_time, final_mean=final_mean[0], final_cov=final_cov[0],
        threshold=threshold,
        num_steps=sol.stats["num_accepted_steps"], result=sol.result)
