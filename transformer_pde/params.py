"""Time-dependent parameters: different weights per layer (docs: math/attention.md#conventions).

A parameter is a fixed array, any callable ``t -> array``, or a :class:`PiecewiseConstant`
stack of per-layer values. Every formula of the docs then holds pointwise in t
(docs: math/attention.md#conventions).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import as_float_array, check_finite, check_scalar, is_concrete

# Only where t0 or dt is traced (no exact boundaries): a time within 1e-4 of a layer below its
# boundary selects the next layer, so rounded boundary times t0 + l*dt select layer l.
_BOUNDARY_SLACK = 1e-4


def _checked_values(values):
    """Per-layer values: a leading layer axis of length >= 1, finite (ValueError naming them;
    traced, through eqx.error_if on the returned values). Concrete values are stored as a JAX
    array: a NumPy array indexed by a traced layer (inside a jitted solve) would fail."""
    if jnp.ndim(values) < 1 or jnp.shape(values)[0] < 1:
        raise ValueError(f"PiecewiseConstant.values must have a leading layer axis of length >= 1, "
                         f"got shape {jnp.shape(values)}")
    if is_concrete(values):
        values = as_float_array(values, "PiecewiseConstant.values")
        check_finite(values, "PiecewiseConstant.values")
        return values
    return check_finite(values, "PiecewiseConstant.values")


class PiecewiseConstant(eqx.Module):
    """Per-layer parameters: ``values[l]`` on ``[t0 + l*dt, t0 + (l+1)*dt)``.

    Times before ``t0`` use the first layer, times after the last layer use the last one.
    One explicit Euler step of size ``dt`` per layer is then exactly a Transformer whose
    layer ``l`` has weights ``values[l]``.

    The boundaries b_l = t0 + l·dt are the floats :meth:`boundaries` computes in the time's
    dtype, and the layer is exactly right-continuous there: b_l selects layer l, the float below
    it layer l − 1. :func:`transformer_pde.solve` steps to just below every b_l and on from just
    above it (:attr:`switch_times`), so every stage of a step, its c = 1 stage included, sees the
    step's own layer and a solver of any order keeps its order (with the next layer at the
    step's end, Heun was first order). With a traced ``t0`` or ``dt`` the boundaries are not
    known before the solve: times within 1e-4·dt below b_l then select layer l.
    """

    # the converters check each value (traced: they keep the eqx.error_if'd value)
    values: Float[ArrayLike, "L ..."] = eqx.field(converter=lambda v: _checked_values(v))
    t0: float | Float[Array, ""] = eqx.field(default=0.0,
                                             converter=lambda v: check_scalar(v, "PiecewiseConstant.t0"))
    dt: float | Float[Array, ""] = eqx.field(
        default=1.0, converter=lambda v: check_scalar(v, "PiecewiseConstant.dt", positive=True))

    @property
    def num_layers(self) -> int:
        return self.values.shape[0]

    @property
    def exact_boundaries(self) -> bool:
        """Whether ``t0`` and ``dt`` are concrete (the boundaries are known floats)."""
        return is_concrete(self.t0) and is_concrete(self.dt)

    def boundaries(self, dtype) -> np.ndarray:
        """The interior layer boundaries t0 + l·dt, l = 1..L−1, as floats of ``dtype`` (each
        operation rounded in that dtype, the same floats in every call); needs concrete t0, dt."""
        dtype = np.dtype(dtype)
        t0, dt = np.asarray(self.t0, dtype), np.asarray(self.dt, dtype)
        return (t0 + dt * np.arange(1, self.num_layers).astype(dtype)).astype(dtype)

    @property
    def switch_times(self) -> tuple[float, ...]:
        """The boundaries (float64) where the parameter changes; () with traced t0 or dt."""
        return tuple(float(b) for b in self.boundaries(np.float64)) if self.exact_boundaries else ()

    def __call__(self, t):
        t = jnp.asarray(t)
        dtype = t.dtype if jnp.issubdtype(t.dtype, jnp.floating) else jnp.result_type(float)
        if self.exact_boundaries:
            idx = jnp.searchsorted(jnp.asarray(self.boundaries(dtype)), t.astype(dtype), side="right")
        else:
            pos = (t - self.t0) / self.dt + _BOUNDARY_SLACK
            idx = jnp.floor(pos).astype(jnp.int32)
        return self.values[jnp.clip(idx, 0, self.num_layers - 1)]


def evaluate(param, t):
    """The value of a parameter at time ``t``."""
    return param(t) if callable(param) else param


def param_shape(param) -> tuple[int, ...]:
    """Shape of the parameter's value (evaluated abstractly for callables)."""
    if isinstance(param, PiecewiseConstant):
        return tuple(param.values.shape[1:])
    if callable(param):
        return tuple(jax.eval_shape(param, jnp.zeros(())).shape)
    return tuple(jnp.shape(param))


def as_param(param, name: str):
    """Normalize a user parameter: arrays become finite float arrays; callables pass through."""
    if isinstance(param, PiecewiseConstant):
        check_finite(param.values, name)
        return param
    if callable(param):
        return param
    arr = as_float_array(param, name)
    return check_finite(arr, name)


def scalar_param(value, name: str = "parameter"):
    """A scalar parameter as a JAX array leaf (so jit does not recompile per value and grad
    reaches it). Python numbers stay weakly typed: float32 tokens keep float32 arithmetic.

    A value that is finite as given but overflows the stored dtype (β = 1e39 in float32) is an
    error here, not an inf that turns every velocity into NaN later."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = jnp.asarray(float(value))
    else:
        out = jnp.asarray(value)
        out = out if jnp.issubdtype(out.dtype, jnp.floating) else out.astype(float)
    if is_concrete(out) and np.isfinite(np.asarray(value, dtype=np.float64)).all() and not bool(
            jnp.all(jnp.isfinite(out))):
        raise ValueError(f"{name}={value!r} overflows {out.dtype} (max {float(jnp.finfo(out.dtype).max):.3g}); "
                         "enable float64 (jax_enable_x64) or rescale")
    return out


def matrix_dim(param) -> int:
    """The number of columns of a matrix parameter (d for V: R^d -> R^d)."""
    return param_shape(param)[-1]


def bilinear_params(cls_name: str, Q, K, V, beta):
    """The checked (Q, K, V, beta) of a bilinear-score attention: Q, K (k, d); V (d, d); beta a
    scalar (:func:`scalar_param`)."""
    # one array given twice (Q = K = V = I) is checked once: under jit each check is a runtime
    # callback (keyed by id: the given arrays stay alive here)
    checked = {}

    def once(param, name):
        if id(param) not in checked:
            checked[id(param)] = as_param(param, f"{cls_name}.{name}")
        return checked[id(param)]

    Q, K, V = once(Q, "Q"), once(K, "K"), once(V, "V")
    sq, sk, sv = param_shape(Q), param_shape(K), param_shape(V)
    if len(sq) != 2 or sq != sk:
        raise ValueError(f"{cls_name}: Q and K must both have shape (k, d), got Q {sq} and K {sk}")
    d = sq[1]
    if sv != (d, d):
        raise ValueError(f"{cls_name}: V must be square with shape ({d}, {d}) to match Q, K of shape "
                         f"{sq}, got V {sv}")
    beta = check_scalar(beta, f"{cls_name}.beta")
    return Q, K, V, scalar_param(beta, f"{cls_name}.beta")


__all__ = ["PiecewiseConstant", "as_param", "bilinear_params", "evaluate", "matrix_dim", "param_shape",
           "scalar_param"]
