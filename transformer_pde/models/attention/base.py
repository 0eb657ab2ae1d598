"""Common machinery of the attention family (euclidean.md §1–2) and its capabilities.

- :class:`AbstractAttention`: a field Γ_μ at arbitrary queries, with a declared ``causal`` flag.
- :class:`AbstractNormalizedAttention`: Γ_μ(x) is a weighted average of V y (softmax, ℓ²,
  Sinkhorn, multi-head), so the support grows at most like exp(∫‖V‖) (euclidean.md §3).
- :class:`AbstractGaussianClosure`: the field of a Gaussian N(α, Σ) is affine, Jx + c, and the
  moment ODEs α' = Jα + c, Σ' = JΣ + ΣJᵀ are written once here (euclidean.md §4).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

import numpy as np

from ..._checks import check_block_size, check_points, check_scalar, check_weights, is_concrete
from ..._linalg import symmetrize
from ..._types import Param, Points, PointsLike, Queries, QueriesLike, Weights, WeightsLike
from ...params import as_param, evaluate, param_shape
from ..base import AbstractDynamics


class AbstractAttention(AbstractDynamics):
    """Self-attention on R^d: Γ_μ(x) for μ = Σ_j w_j δ_{y_j}.

    Every subclass implements :meth:`_field`, the field at arbitrary query points (the
    mean-field object), and the token velocity is the field at the tokens themselves.
    """

    @abc.abstractmethod
    def _field(self, queries: Queries, x: Points, weights: Weights, t, query_offset=0) -> Queries:
        """Γ_μ(queries) for μ = Σ_j w_j δ_{x_j} (unchecked). Causal variants: query i is token
        ``query_offset + i`` (a shard of the tokens, :class:`transformer_pde.Sharded`)."""

    def _velocity(self, x, weights, t):
        return self._field(x, x, weights, t)

    causal: eqx.AbstractVar[bool]
    """Token i attends to tokens j <= i in their given order (euclidean.md §2f)."""

    def field(self, queries: QueriesLike, x: PointsLike, weights: WeightsLike | None = None, t=0.0) -> Queries:
        """The mean-field velocity Γ_μ evaluated at arbitrary ``queries`` (shape ``(m, d)``)."""
        if self.causal:
            raise ValueError("causal attention depends on token positions: the field is defined "
                             "only at the tokens themselves; use velocity(x)")
        x = self.check_state(x, "x")
        queries = check_points(queries, "queries", x.shape[1])
        w = check_weights(weights, x.shape[0], x.dtype)
        check_scalar(t, "t")
        return self._field(queries, x, w, jnp.asarray(t, x.dtype))


class AbstractBilinearAttention(AbstractAttention):
    """Scores β⟨Qx, Ky⟩ = yᵀAx with A = βKᵀQ and values V y (spec README): the single-head
    variants. Gives :meth:`identity`, :meth:`score_matrix`, :meth:`value_norm` and ``dim``."""

    Q: eqx.AbstractVar[Param]
    K: eqx.AbstractVar[Param]
    V: eqx.AbstractVar[Param]
    beta: eqx.AbstractVar[jax.Array]

    @classmethod
    def identity(cls, d: int, beta=1.0, *, dtype=None, **kwargs):
        """Q = K = V = I_d: the SA (softmax) and USA (unnormalized) models of GLPR (sphere.md §1)."""
        eye = jnp.eye(d, dtype=dtype)
        return cls(eye, eye, eye, beta, **kwargs)

    @property
    def dim(self):
        return matrix_dim(self.V)

    def score_matrix(self, t=0.0):
        """A = β KᵀQ, so s(x, y) = yᵀAx (spec README)."""
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        return self.beta * (K.T @ Q)

    def value_norm(self, t=0.0):
        """‖V(t)‖ (operator norm)."""
        return jnp.linalg.norm(evaluate(self.V, t), ord=2)


class AbstractNormalizedAttention(AbstractAttention):
    """Γ_μ(x) = Σ_j p_j(x) V y_j with p(x) a probability vector (euclidean.md §3)."""

    @abc.abstractmethod
    def value_norm(self, t=0.0) -> jax.Array:
        """The constant of |Γ_μ(x)| <= value_norm · max_j |y_j|: ‖V(t)‖ (Σ_h‖W_hV_h‖ multi-head)."""


class AbstractGaussianClosure(AbstractAttention):
    """The field of a Gaussian μ = N(α, Σ) is affine, Γ_μ(x) = Jx + c (euclidean.md §4).

    Subclasses give :meth:`affine_field`; the moment ODEs are written once, in
    :meth:`gaussian_velocity`. A causal instance has no closure (euclidean.md §4f).
    """

    @abc.abstractmethod
    def _affine_field(self, mean, cov, t):
        """(J, c) of the variant (unchecked, non-causal)."""

    def affine_field(self, mean, cov, t=0.0):
        """(J, c) with Γ_{N(mean, cov)}(x) = Jx + c (euclidean.md §4)."""
        if self.causal:
            raise NotImplementedError(
                f"{type(self).__name__}(causal=True) has no Gaussian closure: the field of token s "
                "averages over the tokens before s, and for Gaussian data with position-dependent "
                "law that restriction is a Gaussian mixture, so the field is not affine "
                "(euclidean.md §4f). When features are independent of position, "
                "μ0 = Unif[0,1] ⊗ N(α, Σ), the causal dynamics equal the non-causal ones: "
                "use causal=False.")
        return self._affine_field(mean, cov, t)

    def gaussian_velocity(self, mean, cov, t=0.0):
        r"""Right-hand side of the moment ODEs (euclidean.md §4, "Mechanism"):

        $$\dot\alpha = J\alpha + c,\qquad \dot\Sigma = J\Sigma + \Sigma J^\top,$$

        with dΣ/dt exactly symmetric, so every Runge–Kutta combination keeps Σ symmetric.
        """
        J, c = self.affine_field(mean, cov, t)
        JS = J @ cov
        return J @ mean + c, symmetrize(JS + JS.T)


def log_weights(weights):
    """log w_j with log 0 = -inf (zero-weight tokens are ignored, not NaN)."""
    return jnp.where(weights > 0, jnp.log(jnp.where(weights > 0, weights, 1.0)), -jnp.inf)


def bilinear_fields(cls_name: str, Q, K, V, beta, causal, block_size):
    """The checked fields (Q, K, V, beta, causal, block_size) of a bilinear-score attention."""
    Q, K, V = check_qkv(cls_name, Q, K, V, beta)
    return (Q, K, V, scalar_param(beta, f"{cls_name}.beta"), bool(causal),
            check_block_size(block_size, f"{cls_name}.block_size"))


def check_qkv(cls_name: str, Q, K, V, beta):
    """Normalize and check (Q, K, V, beta) of a bilinear-score attention: Q, K (k, d); V (d, d)."""
    Q, K, V = as_param(Q, f"{cls_name}.Q"), as_param(K, f"{cls_name}.K"), as_param(V, f"{cls_name}.V")
    sq, sk, sv = param_shape(Q), param_shape(K), param_shape(V)
    if len(sq) != 2 or sq != sk:
        raise ValueError(f"{cls_name}: Q and K must both have shape (k, d), got Q {sq} and K {sk}")
    d = sq[1]
    if sv != (d, d):
        raise ValueError(f"{cls_name}: V must be square with shape ({d}, {d}) to match Q, K of shape "
                         f"{sq}, got V {sv}")
    check_scalar(beta, f"{cls_name}.beta")
    return Q, K, V


def qkv_features(attn, queries, x, t):
    """β Q q_i, K x_j and V x_j as row arrays (scores s_ij = β⟨Q q_i, K x_j⟩)."""
    Q, K, V = evaluate(attn.Q, t), evaluate(attn.K, t), evaluate(attn.V, t)
    return attn.beta * (queries @ Q.T), x @ K.T, x @ V.T


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


def matrix_dim(V) -> int:
    return param_shape(V)[-1]
