"""Where tokens live: R^d (the attention itself) or the unit sphere (layer normalization).

:class:`Sphere` is the projected flow of GLPR; :class:`PostLN` is the post-LN residual layer
x ← N(x + hΓ(x)) of the authors' code, as a dynamics whose Euler step is that layer.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (as_float_array, check_count, check_finite, check_int, check_key, check_points, check_scalar,
                       cover_finiteness, has_unit_rows, is_concrete, is_covered, mark_unit_rows, runtime_check,
                       unit_tolerance)
from .._types import Points, PointsLike
from .base import (
    AbstractDynamics,
    AbstractFieldDynamics,
    AbstractManifoldDynamics,
    AbstractRetractedDynamics,
    AbstractRetraction,
)


def tangent_projection(x: PointsLike, v: PointsLike) -> Points:
    """P⊥_x v = v − ⟨x, v⟩ x, row by row (docs: math/attention.md#conventions): ``x`` and ``v``
    finite arrays of the same shape, rows along the last axis (ValueError naming the bad one;
    ``eqx.error_if`` under jit)."""
    x = check_finite(as_float_array(x, "x"), "x")
    v = check_finite(as_float_array(v, "v"), "v")
    if x.ndim < 1 or v.shape != x.shape:
        raise ValueError(f"v must have the shape of x (one vector per row of x), got x {x.shape} and v {v.shape}")
    return unchecked_tangent_projection(x, v)


def unchecked_tangent_projection(x, v):
    """:func:`tangent_projection` unchecked: the projection inside fields (the hot path)."""
    return v - jnp.sum(x * v, axis=-1, keepdims=True) * x


def unchecked_normalize(x):
    """x / |x| row by row, unchecked: the retraction inside steps (the hot path)."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def normalize(x: PointsLike) -> Points:
    """Radial retraction N(x) = x / |x| (the layer normalization) of tokens ``x`` of shape
    ``(n, d)``: finite, no zero row (ValueError naming x; ``eqx.error_if`` under jit)."""
    x = check_points(x, "x")
    norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
    if is_concrete(norms):
        zero = np.asarray(norms)[:, 0] == 0
        if zero.any():
            raise ValueError(f"x must have no zero row (a zero token has no direction), but x[{int(np.argmax(zero))}] = 0")
    else:
        norms = runtime_check(norms, jnp.any(norms == 0), "x must have no zero row (a zero token has no direction)")
    return mark_unit_rows(x / norms)


TOKEN_RADIUS = 1.25
"""The bound on |x| that :class:`Sphere` and :class:`PostLN` declare to their attention's kernel
(``AbstractDynamics.with_token_radius``; an automatic backend then knows its box): unit tokens,
plus a margin for the stages of a Runge–Kutta step, which leave the sphere (|x|² = 1 + O(h²));
a query beyond it is recomputed exactly by ``Auto``, never wrong. (:class:`Sphere` evaluates its
attention at the retracted stage x/|x|, so its tokens are unit at every stage; the margin is kept
so the automatic kernel's plans, and its choices, do not move.)"""


def _declare_unit_tokens(dynamics):
    if isinstance(dynamics, AbstractDynamics):
        return dynamics.with_token_radius(TOKEN_RADIUS, "tp.Sphere")
    return dynamics


class Sphere(AbstractManifoldDynamics):
    r"""Layer-normalized dynamics on the unit sphere S^{d-1} (docs: math/sphere.md#the-projected-flow):

    $$\dot x_i = P^\perp_{x_i}\,v(x_i;\mu),\qquad P^\perp_x y = y-\langle x,y\rangle x.$$

    ``tp.Sphere(attn)`` wraps any R^d dynamics. Solvers step in R^d and retract with
    x ← x/|x| after each step (a projection method: it keeps the order of the solver), so
    one Euler step is exactly one residual layer followed by layer normalization.

    The tokens' bound (|x| <= :data:`TOKEN_RADIUS`) is declared to the wrapped dynamics, so an
    attention with the automatic kernel backend takes the fast kernel at large n (k <= 3).

    Example:
        ```python
        import jax.numpy as jnp, jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=32, d=3)
        sphere = tp.Sphere(tp.SoftmaxAttention.identity(d=3, beta=1.0))
        v = sphere.velocity(x0)                                 # tangent: (v * x0).sum(-1) is 0 to round-off
        sol = tp.solve(sphere, x0, t1=1.0, dt0=0.1)
        jnp.linalg.norm(sol.xs[-1], axis=-1)                    # 1 for every token
        ```
    """

    dynamics: AbstractDynamics = eqx.field(converter=_declare_unit_tokens)

    def __check_init__(self):
        if not isinstance(self.dynamics, AbstractDynamics):
            raise ValueError(f"Sphere wraps a dynamics such as SoftmaxAttention, got "
                             f"{type(self.dynamics).__name__}")
        if isinstance(self.dynamics, AbstractRetractedDynamics):
            raise ValueError(f"Sphere({type(self.dynamics).__name__}(...)): the dynamics already "
                             "lives on a manifold (it retracts its steps)")

    @property
    def dim(self):
        return self.dynamics.dim

    def vector_field(self, x, weights, t):
        """P⊥_u v(u; μ_u) at u = x/|x|: on the sphere the field; at the stage of a Runge–Kutta or
        SDE step, which leaves the sphere (|x|² = 1 + O(h²), under noise 1 + O(σ²h) with Gaussian
        tails), the field at its retraction (the 0-homogeneous extension). Any smooth tangent
        extension keeps the solver's order (Hairer–Lubich–Wanner §IV.4), and this one shows the
        wrapped attention unit tokens only, so a kernel planned for |x| <= 1
        (``Fast(radius=1)``) holds at every stage."""
        u = unchecked_normalize(x)
        return unchecked_tangent_projection(u, self.dynamics.vector_field(u, weights, t))

    def retract(self, x):
        return unchecked_normalize(x)

    def check_state(self, x, name: str = "x"):
        return check_unit_points(x, name, self.dim)

    @property
    def has_field(self) -> bool:
        """Whether the wrapped dynamics has a field at arbitrary points
        (:class:`~transformer_pde.models.AbstractFieldDynamics`), so this one does too."""
        return isinstance(self.dynamics, AbstractFieldDynamics)

    def _inner_field(self) -> AbstractFieldDynamics:
        if not self.has_field:
            raise ValueError(f"Sphere({type(self.dynamics).__name__}(...)) has no field at arbitrary "
                             "points (a causal attention's depends on positions); a field and its "
                             "divergence need an AbstractFieldDynamics inside")
        return self.dynamics

    def query_field(self, queries, x, weights, t):
        """P⊥_q Γ_μ(q) at unit ``queries`` (needs :attr:`has_field`)."""
        return unchecked_tangent_projection(queries, self._inner_field().query_field(queries, x, weights, t))

    def divergence(self, queries, x, weights, t):
        r"""The surface divergence of F(q) = P⊥_q Γ_μ(q) on S^{d−1} at unit queries, μ fixed:

        $$\operatorname{div}_{S}F(q)=\operatorname{div}\Gamma(q)-q^\top D\Gamma(q)\,q-(d-1)\langle q,\Gamma(q)\rangle$$

        (tr(P⊥ DF) with P⊥q = 0), from the inner field's divergence (its closed form where it has
        one) and one forward-mode derivative along q. The density it transports is w.r.t. the
        surface measure (checked against finite differences of the flow map in
        tests/solvers/test_densities.py)."""
        inner = self._inner_field()
        d = queries.shape[1]

        def one(q):
            field = lambda z: inner.query_field(z[None, :], x, weights, t)[0]  # noqa: E731
            g, dg = jax.jvp(field, (q,), (q,))
            return -q @ dg - (d - 1) * (q @ g)

        return inner.divergence(queries, x, weights, t) + jax.vmap(one)(queries)

    def diffusion(self, x, dB, t):
        """σ P⊥_x ∘ dB (docs: math/noise.md#independent-noise), with P⊥ at x/|x| so that the Stratonovich SDE keeps
        |x| exactly; Euler (Itô) followed by the retraction x/|x| gains the Itô drift
        −(d−1)(σ²/2)x from the normalization, so every solver converges to the spherical
        Brownian motion of generator (σ²/2)Δ_S."""
        return unchecked_tangent_projection(unchecked_normalize(x), dB)

    @property
    def additive_noise(self):
        return False


def check_unit_points(x, name: str, dim):
    """Tokens ``(n, d)`` on the unit sphere S^{d-1}, d >= 2: the norms checked now when concrete,
    through ``eqx.error_if`` when traced, unless the tokens are a normalization's output
    (``mark_unit_rows``: :func:`normalize`, :func:`uniform_sphere`), whose norms are 1 by
    construction."""
    unit = has_unit_rows(x)
    x = check_points(x, name, dim)
    if x.shape[1] < 2:
        raise ValueError(f"{name}: the sphere S^{{d-1}} needs d >= 2, got d={x.shape[1]}")
    tol = unit_tolerance(x.dtype)
    if not is_concrete(x):
        if unit:
            return mark_unit_rows(x)
        dev = jnp.max(jnp.abs(jnp.linalg.norm(x, axis=-1) - 1))
        out = runtime_check(x, dev > tol, f"{name} must lie on the unit sphere (|{name}_i| = 1 within "
                                          f"{tol:.2g}); use tp.normalize({name}) first")
        if is_covered(x):  # the same values: their finiteness is still reported
            cover_finiteness([out])
        return out
    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=-1)
    bad = np.abs(norms - 1) > tol
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must lie on the unit sphere, but |{name}[{i}]| = {norms[i]:.6g}; "
                         f"use tp.normalize({name}) first")
    return x


