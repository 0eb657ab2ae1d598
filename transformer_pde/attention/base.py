"""Common machinery of the attention family (euclidean.md §1–2)."""

from __future__ import annotations

import abc

import jax.numpy as jnp

from .._checks import check_points, check_scalar, check_weights
from .._types import Points, Queries, Weights
from ..dynamics import AbstractDynamics
from ..params import as_param, evaluate, param_shape


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

    def field(self, queries: Queries, x: Points, weights: Weights | None = None, t=0.0) -> Queries:
        """The mean-field velocity Γ_μ evaluated at arbitrary ``queries`` (shape ``(m, d)``)."""
        if getattr(self, "causal", False):
            raise ValueError("causal attention depends on token positions: the field is defined "
                             "only at the tokens themselves; use velocity(x)")
        x = self.check_state(x, "x")
        queries = check_points(queries, "queries", x.shape[1])
        w = check_weights(weights, x.shape[0], x.dtype)
        check_scalar(t, "t")
        return self._field(queries, x, w, jnp.asarray(t, x.dtype))

    def gaussian_velocity(self, mean, cov, t=0.0):
        """Right-hand side of the moment ODEs (euclidean.md §4), for variants with a closure."""
        raise NotImplementedError(
            f"{type(self).__name__} has no Gaussian closure: its velocity field is not affine in x "
            "for Gaussian μ, so Gaussian data do not stay Gaussian (euclidean.md §4e-f)")


def log_weights(weights):
    """log w_j with log 0 = -inf (zero-weight tokens are ignored, not NaN)."""
    return jnp.where(weights > 0, jnp.log(jnp.where(weights > 0, weights, 1.0)), -jnp.inf)


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


def scalar_param(value):
    """A scalar parameter as a JAX array leaf (so jit does not recompile per value and grad
    reaches it). Python numbers stay weakly typed: float32 tokens keep float32 arithmetic."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return jnp.asarray(float(value))
    value = jnp.asarray(value)
    return value if jnp.issubdtype(value.dtype, jnp.floating) else value.astype(float)


def matrix_dim(V) -> int:
    return param_shape(V)[-1]
