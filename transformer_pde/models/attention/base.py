"""Common machinery of the attention family (docs: math/attention.md) and its capabilities.

- :class:`AbstractAttention`: the velocity of every token, built from the measure of the tokens.
- :class:`AbstractFieldAttention`: Γ_μ is a vector field on R^d determined by μ alone, evaluated
  at arbitrary queries (``field``): the mean-field object of a position-free attention.
- :class:`AbstractMaskableAttention`: a field attention that can be made causal
  (:class:`~transformer_pde.Causal`, token i attends to tokens j <= i; docs: math/causal.md#causal-attention):
  it gives its field with the keys masked by position (:meth:`AbstractMaskableAttention.causal_field`).
- :class:`AbstractNormalizedAttention`: Γ_μ(x) is a weighted average of V y (softmax, ℓ²,
  Sinkhorn, multi-head), so the support grows at most like exp(∫‖V‖)
  (docs: math/attention.md#support-and-stability-bounds).
- :class:`AbstractGaussianClosure`: the field of a Gaussian N(α, Σ) is affine, Jx + c, and the
  moment ODEs α' = Jα + c, Σ' = JΣ + ΣJᵀ are written once here (docs: math/gaussian.md#moment-equations).
- :class:`AbstractKernelAttention`: the field is made of softmax reductions of logits
  γ⟨a_i, b_j⟩ + bias_j with a = Qx, b = Ky in R^k, each a value its kernel backend
  (``tp.kernels.Exact``, ``Fast``, ``Auto``; automatic when none is given) computes; the choice
  is inspectable (:meth:`AbstractKernelAttention.kernel_report`).
"""

from __future__ import annotations

import abc
import copy

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import (as_float_array, check_count, check_covariance, check_finite, check_points, check_scalar,
                        check_weights, cover_finiteness)
from ..._linalg import symmetrize
from ..._types import Param, Points, PointsLike, Queries, QueriesLike, Weights, WeightsLike
from ...kernels.backends import AbstractBackend, KernelReport
from ...kernels.reduction import SoftmaxReduction, gather_keys
from ...params import evaluate, matrix_dim
from ..base import AbstractDynamics, AbstractFieldDynamics


class AbstractAttention(AbstractDynamics):
    """Self-attention on R^d: the velocity of token i is Γ_μ at x_i, μ = Σ_j w_j δ_{x_j}.

    Every subclass implements :meth:`query_field`; the token velocity is the field at the tokens
    themselves. A position-free attention is an :class:`AbstractFieldAttention`, a causal one a
    :class:`~transformer_pde.Causal` wrapping an :class:`AbstractMaskableAttention`.
    """

    @abc.abstractmethod
    def query_field(self, queries: Queries, x: Points, weights: Weights, t, query_offset=0) -> Queries:
        """Γ_μ(queries) for μ = Σ_j w_j δ_{x_j} (unchecked). Query i is token ``query_offset + i``
        (a causal attention masks by it: the queries are then a block of the tokens, e.g. one
        device's shard); a field attention ignores it."""

    def vector_field(self, x, weights, t):
        return self.query_field(x, x, weights, t)

    def shard_field(self, x: Points, weights: Weights, t, axis_name, num_tokens: int) -> Points:
        """Inside ``shard_map`` over ``axis_name`` (:class:`transformer_pde.Sharded`): the
        velocity of this device's tokens ``x``, the measure being the first ``num_tokens`` of
        every device's tokens (the others are zero-weight padding, last). Here they are gathered,
        and this device's tokens are the queries (query i is token ``axis_index * n_local + i``:
        a causal mask is the one-device mask)."""
        keys, w = gather_keys(axis_name, x, weights)
        offset = jax.lax.axis_index(axis_name) * x.shape[0]
        return self.query_field(x, keys[:num_tokens], w[:num_tokens], t, query_offset=offset)


class AbstractFieldAttention(AbstractAttention, AbstractFieldDynamics):
    """Γ_μ is a vector field on R^d determined by μ alone (no token positions): the mean-field
    object, evaluated at arbitrary queries by :meth:`field` (``query_offset`` plays no part), with
    a divergence (:meth:`~transformer_pde.models.AbstractFieldDynamics.divergence`)."""

    def field(self, queries: QueriesLike, x: PointsLike, weights: WeightsLike | None = None, t=0.0) -> Queries:
        """The mean-field velocity Γ_μ evaluated at arbitrary ``queries`` (shape ``(m, d)``)."""
        x = self.check_state(x, "x")
        queries = check_points(queries, "queries", x.shape[1])
        w = check_weights(weights, x.shape[0], x.dtype)
        check_scalar(t, "t")
        return self.query_field(queries, x, w, jnp.asarray(t, x.dtype))