class PostLN(AbstractManifoldDynamics):
    r"""The post-LN residual layer of the authors' code (docs: math/sphere.md#the-projected-flow):

    x_i ← N(x_i + h Γ_μ(x_i)),  N(x) = x/|x|,

    a residual attention layer followed by layer normalization, with no explicit tangent
    projection. Under ``solve(..., solver=diffrax.Euler(), dt0=h)`` one step is exactly that
    layer. Since N(x + h v) = N(x + h' P⊥_x v) with h' = h/(1 + h⟨x, v⟩), it is a first-order
    scheme for the projected ODE of :class:`Sphere` with a per-token time change of relative
    size O(h); use it with Euler to reproduce published numbers (docs: math/sphere.md#published-runs was
    measured with it).
    """

    dynamics: AbstractDynamics = eqx.field(converter=_declare_unit_tokens)

    def __check_init__(self):
        if isinstance(self.dynamics, AbstractRetractedDynamics) or not isinstance(
                self.dynamics, AbstractDynamics):
            raise ValueError(f"PostLN wraps an R^d dynamics such as SoftmaxAttention, got "
                             f"{type(self.dynamics).__name__}")

    @property
    def dim(self):
        return self.dynamics.dim

    def vector_field(self, x, weights, t):
        # The 1-homogeneous extension |x| Γ(x/|x|): equal to Γ(x) on the sphere (so an Euler step
        # is still exactly the layer), and its radial part drops out of θ = x/|x|, so any solver
        # with the retraction integrates θ' = P⊥Γ(θ) to its own order (the unextended field gives
        # an O(h) error with every solver: 1.1e-2 with Tsit5 at rtol 1e-10, 2e-11 with this one).
        r = jnp.linalg.norm(x, axis=-1, keepdims=True)
        return r * self.dynamics.vector_field(x / r, weights, t)

    def retract(self, x):
        return unchecked_normalize(x)

    def check_state(self, x, name: str = "x"):
        return check_unit_points(x, name, self.dim)


