r"""Feed-forward (MLP) sublayers and Transformer blocks: attention, then MLP, each residual.

:class:`MLP` is a token-wise field M(x) = W₂ σ(W₁x + b₁) + b₂ (no interaction between tokens), an
R^d dynamics like an attention, so every normalization scheme wraps it the same way
(:mod:`.normalization`): ``tp.PreLN(mlp)`` is the sublayer x ← x + hM(N(x)).

A block chains two such sublayers, each with its own residual and normalization (the placement
is the scheme's): with the attention sublayer x ↦ R(x + hF_A(t, x)) and the MLP sublayer
x ↦ R(x + hF_M(t, x)), one block is

$$x_1 = R\big(x + hF_A(t_l, x)\big),\qquad x \leftarrow R\big(x_1 + hF_M(t_l, x_1)\big).$$

| sublayers | block |
|---|---|
| ``Block(A, M, h)`` | x₁ = x + hA(x); x ← x₁ + hM(x₁) (R^d) |
| ``Block(PreLN(A), PreLN(M), h)`` | x₁ = x + hA(N x); x ← x₁ + hM(N x₁) (GPT-2, LLaMA) |
| ``Block(PeriLN(A), PeriLN(M), h)`` | x₁ = x + hN(A(N x)); x ← x₁ + hN(M(N x₁)) |
| ``Block(LNScaling(A, h), LNScaling(M, h), h)`` | the Pre-LN block with both inputs /√ℓ, ℓ = l + 1 |
| ``SphereBlock(PostLN(A), PostLN(M), h)`` | x₁ = N(x + hA(x)); x ← N(x₁ + hM(x₁)) (Vaswani et al.) |
| ``SphereBlock(Sphere(A), Sphere(M), h)`` | x₁ = N(x + hP⊥A); x ← N(x₁ + hP⊥M) (projected) |
| ``SphereBlock(NGPT(A, a), NGPT(M, b), h)`` | x₁ = N(x + ah(N(A(x)) − x)); x ← N(x₁ + bh(N(M(x₁)) − x₁)) (nGPT) |

Mix-LN blocks: ``tp.Switched(SphereBlock(PostLN(A), PostLN(M), h), Block(PreLN(A), PreLN(M), h), τ)``,
the Post-LN sphere block up to τ = t0 + ⌊αL⌋h, then the Pre-LN block (one dynamics, as
:class:`~transformer_pde.MixLN` is for a single sublayer).

**A block as one Euler step.** A composition of two steps is not one Euler step of a field
independent of h, so a block carries its layer step h and its field is the *modified field* F_h
with R(x + hF_h(t, x)) = block(x) exactly (to rounding):

- R = id: F_h(t, x) = F_A(t, x) + F_M(t, x + hF_A(t, x));
- R = N (|x| = 1): F_h(t, x) = F_A(t, x) + |x + hF_A| · F_M(t, N(x + hF_A)), since
  x + hF_h = |x + hF_A| (x₁ + hF_M(x₁)) is parallel to the unnormalized output.

So ``tp.layers(block, x0, L, h)`` with the block's own step h is the architecture. As h → 0,
F_h → F_A + F_M: the block is a Lie–Trotter splitting of the ODE whose field is the sum of the
two sublayers' limits, ``block.limit`` (R = N: θ̇ = P⊥_θ(F_A + F_M)(θ)); integrate that with
``tp.solve`` (``tp.solve(block, ...)`` integrates the h-modified field, O(h) away from it).
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_scalar
from .._types import Param
from ..params import as_param, evaluate, param_shape, scalar_param
from .base import AbstractDynamics, AbstractFieldDynamics, AbstractManifoldDynamics, AbstractRetractedDynamics
from .normalization import NGPT
from .sphere import PostLN, Sphere, check_unit_points, unchecked_normalize, unchecked_tangent_projection

__all__ = ["MLP", "Block", "SphereBlock"]


class MLP(AbstractFieldDynamics):
    r"""A feed-forward sublayer, token by token: M(x) = W₂ σ(W₁ x + b₁) + b₂.

    Args:
        W1: shape ``(m, d)`` (m hidden units), or a callable ``t -> (m, d)`` (per-layer weights,
            e.g. :class:`~transformer_pde.PiecewiseConstant`).
        b1: shape ``(m,)``.
        W2: shape ``(d, m)``.
        b2: shape ``(d,)``.
        activation: σ, any elementwise JAX function (default ``jax.nn.relu``; GPT-2 uses
            ``jax.nn.gelu``).

    As a dynamics on R^d, ẋ_i = M(x_i): the tokens do not interact. Wrap it in a normalization
    scheme and chain it after attention with :class:`Block` / :class:`SphereBlock`.
    """

    W1: Param
    b1: Param
    W2: Param
    b2: Param
    activation: Callable = eqx.field(static=True)

    def __init__(self, W1, b1, W2, b2, activation: Callable = jax.nn.relu):
        self.W1, self.b1 = as_param(W1, "MLP.W1"), as_param(b1, "MLP.b1")
        self.W2, self.b2 = as_param(W2, "MLP.W2"), as_param(b2, "MLP.b2")
        s1, sb1, s2, sb2 = (param_shape(p) for p in (self.W1, self.b1, self.W2, self.b2))
        if len(s1) != 2:
            raise ValueError(f"MLP.W1 must have shape (m, d), got {s1}")
        m, d = s1
        if sb1 != (m,) or s2 != (d, m) or sb2 != (d,):
            raise ValueError(f"MLP: with W1 of shape ({m}, {d}), b1 must have shape ({m},), W2 "
                             f"({d}, {m}) and b2 ({d},); got b1 {sb1}, W2 {s2}, b2 {sb2}")
        if not callable(activation):
            raise ValueError(f"MLP.activation must be a function such as jax.nn.relu, got {activation!r}")
        self.activation = activation

    @property
    def dim(self):
        return param_shape(self.W1)[1]

    def query_field(self, queries, x, weights, t, query_offset=0):
        """M(t, queries): the tokens do not interact, so ``x`` and ``weights`` play no part."""
        W1, b1, W2, b2 = (evaluate(p, t) for p in (self.W1, self.b1, self.W2, self.b2))
        return self.activation(queries @ W1.T + b1[None, :]) @ W2.T + b2[None, :]

    def vector_field(self, x, weights, t):
        return self.query_field(x, x, weights, t)

    def divergence(self, queries, x, weights, t):
        r"""div M(q) = Σ_k σ'(z_k) (W₁W₂)_kk with z = W₁q + b₁ (σ' by forward-mode autodiff of the
        elementwise σ; for ReLU the indicator 1[z_k > 0]). The perceptron v = w(aᵀx + b)_+ of
        the normalizing-flow abstract (m = 1) has div v = (aᵀw)·1[aᵀx + b > 0]."""
        W1, b1, W2 = (evaluate(p, t) for p in (self.W1, self.b1, self.W2))
        z = queries @ W1.T + b1[None, :]
        _, slope = jax.jvp(self.activation, (z,), (jnp.ones_like(z),))
        return slope @ jnp.sum(W1 * W2.T, axis=1)


def _common_dim(name, first, second):
    d1, d2 = first.dim, second.dim
    if d1 is not None and d2 is not None and d1 != d2:
        raise ValueError(f"{name}: the sublayers act on different dimensions, d={d1} and d={d2}")
    return d1 if d1 is not None else d2


def _checked_sublayers(owner: str, attention, mlp, step, fits, expected: str):
    """The two sublayers and the step of a block, checked: each ``fits`` (else the error says what
    was ``expected``), on the same d, and h > 0."""
    for field, sub in (("attention", attention), ("mlp", mlp)):
        if not fits(sub):
            raise ValueError(f"{owner}.{field} must be {expected.format(got=type(sub).__name__)}")
    _common_dim(owner, attention, mlp)
    step = check_scalar(step, f"{owner}.step", positive=True)  # traced: keep the error_if'd value
    return attention, mlp, scalar_param(step)


class _AbstractSublayerPair(AbstractDynamics):
    """Two sublayers on the same tokens: a block, or its h → 0 limit."""

    attention: eqx.AbstractVar[AbstractDynamics]
    mlp: eqx.AbstractVar[AbstractDynamics]

    @property
    def dim(self):
        return _common_dim(type(self).__name__, self.attention, self.mlp)

    def check_state(self, x, name: str = "x"):
        return self.mlp.check_state(self.attention.check_state(x, name), name)


class _AbstractSpherePair(_AbstractSublayerPair, AbstractManifoldDynamics):
    """Two sublayers on the unit sphere (R = N)."""

    def check_state(self, x, name: str = "x"):
        return check_unit_points(x, name, self.dim)

    def retract(self, x):
        return unchecked_normalize(x)


class Block(_AbstractSublayerPair):
    r"""One residual-stream layer: attention sublayer, then MLP sublayer (R = id; module docstring).

    x₁ = x + hF_A(t, x),  x ← x₁ + hF_M(t, x₁), with F_A, F_M the fields of the two sublayers
    (a plain attention and :class:`MLP` on R^d, or both wrapped in ``PreLN``, ``PeriLN`` or
    ``LNScaling``). Both sublayers of layer l see the same time t_l (LN-scaling: the same ℓ).

    Args:
        attention: the first sublayer, an R^d dynamics (e.g. ``tp.PreLN(attn)``).
        mlp: the second sublayer (e.g. ``tp.PreLN(tp.MLP(...))``).
        step: h > 0, the layer step: ``tp.layers(block, x0, L, h)`` with this h is the
            architecture exactly.
    """

    attention: AbstractDynamics
    mlp: AbstractDynamics
    step: jax.Array

    def __init__(self, attention, mlp, step):
        self.attention, self.mlp, self.step = _checked_sublayers(
            "Block", attention, mlp, step,
            lambda sub: isinstance(sub, AbstractDynamics) and not isinstance(sub, AbstractRetractedDynamics),
            "an R^d sublayer (an attention, MLP, PreLN, PeriLN or LNScaling), got {got}; sphere "
            "sublayers go in a SphereBlock")

    def vector_field(self, x, weights, t):
        h = self.step.astype(x.dtype)
        fa = self.attention.vector_field(x, weights, t).astype(x.dtype)
        return fa + self.mlp.vector_field(x + h * fa, weights, t).astype(x.dtype)

    @property
    def limit(self) -> AbstractDynamics:
        """The h → 0 limit ẋ = F_A + F_M (for ``tp.solve``)."""
        return _SumLimit(self.attention, self.mlp)


_SPHERE_SUBLAYERS = (PostLN, Sphere, NGPT)


class SphereBlock(_AbstractSpherePair):
    r"""One layer on the unit sphere: attention sublayer, then MLP sublayer (R = N; module docstring).

    x₁ = N(x + hF_A(t, x)),  x ← N(x₁ + hF_M(t, x₁)), with both sublayers ``PostLN``, ``Sphere``
    (projected) or ``NGPT`` (with its own α: nGPT has α_A and α_M).

    Args:
        attention: the first sublayer, e.g. ``tp.PostLN(attn)``.
        mlp: the second sublayer, e.g. ``tp.PostLN(tp.MLP(...))``.
        step: h > 0, the layer step (``tp.layers(block, x0, L, h)`` with this h is the layer).
    """

    attention: AbstractManifoldDynamics
    mlp: AbstractManifoldDynamics
    step: jax.Array

    def __init__(self, attention, mlp, step):
        self.attention, self.mlp, self.step = _checked_sublayers(
            "SphereBlock", attention, mlp, step, lambda sub: isinstance(sub, _SPHERE_SUBLAYERS),
            "a sublayer on the unit sphere (PostLN, Sphere or NGPT), got {got}; R^d sublayers go in a Block")

    def vector_field(self, x, weights, t):
        h = self.step.astype(x.dtype)
        fa = self.attention.vector_field(x, weights, t).astype(x.dtype)
        y = x + h * fa
        rho = jnp.linalg.norm(y, axis=-1, keepdims=True)
        return fa + rho * self.mlp.vector_field(y / rho, weights, t).astype(x.dtype)

    @property
    def limit(self) -> AbstractManifoldDynamics:
        """The h → 0 limit θ̇ = P⊥_θ(F_A + F_M)(θ) (for ``tp.solve``)."""
        return _SphereSumLimit(self.attention, self.mlp)


class _SumLimit(_AbstractSublayerPair):
    """ẋ = F_A + F_M: the limit of a :class:`Block`."""

    attention: AbstractDynamics
    mlp: AbstractDynamics

    def vector_field(self, x, weights, t):
        return self.attention.vector_field(x, weights, t) + self.mlp.vector_field(x, weights, t)


class _SphereSumLimit(_AbstractSpherePair):
    """ẋ = P⊥_x(F_A + F_M): the limit of a :class:`SphereBlock` (the unit sphere is invariant)."""

    attention: AbstractManifoldDynamics
    mlp: AbstractManifoldDynamics

    def vector_field(self, x, weights, t):
        v = self.attention.vector_field(x, weights, t) + self.mlp.vector_field(x, weights, t)
        return unchecked_tangent_projection(x, v)
