"""Time-dependent parameters: different weights per layer (euclidean.md §1, "Time-dependent weights").

A parameter is a fixed array, any callable ``t -> array``, or a :class:`PiecewiseConstant`
stack of per-layer values. Every formula of the spec then holds pointwise in t.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from ._checks import as_float_array, check_finite, check_scalar

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


__all__ = ["PiecewiseConstant", "evaluate", "param_shape", "as_param"]
