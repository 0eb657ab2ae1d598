"""The abstract interface every particle dynamics implements, and its capabilities as types.

A dynamics maps a weighted empirical measure μ = Σ_j w_j δ_{x_j} to the velocity of each
token, ``dx_i/dt = v(t, x_i; μ)`` (docs: math/attention.md#conventions). Capabilities are abstract
bases (equinox's abstract/final pattern), asked with ``isinstance``, never ``hasattr``:

- :class:`AbstractRetractedDynamics`: every solver step (and every discrete layer) ends with a
  retraction, which may depend on the step (:class:`transformer_pde.Retracted`); Mix-LN's
  retraction switches off at a time.
- :class:`AbstractManifoldDynamics`: the state lives on a manifold; the retraction onto it does
  not depend on time.
- :class:`AbstractFieldDynamics`: token i moves with a field of the token measure evaluated at
  x_i, defined at every point (``query_field``), so it has a divergence in x with μ held fixed
  (:meth:`AbstractFieldDynamics.divergence`: autodiff by default, closed forms where they exist):
  what a density carried along characteristics needs (docs: math/mean_field.md#densities-along-characteristics).
- :class:`AbstractGaussianClosure` (in :mod:`.attention.base`): the field of a Gaussian is
  affine, so Gaussian data stay Gaussian (docs: math/gaussian.md#moment-equations).

A model of *common* noise, one Brownian motion W shared by every token (random heads, random
weight matrices), is an :class:`AbstractCommonDiffusion`: how an increment dW moves the tokens;
``tp.CommonNoise`` (:mod:`transformer_pde.solvers.noise`) integrates it.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_points, check_scalar, check_weights, is_concrete, runtime_check
from .._types import Points, PointsLike, Weights, WeightsLike


class AbstractDynamics(eqx.Module):
    """A velocity field for a system of weighted tokens.

    Subclasses implement :meth:`vector_field`, the unchecked velocity that solvers evaluate;
    :meth:`velocity` is the validated public entry point.
    """

    @abc.abstractmethod
    def vector_field(self, x: Points, weights: Weights, t) -> Points:
        """Velocity of every token (unchecked)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int | None:
        """Ambient dimension d, or None when it cannot be known before evaluation."""

    def check_state(self, x, name: str = "x"):
        return check_points(x, name, self.dim)

    def with_token_radius(self, r: float, who: str) -> AbstractDynamics:
        """This dynamics where ``who`` (a wrapper such as ``tp.Sphere``) guarantees that it is
        evaluated only at tokens and queries with |x| <= ``r``: a kernel attention whose backend
        declared no bound takes it (its automatic kernel choice may then plan the fast kernel).
        Unchanged by default."""
        return self

    def diffusion(self, x: Points, dB: Points, t) -> Points:
        """How an independent Brownian increment dB (unit σ, one row per token) moves the tokens
        (docs: math/noise.md#independent-noise): additive, dB itself, for tokens in R^d and for every dynamics whose
        retraction ends the step (the noisy layer x ← R(x + hF + σ√h ξ)). :class:`Sphere`
        projects it (P⊥_x ∘ dB, Stratonovich)."""
        return dB

    @property
    def additive_noise(self) -> bool:
        """Whether :meth:`diffusion` is independent of the tokens (solvers for additive noise
        only, such as ``diffrax.ShARK``, then apply)."""
        return True

    def check_time(self, t, name: str = "t"):
        """A time at which the field is defined: a finite scalar (ValueError naming ``name``,
        ``eqx.error_if`` under jit). A dynamics defined on part of the line refuses the rest,
        naming why (:class:`~transformer_pde.LNScaling`: from its first layer on). ``velocity``,
        ``tp.solve`` and ``tp.layers`` check their start time here."""
        return check_scalar(t, name)

    def velocity(self, x: PointsLike, weights: WeightsLike | None = None, t=0.0) -> Points:
        """Velocity Γ_μ(x_i) of every token for μ = Σ_j w_j δ_{x_j} (uniform when ``weights`` is None).

        Args:
            x: tokens, shape ``(n, d)``.
            weights: shape ``(n,)``, non-negative, summing to one.
            t: time (matters for time-dependent parameters).
        """
        x = self.check_state(x)
        w = check_weights(weights, x.shape[0], x.dtype)
        t = self.check_time(t)  # under jit its check is the returned value's
        return check_finite_output(self.vector_field(x, w, jnp.asarray(t, x.dtype)), self, x.dtype, x)


