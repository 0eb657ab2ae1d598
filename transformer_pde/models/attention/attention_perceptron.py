r"""Attention plus a one-hidden-layer perceptron: the field of the measure-to-measure interpolation
model (docs: math/sphere.md#perceptron-block-and-interpolation, Geshkovski–Rigollet–Ruiz-Balet, arXiv
2411.04551)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..._types import Param
from ...kernels import softmax_average
from ...kernels.exact import unchecked_log_weights
from ...params import PiecewiseConstant, as_param, evaluate, param_shape
from .base import AbstractFieldAttention

__all__ = ["AttentionPerceptron"]


class AttentionPerceptron(AbstractFieldAttention):
    r"""Attention plus a one-hidden-layer perceptron, the field of the Interp model
    (docs: math/sphere.md#perceptron-block-and-interpolation):

    $$\Gamma_\mu(t,x)=V(t)\,\mathcal A_{B(t)}[\mu](x)+W(t)\big(U(t)x+b(t)\big)_+ .$$

    Wrap it in :class:`~transformer_pde.Sphere` for the layer-normalized dynamics
    v[μ] = P⊥_x Γ_μ. The attention is softmax attention with Q = B, K = V_att = I, β = 1.

    Args:
        V, B: ``(d, d)``; W: ``(d, m)``; U: ``(m, d)``; b: ``(m,)`` — arrays, callables of t or
            :class:`~transformer_pde.PiecewiseConstant` stacks (m = perceptron width).
    """

    V: Param
    B: Param
    W: Param
    U: Param
    b: Param

    def __init__(self, V, B, W, U, b):
        name = type(self).__name__
        self.V, self.B = as_param(V, f"{name}.V"), as_param(B, f"{name}.B")
        self.W, self.U, self.b = as_param(W, f"{name}.W"), as_param(U, f"{name}.U"), as_param(b, f"{name}.b")
        sv, sB, sW, sU, sb = (param_shape(p) for p in (self.V, self.B, self.W, self.U, self.b))
        if len(sv) != 2 or sv[0] != sv[1]:
            raise ValueError(f"{name}: V must be square (d, d), got {sv}")
        d = sv[0]
        if sB != (d, d):
            raise ValueError(f"{name}: B must have shape ({d}, {d}) to match V, got {sB}")
        if len(sU) != 2 or sU[1] != d:
            raise ValueError(f"{name}: U must have shape (m, {d}), got {sU}")
        m = sU[0]
        if sW != (d, m):
            raise ValueError(f"{name}: W must have shape ({d}, {m}) to match U {sU}, got {sW}")
        if sb != (m,):
            raise ValueError(f"{name}: b must have shape ({m},) to match U {sU}, got {sb}")

    @classmethod
    def random(cls, key, d: int, width: int, num_layers: int, *, t1: float = 1.0, scale: float = 0.5,
               dtype=None):
        """Piecewise-constant parameters, ``num_layers`` layers on [0, t1], i.i.d. N(0, scale²/fan_in)."""
        if d < 2 or width < 1 or num_layers < 1 or not t1 > 0:
            raise ValueError(f"need d >= 2, width >= 1, num_layers >= 1, t1 > 0; got d={d}, "
                             f"width={width}, num_layers={num_layers}, t1={t1}")
        dtype = dtype or jnp.result_type(float)
        kV, kB, kW, kU, kb = jax.random.split(key, 5)
        L = num_layers

        def draw(k, shape, fan_in):
            return scale / jnp.sqrt(fan_in) * jax.random.normal(k, (L, *shape), dtype)

        pc = lambda v: PiecewiseConstant(v, 0.0, t1 / L)
        return cls(pc(draw(kV, (d, d), d)), pc(draw(kB, (d, d), d)), pc(draw(kW, (d, width), width)),
                   pc(draw(kU, (width, d), d)), pc(draw(kb, (width,), 1.0)))

    @property
    def dim(self):
        return param_shape(self.V)[0]

    @property
    def width(self) -> int:
        return param_shape(self.U)[0]

    def query_field(self, queries, x, weights, t, query_offset=0):
        V, B, W, U, b = (evaluate(p, t) for p in (self.V, self.B, self.W, self.U, self.b))
        att = softmax_average(queries @ B.T, x, x, unchecked_log_weights(weights))
        return att @ V.T + jax.nn.relu(queries @ U.T + b[None, :]) @ W.T