class UnitSphere(AbstractRetraction):
    """The retraction x ← x/|x| alone, for states that are not particle dynamics (SDE paths)."""

    def retract_step(self, x, t0, t1):
        return unchecked_normalize(x)


def uniform_sphere(key, n: int, d: int, dtype=None) -> Points:
    """n i.i.d. points, uniform on S^{d-1} (normalized Gaussians)."""
    n = check_int(n, "n", minimum=1)
    d = check_int(d, "d", minimum=2)
    check_key(key, "key")
    dtype = dtype or jnp.result_type(float)
    return mark_unit_rows(unchecked_normalize(jax.random.normal(key, (n, d), dtype=dtype)))


def cap_sample(key, center, n: int, spread: float) -> Points:
    """n points on S^{d-1} near ``center``: normalize(center + spread · Gaussian)."""
    n = check_count(n, "n", minimum=1)
    spread = check_scalar(spread, "spread", nonnegative=True)
    check_key(key, "key")
    center = check_finite(as_float_array(center, "center"), "center")
    if center.ndim != 1 or center.shape[0] < 2:
        raise ValueError(f"center must be a vector of dimension d >= 2, got shape {center.shape}")
    if is_concrete(center) and not np.any(np.asarray(center)):
        raise ValueError("center must be nonzero (it is normalized onto the sphere)")
    center = center / jnp.linalg.norm(center)
    z = center[None, :] + spread * jax.random.normal(key, (n, center.shape[0]), center.dtype)
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)
