"""Time-dependent parameters: different weights per layer (euclidean.md §1, "Time-dependent weights").

A parameter is a fixed array, any callable ``t -> array``, or a :class:`PiecewiseConstant`
stack of per-layer values. Every formula of the spec then holds pointwise in t.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import as_float_array, check_finite, check_scalar, is_concrete

# Stage times that land on a layer boundary (t = t0 + l * dt) must select layer l even
# after floating-point rounding; 1e-4 of a layer is far from every Runge-Kutta node.
_BOUNDARY_SLACK = 1e-4


class PiecewiseConstant(eqx.Module):
    """Per-layer parameters: ``values[l]`` on ``[t0 + l*dt, t0 + (l+1)*dt)``.

    Times before ``t0`` use the first layer, times after the last layer use the last one.
    One explicit Euler step of size ``dt`` per layer is then exactly a Transformer whose
    layer ``l`` has weights ``values[l]``.
    """

    values: Float[ArrayLike, "L ..."]
    t0: float | Float[Array, ""] = 0.0
    dt: float | Float[Array, ""] = 1.0

    def __check_init__(self):
        if jnp.ndim(self.values) < 1 or jnp.shape(self.values)[0] < 1:
            raise ValueError(f"PiecewiseConstant.values must have a leading layer axis of length >= 1, "
                             f"got shape {jnp.shape(self.values)}")
        if is_concrete(self.values):  # traced values are checked where a model takes them (as_param)
            check_finite(as_float_array(self.values, "PiecewiseConstant.values"), "PiecewiseConstant.values")
        check_scalar(self.dt, "PiecewiseConstant.dt", positive=True)
        check_scalar(self.t0, "PiecewiseConstant.t0")

    @property
    def num_layers(self) -> int:
        return self.values.shape[0]

    def __call__(self, t):
        pos = (t - self.t0) / self.dt + _BOUNDARY_SLACK
        idx = jnp.clip(jnp.floor(pos).astype(jnp.int32), 0, self.num_layers - 1)
        return self.values[idx]


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
    Q, K, V = as_param(Q, f"{cls_name}.Q"), as_param(K, f"{cls_name}.K"), as_param(V, f"{cls_name}.V")
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