class AbstractBilinearAttention(AbstractAttention):
    """Scores β⟨Qx, Ky⟩ = yᵀAx with A = βKᵀQ and values V y (docs: math/attention.md#conventions): the single-head
    variants. Gives :meth:`identity`, :meth:`score_matrix`, :meth:`value_norm` and ``dim``."""

    Q: eqx.AbstractVar[Param]
    K: eqx.AbstractVar[Param]
    V: eqx.AbstractVar[Param]
    beta: eqx.AbstractVar[jax.Array]

    @classmethod
    def identity(cls, d: int, beta=1.0, *, dtype=None, **kwargs):
        """Q = K = V = I_d: the SA (softmax) and USA (unnormalized) models of GLPR
        (docs: math/sphere.md#the-projected-flow)."""
        eye = jnp.eye(check_count(d, f"{cls.__name__}.identity d", minimum=1), dtype=dtype)
        cover_finiteness([eye])  # finite by construction: no runtime check of it under jit
        return cls(eye, eye, eye, beta, **kwargs)

    @property
    def dim(self):
        return matrix_dim(self.V)

    def score_matrix(self, t=0.0):
        """A = β KᵀQ, so s(x, y) = yᵀAx (docs: math/attention.md#conventions)."""
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        return self.beta * (K.T @ Q)

    def value_norm(self, t=0.0):
        """‖V(t)‖ (operator norm)."""
        return jnp.linalg.norm(evaluate(self.V, t), ord=2)


class AbstractKernelAttention(AbstractAttention):
    r"""The field is made of softmax reductions of logits γ⟨a_i, b_j⟩ + bias_j, a = Q q_i and
    b = K x_j in R^k (one per head), each handed as a value
    (:class:`~transformer_pde.kernels.SoftmaxReduction`) to a kernel backend
    (:mod:`transformer_pde.kernels.backends`) that computes it: exact by default, the NUFFT
    Gaussian sum for k <= 3 with ``Fast`` or ``Auto``. The attention never asks which.

    Subclasses hold ``backend`` (bound to the attention when built,
    :func:`transformer_pde.kernels.bind_backend`) and give :meth:`_reductions` (the reductions at
    given queries, for reports) and :meth:`_value_width` (value columns per reduction). A
    position-free one accepts ``axis_name`` in ``query_field``: with it (inside ``shard_map``,
    :meth:`shard_field`) ``x`` and ``weights`` are this device's tokens, and the backend reduces
    over every device's.
    """

    backend: eqx.AbstractVar[AbstractBackend]

    @abc.abstractmethod
    def _reductions(self, queries, x, weights, t, causal: bool = False) -> list[SoftmaxReduction]:
        """The attention's reductions at ``queries`` (unchecked), one per head; ``causal``: masked
        (query i sees keys j <= i), for reports."""

    @abc.abstractmethod
    def _value_width(self) -> int:
        """Value columns of each reduction (the cost model's e)."""

    def with_token_radius(self, r, who):
        backend = self.backend.with_token_radius(r, who)
        if backend is self.backend:
            return self
        new = copy.copy(self)  # the backend is a static field: eqx.tree_at cannot reach it
        object.__setattr__(new, "backend", backend)
        return new

    def kernel_choice(self, m: int, n: int, dtype, *, causal: bool = False) -> KernelReport:
        """The kernel the backend takes for m queries and n keys of ``dtype``, and why (static:
        no data); ``causal``: with the keys masked by position, as in :class:`~transformer_pde.Causal`."""
        return self.backend.choose(m=int(m), n=int(n), e=self._value_width(), dtype=dtype, causal=causal)

    def kernel_report(self, x: PointsLike, weights: WeightsLike | None = None, t=0.0,
                      queries: QueriesLike | None = None, *, causal: bool = False) -> KernelReport:
        """The kernel the backend takes on these tokens, and why; on the fast kernel also the
        a-posteriori bounds of every reduction on them (largest per-query bounds, and the number
        of queries whose bound misses the backend's ``tol``: recomputed exactly by ``Auto``).
        ``queries`` default to the tokens; ``causal`` as in :meth:`kernel_choice`."""
        x = check_points(x, "x", self.dim)
        queries = x if queries is None else check_points(queries, "queries", x.shape[1])
        w = check_weights(weights, x.shape[0], x.dtype)
        return self.backend.report(self._reductions(queries, x, w, jnp.asarray(t, x.dtype), causal=causal))

    def shard_field(self, x, weights, t, axis_name, num_tokens):
        # the backend reduces over every device's keys from this device's (the zero-weight
        # padding adds nothing): Exact gathers the keys' projections, the fast kernel sums its
        # Fourier modes across devices
        return self.query_field(x, x, weights, t, axis_name=axis_name)