def _nonfinite_parameters(dynamics) -> list[str]:
    """The paths of the dynamics' floating parameters that hold a NaN or inf (concrete ones)."""
    leaves = jax.tree_util.tree_flatten_with_path(eqx.filter(dynamics, eqx.is_inexact_array))[0]
    return [jax.tree_util.keystr(path) for path, leaf in leaves
            if is_concrete(leaf) and not bool(jnp.all(jnp.isfinite(leaf)))]


def check_finite_output(v, dynamics, dtype, x=None):
    """Finite tokens must give a finite velocity: an error, concrete or under jit, never a silent
    NaN. The message states what was checked, and names a cause only when it was found: a
    non-finite parameter (its path), or the size of the tokens against the dtype's range."""
    name = type(dynamics).__name__
    if is_concrete(v):
        bad = ~np.isfinite(np.asarray(v))
        if not bad.any():
            return v
        i = int(np.argwhere(bad)[0][0])
        found = []
        params = _nonfinite_parameters(dynamics)
        if params:
            found.append(f"the parameter(s) {', '.join(params)} hold NaN or inf")
        if x is not None and is_concrete(x):
            r2 = float(np.max(np.sum(np.asarray(x, np.float64) ** 2, axis=-1)))
            if r2 > np.sqrt(float(jnp.finfo(dtype).max)):
                found.append(f"the largest |x|² = {r2:.3g} is near the range of {jnp.dtype(dtype).name} "
                             f"(scores ~ β|x|² may overflow): rescale, or enable float64")
        cause = ("; ".join(found) if found else
                 "no non-finite parameter and no token too large for the dtype was found: the field "
                 "itself produced it (a zero token under a normalization, an activation returning NaN, "
                 "...); jax.config.update('jax_debug_nans', True) locates the operation")
        raise ValueError(f"{name}: finite tokens gave a non-finite velocity (first at token {i}): {cause}")
    params = eqx.filter(dynamics, eqx.is_inexact_array)
    bad_params = jnp.asarray(False)
    for leaf in jax.tree_util.tree_leaves(params):
        bad_params = bad_params | ~jnp.all(jnp.isfinite(leaf))
    v = runtime_check(v, bad_params, f"{name}: a parameter holds NaN or inf, so the velocity is not finite")
    if x is not None:
        large = jnp.max(jnp.sum(jnp.asarray(x) ** 2, axis=-1)) > jnp.sqrt(jnp.finfo(dtype).max)
        v = runtime_check(v, large & ~jnp.all(jnp.isfinite(v)),
                          f"{name}: finite tokens gave a non-finite velocity: the largest |x|² is near the "
                          f"range of {jnp.dtype(dtype).name} (scores ~ β|x|² may overflow): rescale, or "
                          f"enable float64")
    return runtime_check(v, ~jnp.all(jnp.isfinite(v)),
                         f"{name}: finite tokens gave a non-finite velocity (under jit: call it outside "
                         f"jit for a diagnosis of the parameters and token sizes)")


class AbstractFieldDynamics(AbstractDynamics):
    r"""The velocity of token i is a field of the token measure at x_i, v_i = F_μ(t, x_i), and
    F_μ(t, ·) is defined at every point (position-free attentions, token-wise MLPs).

    Its divergence in x with μ held fixed is what the density of the mean field obeys along
    characteristics, d/dt log ρ(t, X_t) = −div F_{μ_t}(t, X_t)
    (docs: math/mean_field.md#densities-along-characteristics; the instantaneous change of variables of continuous
    normalizing flows, Chen et al., arXiv 1806.07366).
    """

    @abc.abstractmethod
    def query_field(self, queries, x, weights, t, query_offset=0):
        """F_μ(t, queries) for μ = Σ_j w_j δ_{x_j}, shape ``(m, d)`` (unchecked)."""

    def vector_field(self, x, weights, t):
        return self.query_field(x, x, weights, t)

    def divergence(self, queries, x, weights, t):
        """div_q F_μ(t, q) at every query, μ held fixed, shape ``(m,)`` (unchecked).

        Default: the trace of the Jacobian by forward-mode autodiff, one query at a time (d
        tangents each); subclasses with a closed form override it."""
        def one(q):
            jac = jax.jacfwd(lambda z: self.query_field(z[None, :], x, weights, t)[0])(q)
            return jnp.trace(jac)

        return jax.vmap(one)(queries)


