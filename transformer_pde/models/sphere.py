"""Where tokens live: R^d (the attention itself) or the unit sphere (layer normalization).

:class:`Sphere` is the projected flow of GLPR; :class:`PostLN` is the post-LN residual layer
x ← N(x + hΓ(x)) of the authors' code, as a dynamics whose Euler step is that layer.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_int, check_key, check_points, is_concrete
from .._types import Points, PointsLike
from .base import AbstractDynamics, AbstractManifoldDynamics, AbstractRetractedDynamics, AbstractRetraction


def tangent_projection(x: PointsLike, v: PointsLike) -> Points:
    """P⊥_x v = v − ⟨x, v⟩ x, row by row (spec README)."""
    return v - jnp.sum(x * v, axis=-1, keepdims=True) * x


def normalize(x: PointsLike) -> Points:
    """Radial retraction N(x) = x / |x| (the layer normalization)."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


class Sphere(AbstractManifoldDynamics):
    r"""Layer-normalized dynamics on the unit sphere S^{d-1} (sphere.md §1):

    $$\dot x_i = P^\perp_{x_i}\,v(x_i;\mu),\qquad P^\perp_x y = y-\langle x,y\rangle x.$$

    ``tp.Sphere(attn)`` wraps any R^d dynamics. Solvers step in R^d and retract with
    x ← x/|x| after each step (a projection method: it keeps the order of the solver), so
    one Euler step is exactly one residual layer followed by layer normalization.
    """

    dynamics: AbstractDynamics

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
        return tangent_projection(x, self.dynamics.vector_field(x, weights, t))

    def retract(self, x):
        return normalize(x)

    def check_state(self, x, name: str = "x"):
        return check_unit_points(x, name, self.dim)


def unit_tolerance(dtype) -> float:
    """How far |x| may be from 1 for unit tokens of ``dtype``: 1e-6 in float64, 1e-3 in float32,
    8 machine epsilons in half precision (7.8e-3 float16, 6.3e-2 bfloat16)."""
    eps = float(jnp.finfo(dtype).eps)
    return 1e-6 if eps < 1e-10 else max(1e-3, 8 * eps)


def check_unit_points(x, name: str, dim):
    """Tokens ``(n, d)`` on the unit sphere S^{d-1}, d >= 2 (the norms are checked when concrete)."""
    x = check_points(x, name, dim)
    if x.shape[1] < 2:
        raise ValueError(f"{name}: the sphere S^{{d-1}} needs d >= 2, got d={x.shape[1]}")
    tol = unit_tolerance(x.dtype)
    if not is_concrete(x):
        dev = jnp.max(jnp.abs(jnp.linalg.norm(x, axis=-1) - 1))
        return eqx.error_if(x, dev > tol, f"{name} must lie on the unit sphere (|{name}_i| = 1 within "
                                          f"{tol:.2g}); use tp.normalize({name}) first")
    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=-1)
    bad = np.abs(norms - 1) > tol
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must lie on the unit sphere, but |{name}[{i}]| = {norms[i]:.6g}; "
                         f"use tp.normalize({name}) first")
    return x


class PostLN(AbstractManifoldDynamics):
    r"""The post-LN residual layer of the authors' code (sphere.md §9, first row):

    x_i ← N(x_i + h Γ_μ(x_i)),  N(x) = x/|x|,

    a residual attention layer followed by layer normalization, with no explicit tangent
    projection. Under ``solve(..., solver=diffrax.Euler(), dt0=h)`` one step is exactly that
    layer. Since N(x + h v) = N(x + h' P⊥_x v) with h' = h/(1 + h⟨x, v⟩), it is a first-order
    scheme for the projected ODE of :class:`Sphere` with a per-token time change of relative
    size O(h); use it with Euler to reproduce published numbers (sphere.md §10.4 was
    measured with it).
    """

    dynamics: AbstractDynamics

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
        return normalize(x)

    def check_state(self, x, name: str = "x"):
        return check_unit_points(x, name, self.dim)


class UnitSphere(AbstractRetraction):
    """The retraction x ← x/|x| alone, for states that are not particle dynamics (SDE paths)."""

    def retract_step(self, x, t0, t1):
        return normalize(x)


def uniform_sphere(key, n: int, d: int, dtype=None) -> Points:
    """n i.i.d. points, uniform on S^{d-1} (normalized Gaussians)."""
    n = check_int(n, "n", minimum=1)
    d = check_int(d, "d", minimum=2)
    check_key(key, "key")
    dtype = dtype or jnp.result_type(float)
    return normalize(jax.random.normal(key, (n, d), dtype=dtype))


def cap_sample(key, center, n: int, spread: float) -> Points:
    """n points on S^{d-1} near ``center``: normalize(center + spread · Gaussian)."""
    center = jnp.asarray(center)
    center = center / jnp.linalg.norm(center)
    z = center[None, :] + spread * jax.random.normal(key, (n, center.shape[0]), center.dtype)
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)
