"""The abstract interface every particle dynamics implements, and its capabilities as types.

A dynamics maps a weighted empirical measure μ = Σ_j w_j δ_{x_j} to the velocity of each
token, ``dx_i/dt = v(t, x_i; μ)`` (spec README, "Conventions"). Capabilities are abstract
bases (equinox's abstract/final pattern), asked with ``isinstance``, never ``hasattr``:

- :class:`AbstractManifoldDynamics`: the state lives on a manifold; solvers retract after
  every step (:class:`transformer_pde.solve.Retracted`).
- :class:`AbstractGaussianClosure` (in :mod:`.attention.base`): the field of a Gaussian is
  affine, so Gaussian data stay Gaussian (euclidean.md §4).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax.numpy as jnp

from .._checks import check_points, check_scalar, check_weights, is_concrete
from .._types import Points, PointsLike, Weights, WeightsLike


class AbstractDynamics(eqx.Module):
    """A velocity field for a system of weighted tokens.

    Subclasses implement :meth:`_velocity` (no input checks: it runs inside solvers);
    :meth:`velocity` is the validated public entry point.
    """

    @abc.abstractmethod
    def _velocity(self, x: Points, weights: Weights, t) -> Points:
        """Velocity of every token (unchecked)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int | None:
        """Ambient dimension d, or None when it cannot be known before evaluation."""

    def check_state(self, x, name: str = "x"):
        return check_points(x, name, self.dim)

    def velocity(self, x: PointsLike, weights: WeightsLike | None = None, t=0.0) -> Points:
        """Velocity Γ_μ(x_i) of every token for μ = Σ_j w_j δ_{x_j} (uniform when ``weights`` is None).

        Args:
            x: tokens, shape ``(n, d)``.
            weights: shape ``(n,)``, non-negative, summing to one.
            t: time (matters for time-dependent parameters).
        """
        x = self.check_state(x)
        w = check_weights(weights, x.shape[0], x.dtype)
        check_scalar(t, "t")
        return check_finite_output(self._velocity(x, w, jnp.asarray(t, x.dtype)), self, x.dtype)


def check_finite_output(v, dynamics, dtype):
    """Finite tokens must give a finite velocity: an overflow (scores β⟨Qx, Ky⟩ beyond the range
    of the dtype) is an error naming the cause, concrete or under jit, never a silent NaN."""
    msg = (f"{type(dynamics).__name__}: finite tokens gave a non-finite velocity: the scores overflow "
           f"{jnp.dtype(dtype).name} (tokens or parameters too large for it, e.g. β|x|² beyond "
           f"{float(jnp.finfo(dtype).max):.3g}); rescale, or enable float64")
    if is_concrete(v):
        if not bool(jnp.all(jnp.isfinite(v))):
            raise ValueError(msg)
        return v
    return eqx.error_if(v, ~jnp.all(jnp.isfinite(v)), msg)


class AbstractManifoldDynamics(AbstractDynamics):
    """A dynamics whose state lives on a manifold embedded in R^d.

    :meth:`retract` maps a point near the manifold back onto it; every solver step of
    :func:`transformer_pde.solve` ends with it, and so does every discrete layer.
    """

    @abc.abstractmethod
    def retract(self, x: Points) -> Points:
        """Map a state back to the manifold after a step."""


def retract(dynamics: AbstractDynamics, x: Points) -> Points:
    """``dynamics.retract(x)`` on a manifold, the identity on R^d."""
    return dynamics.retract(x) if isinstance(dynamics, AbstractManifoldDynamics) else x