class AbstractRetraction(eqx.Module):
    """A map that ends every solver step: ``retract_step(y, t0, t1)`` for the step [t0, t1]
    (:class:`transformer_pde.Retracted` wraps a diffrax solver with one)."""

    @abc.abstractmethod
    def retract_step(self, x, t0, t1):
        """The retraction that ends the step [t0, t1]."""


class AbstractRetractedDynamics(AbstractDynamics, AbstractRetraction):
    """A dynamics whose every step ends with a retraction R_[t0, t1] that may depend on the step.

    One discrete layer is ``x ← R_[t_l, t_l + h](x + h v(t_l, x))`` (:func:`transformer_pde.layers`);
    :func:`transformer_pde.solve` wraps the solver in :class:`transformer_pde.Retracted` and maps
    saved (interpolated) states with :meth:`retract_at`. Where the dynamics changes
    (:attr:`switch_times`) ``solve`` steps to just before the switch and on from just after it,
    so no step straddles it.
    """

    @abc.abstractmethod
    def retract_step(self, x: Points, t0, t1) -> Points:
        """The retraction that ends the step [t0, t1]."""

    @abc.abstractmethod
    def retract_at(self, x: Points, t) -> Points:
        """Map a state saved at time t (dense output between steps) back where states live."""

    @property
    def switch_times(self) -> tuple[float, ...]:
        """Times at which the dynamics changes (no step straddles them)."""
        return ()

    def step_velocity(self, x: Points, weights: Weights, t0, t1) -> Points:
        """The field of the discrete layer [t0, t1] (evaluated at t0): ``vector_field`` at t0,
        unless the dynamics changes within the step's time (a switched dynamics)."""
        return self.vector_field(x, weights, t0)


class AbstractManifoldDynamics(AbstractRetractedDynamics):
    """A dynamics whose state lives on a manifold embedded in R^d.

    :meth:`retract` maps a point near the manifold back onto it; every solver step of
    :func:`transformer_pde.solve` ends with it, and so does every discrete layer.
    """

    @abc.abstractmethod
    def retract(self, x: Points) -> Points:
        """Map a state back to the manifold after a step."""

    def retract_step(self, x: Points, t0, t1) -> Points:
        return self.retract(x)

    def retract_at(self, x: Points, t) -> Points:
        return self.retract(x)


def retract(dynamics: AbstractDynamics, x: Points) -> Points:
    """``dynamics.retract(x)`` on a manifold, the identity on R^d."""
    return dynamics.retract(x) if isinstance(dynamics, AbstractManifoldDynamics) else x


def retract_step(dynamics: AbstractDynamics, x: Points, t0, t1) -> Points:
    """The retraction ending the step [t0, t1] of a retracted dynamics; the identity otherwise."""
    return dynamics.retract_step(x, t0, t1) if isinstance(dynamics, AbstractRetractedDynamics) else x


def step_velocity(dynamics: AbstractDynamics, x: Points, weights: Weights, t0, t1) -> Points:
    """The field of the discrete layer [t0, t1]: ``dynamics.vector_field(x, weights, t0)``, or the
    retracted dynamics' own choice (:meth:`AbstractRetractedDynamics.step_velocity`)."""
    if isinstance(dynamics, AbstractRetractedDynamics):
        return dynamics.step_velocity(x, weights, t0, t1)
    return dynamics.vector_field(x, weights, t0)


def retract_at(dynamics: AbstractDynamics, x: Points, t) -> Points:
    """A state saved at time t, mapped where the dynamics' states live; the identity on R^d."""
    return dynamics.retract_at(x, t) if isinstance(dynamics, AbstractRetractedDynamics) else x


class AbstractCommonDiffusion(eqx.Module):
    r"""The coefficient of common noise, dx_i = ... + g(X)_i dW + a(X)_i dt, with one Brownian
    motion W shared by every token (docs: math/noise.md#common-noise): the noise of random weights,
    which moves all tokens at once. ``tp.solve(dynamics, x0, noise=tp.CommonNoise(g), key=key)``
    integrates it; the dynamics is the drift."""

    @abc.abstractmethod
    def brownian_shape(self, x: Points) -> jax.ShapeDtypeStruct:
        """The shape and dtype of W for tokens ``x`` (one W for the whole system)."""

    @abc.abstractmethod
    def diffusion(self, x: Points, dW, t) -> Points:
        """g(X) dW: how an increment dW of W moves every token, linear in dW (unchecked)."""

    def drift(self, x: Points, t) -> Points | None:
        """a(X): the deterministic drift that comes with the noise (an Itô correction), or None."""
        return None
