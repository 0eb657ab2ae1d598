r"""Measure-to-measure interpolation with a Transformer (sphere.md §7, "Interp", Geshkovski–
Rigollet–Ruiz-Balet, arXiv 2411.04551).

Each input measure μ^i_0 on S^{d-1} (a token sequence) flows by its own mean-field dynamics

$$\partial_t\mu+\operatorname{div}(\mu\,v[\mu])=0,\qquad
v[\mu](t,x)=P^\perp_x\Big(V(t)\,\mathcal A_{B(t)}[\mu](x)+W(t)\big(U(t)x+b(t)\big)_+\Big),$$
$$\mathcal A_B[\mu](x)=\frac{\int e^{\langle Bx,y\rangle}\,y\,d\mu(y)}{\int e^{\langle Bx,y\rangle}\,d\mu(y)},$$

with parameters θ(t) = (V, B, W, U, b) shared by all inputs and piecewise constant in time (one
value per layer). The paper constructs θ with O(dN) switches; here θ is *learned*: minimize
Σ_i S_ε(μ^i(T), ν^i), the Sinkhorn divergence (ott-jax, explicit ε) between the outputs and the
targets ν^i, by gradient descent through the solver (:func:`tp.fit`).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._checks import check_block_size
from ._types import Param
from .attention.base import AbstractAttention, log_weights
from .kernels import softmax_average
from .params import PiecewiseConstant, as_param, evaluate, param_shape
from .solve import solve


class AttentionPerceptron(AbstractAttention):
    r"""Attention plus a one-hidden-layer perceptron, the field of the Interp model (sphere.md §7):

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

    def _field(self, queries, x, weights, t, query_offset=0):
        V, B, W, U, b = (evaluate(p, t) for p in (self.V, self.B, self.W, self.U, self.b))
        att = softmax_average(queries @ B.T, x, x, log_weights(weights))
        return att @ V.T + jax.nn.relu(queries @ U.T + b) @ W.T


def flow(model, inputs, *, t1, dt0, weights=None, solver=None, adjoint=None):
    """Push every input measure through its own dynamics: ``inputs (N, n, d) -> (N, n, d)`` at t1.

    ``model`` is a dynamics (e.g. ``Sphere(AttentionPerceptron(...))``); the measures do not
    interact (each sequence is processed alone), so this is a vmap of :func:`tp.solve`.
    """
    inputs = jnp.asarray(inputs)
    if inputs.ndim != 3:
        raise ValueError(f"inputs must have shape (N, n, d) (N measures of n tokens), got {inputs.shape}")

    def one(x0, w):
        return solve(model, x0, t1=t1, dt0=dt0, weights=w, solver=solver, adjoint=adjoint).final

    w = None if weights is None else jnp.asarray(weights)
    if w is None:
        return jax.vmap(lambda x0: one(x0, None))(inputs)
    return jax.vmap(one)(inputs, w)


@eqx.filter_jit
def sinkhorn_divergence(x, y, epsilon, *, a=None, b=None, max_iterations: int = 1000,
                        threshold: float = 1e-5, batch_size: int | None = None):
    r"""Debiased Sinkhorn divergence S_ε(Σ a_i δ_{x_i}, Σ b_j δ_{y_j}) with cost |x − y|² (ott-jax).

    S_ε = OT_ε(μ, ν) − ½ OT_ε(μ, μ) − ½ OT_ε(ν, ν) ≥ 0, zero iff μ = ν; ε is explicit (never
    ott's data-scaled default). Differentiable (ott's implicit differentiation). ``batch_size``
    streams the cost in blocks of that many points instead of storing it (memory
    O(n · batch_size); :class:`transformer_pde.attention.sinkhorn.StreamingSqEuclideanCloud`).
    """
    from ott.geometry import pointcloud
    from ott.tools import sinkhorn_divergence as sd

    from .attention.sinkhorn import StreamingSqEuclideanCloud

    batch_size = check_block_size(batch_size, "batch_size")
    cloud = pointcloud.PointCloud if batch_size is None else StreamingSqEuclideanCloud
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    div, _ = sd.sinkhorn_divergence(cloud, x, y, epsilon=epsilon, a=a, b=b, **kwargs,
                                    solve_kwargs={"max_iterations": max_iterations,
                                                  "threshold": threshold})
    return div


@eqx.filter_jit
def interpolation_loss(model, inputs, targets, *, t1, dt0, epsilon, solver=None, adjoint=None):
    """Mean over i of S_ε(Φ_T#μ^i, ν^i): ``inputs (N, n, d)``, ``targets (N, m, d)``."""
    targets = jnp.asarray(targets)
    if targets.ndim != 3 or targets.shape[0] != jnp.shape(inputs)[0]:
        raise ValueError(f"targets must have shape (N, m, d) with N = {jnp.shape(inputs)[0]} "
                         f"inputs, got {targets.shape}")
    out = flow(model, inputs, t1=t1, dt0=dt0, solver=solver, adjoint=adjoint)
    return jnp.mean(jax.vmap(lambda x, y: sinkhorn_divergence(x, y, epsilon))(out, targets))


def cap_sample(key, center, n: int, spread: float):
    """n points on S^{d-1} near ``center``: normalize(center + spread · Gaussian)."""
    center = jnp.asarray(center)
    center = center / jnp.linalg.norm(center)
    z = center + spread * jax.random.normal(key, (n, center.shape[0]), center.dtype)
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


__all__ = ["AttentionPerceptron", "cap_sample", "flow", "interpolation_loss", "sinkhorn_divergence"]
