"""The abstract interface every particle dynamics implements.

A dynamics maps a weighted empirical measure μ = Σ_j w_j δ_{x_j} to the velocity of each
token, ``dx_i/dt = v(t, x_i; μ)`` (spec README, "Conventions"). Attention variants act on
R^d; :class:`~transformer_pde.Sphere` wraps any dynamics with the tangent projection.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax.numpy as jnp

from ._checks import check_points, check_scalar, check_weights
from ._types import Points, Weights


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

    def retract(self, x: Points) -> Points:
        """Map a state back to the manifold after a step (identity on R^d)."""
        return x

    def check_state(self, x, name: str = "x"):
        return check_points(x, name, self.dim)

    def velocity(self, x: Points, weights: Weights | None = None, t=0.0) -> Points:
        """Velocity Γ_μ(x_i) of every token for μ = Σ_j w_j δ_{x_j} (uniform when ``weights`` is None).

        Args:
            x: tokens, shape ``(n, d)``.
            weights: shape ``(n,)``, non-negative, summing to one.
            t: time (matters for time-dependent parameters).
        """
        x = self.check_state(x)
        w = check_weights(weights, x.shape[0], x.dtype)
        check_scalar(t, "t")
        return self._velocity(x, w, jnp.asarray(t, x.dtype))