class AbstractNormalizedAttention(AbstractAttention):
    """Γ_μ(x) = Σ_j p_j(x) V y_j with p(x) a probability vector
    (docs: math/attention.md#support-and-stability-bounds)."""

    @abc.abstractmethod
    def value_norm(self, t=0.0) -> jax.Array:
        """The constant of |Γ_μ(x)| <= value_norm · max_j |y_j|: ‖V(t)‖ (Σ_h‖W_hV_h‖ multi-head)."""


class AbstractMaskableAttention(AbstractFieldAttention):
    """A field attention that can be made causal (:class:`~transformer_pde.Causal`; docs:
    math/causal.md#causal-attention): it gives its field with the keys masked by position,
    :meth:`causal_field`, each reduction computed by the same kernel as the field's with the
    exact kernel's causal mask.

    The causal field depends on the positions (Γ_μ(s, x) on [0, 1] x R^d), so ``Causal`` has no
    ``field`` at arbitrary points and no Gaussian closure: the field of token s averages over the
    tokens before s, and for Gaussian data with a position-dependent law that restriction is a
    Gaussian mixture, not affine (docs: math/gaussian.md#moment-equations). When features are
    independent of position, μ0 = Unif[0,1] ⊗ N(α, Σ), the causal dynamics equal the non-causal
    ones: use the attention itself.
    """

    @abc.abstractmethod
    def causal_field(self, queries: Queries, x: Points, weights: Weights, t, query_offset,
                     key_bias: jax.Array | None = None) -> Queries:
        """Γ at ``queries`` (unchecked) where query i, token ``query_offset + i``, sees the keys
        j <= ``query_offset + i`` only, each key's mass w_j multiplied by e^{key_bias_j}
        (``key_bias`` of shape ``(n,)``, or None: none)."""


class AbstractGaussianClosure(AbstractFieldAttention):
    """The field of a Gaussian μ = N(α, Σ) is affine, Γ_μ(x) = Jx + c (docs: math/gaussian.md#moment-equations).

    Subclasses give :meth:`affine_field`; the moment ODEs are written once, in
    :meth:`gaussian_velocity`. Causal attention has no closure (:class:`AbstractMaskableAttention`).
    """

    @abc.abstractmethod
    def affine_field(self, mean, cov, t=0.0):
        """(J, c) with Γ_{N(mean, cov)}(x) = Jx + c (docs: math/gaussian.md#moment-equations)."""

    def gaussian_velocity(self, mean, cov, t=0.0):
        r"""Right-hand side of the moment ODEs (docs: math/gaussian.md#gaussian-data-stay-gaussian):

        $$\dot\alpha = J\alpha + c,\qquad \dot\Sigma = J\Sigma + \Sigma J^\top,$$

        with dΣ/dt exactly symmetric, so every Runge–Kutta combination keeps Σ symmetric.
        ``mean`` ``(d,)`` finite, ``cov`` ``(d, d)`` a covariance (symmetric positive
        semi-definite: a degenerate Gaussian is a state); a ValueError naming the bad one
        (``eqx.error_if`` under jit). :meth:`moment_velocity` is the same without the checks.
        """
        mean, cov = as_float_array(mean, "mean"), as_float_array(cov, "cov")
        d = mean.shape[-1] if mean.ndim == 1 else None
        if mean.ndim != 1 or cov.shape != (d, d):
            raise ValueError(f"need mean of shape (d,) and cov of shape (d, d), got {mean.shape} and {cov.shape}")
        mean = check_finite(mean, "mean")
        cov = check_covariance(cov, "cov")
        return self.moment_velocity(mean, cov, t)

    def moment_velocity(self, mean, cov, t=0.0):
        """:meth:`gaussian_velocity` without input checks: the vector field of a Gaussian state in
        ``tp.solve``, whose covariance was checked once when the :class:`~transformer_pde.Gaussian`
        was made (a check at every step would cost an eigen-decomposition each)."""
        J, c = self.affine_field(mean, cov, t)
        JS = J @ cov
        return J @ mean + c, symmetrize(JS + JS.T)


