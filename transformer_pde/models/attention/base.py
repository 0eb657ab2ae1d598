"""Common machinery of the attention family (euclidean.md §1–2) and its capabilities.

- :class:`AbstractAttention`: a field Γ_μ at arbitrary queries, with a declared ``causal`` flag.
- :class:`AbstractNormalizedAttention`: Γ_μ(x) is a weighted average of V y (softmax, ℓ²,
  Sinkhorn, multi-head), so the support grows at most like exp(∫‖V‖) (euclidean.md §3).
- :class:`AbstractGaussianClosure`: the field of a Gaussian N(α, Σ) is affine, Jx + c, and the
  moment ODEs α' = Jα + c, Σ' = JΣ + ΣJᵀ are written once here (euclidean.md §4).
- :class:`AbstractKernelAttention`: the field is made of softmax reductions of logits
  γ⟨a_i, b_j⟩ + bias_j with a = Qx, b = Ky in R^k, computed by a kernel backend
  (``tp.kernels.Exact``, ``Fast``, ``Auto``) chosen by the user and inspectable
  (:meth:`AbstractKernelAttention.kernel_report`).
"""

from __future__ import annotations

import abc
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..._checks import check_points, check_scalar, check_weights, is_concrete
from ..._linalg import symmetrize
from ..._types import Param, Points, PointsLike, Queries, QueriesLike, Weights, WeightsLike
from ...kernels.backends import AbstractBackend, Exact, KernelReport, ScoreBox
from ...kernels.fast import fast_lse_average_with_info
from ...params import PiecewiseConstant, check_qkv, evaluate, matrix_dim, param_shape, scalar_param
from ..base import AbstractDynamics


class AbstractAttention(AbstractDynamics):
    """Self-attention on R^d: Γ_μ(x) for μ = Σ_j w_j δ_{y_j}.

    Every subclass implements :meth:`query_field`, the field at arbitrary query points (the
    mean-field object), and the token velocity is the field at the tokens themselves.
    """

    @abc.abstractmethod
    def query_field(self, queries: Queries, x: Points, weights: Weights, t, query_offset=0) -> Queries:
        """Γ_μ(queries) for μ = Σ_j w_j δ_{x_j} (unchecked). Causal variants: query i is token
        ``query_offset + i`` (a shard of the tokens, :class:`transformer_pde.Sharded`)."""

    def vector_field(self, x, weights, t):
        return self.query_field(x, x, weights, t)

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
        return self.query_field(queries, x, w, jnp.asarray(t, x.dtype))


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


class GaussianSum(eqx.Module):
    """One softmax reduction of an attention: logits ``gamma * a_i·b_j + bias_j``, values ``v``,
    in the tokens' dtype (float32 tokens with float64 parameters run the float32 plan)."""

    a: jax.Array
    b: jax.Array
    v: jax.Array
    bias: jax.Array
    gamma: jax.Array

    def __init__(self, a, b, v, bias, gamma, dtype):
        self.a, self.b, self.v, self.bias = (jnp.asarray(z).astype(dtype) for z in (a, b, v, bias))
        self.gamma = jnp.asarray(gamma).astype(dtype)


class AbstractKernelAttention(AbstractAttention):
    r"""The field is made of softmax reductions of logits γ⟨a_i, b_j⟩ + bias_j, a = Q q_i and
    b = K x_j in R^k (one per head): a kernel backend (:mod:`transformer_pde.kernels.backends`)
    computes them, exact by default, the NUFFT Gaussian sum for k <= 3 with ``Fast`` or ``Auto``.

    Subclasses hold ``backend`` (bound to the attention's :class:`ScoreBox` when built, see
    :func:`bind_backend`), give :meth:`_sums` (the reductions, for reports) and
    :meth:`_value_width` (value columns per reduction), and accept ``axis_name`` in ``query_field``:
    with it (inside ``shard_map``, :class:`transformer_pde.Sharded`) ``x`` and ``weights`` are
    this device's tokens, and the reductions run over every device's (:meth:`_shards_keys`).
    """

    backend: eqx.AbstractVar[AbstractBackend]

    @abc.abstractmethod
    def _sums(self, queries, x, weights, t) -> list[GaussianSum]:
        """The attention's reductions (unchecked), as the fast kernel sees them."""

    @abc.abstractmethod
    def _value_width(self) -> int:
        """Value columns of each reduction (the cost model's e)."""

    def kernel_choice(self, m: int, n: int, dtype) -> KernelReport:
        """The kernel path for m queries and n keys of ``dtype``, and why (static: no data)."""
        return self.backend.choose(m=int(m), n=int(n), e=self._value_width(), dtype=dtype,
                                   causal=self.causal)

    def _shards_keys(self, m: int, n: int, dtype) -> bool:
        """Whether ``query_field(..., axis_name=...)`` takes this device's keys only (fast path)."""
        return self.kernel_choice(m, n, dtype).fast

    def kernel_report(self, x: PointsLike, weights: WeightsLike | None = None, t=0.0,
                      queries: QueriesLike | None = None) -> KernelReport:
        """The path this attention takes on these tokens, and why; on the fast path also the
        a-posteriori bounds of every reduction on them (largest per-query bounds, and the
        number of queries whose bound misses the backend's ``tol``: recomputed exactly by
        ``Auto``). ``queries`` default to the tokens."""
        x = check_points(x, "x", self.dim)
        queries = x if queries is None else check_points(queries, "queries", x.shape[1])
        w = check_weights(weights, x.shape[0], x.dtype)
        report = self.kernel_choice(queries.shape[0], x.shape[0], x.dtype)
        if not report.fast:
            return report
        plan, tol = report.plan, float(self.backend.tol)
        avg_b = lse_b = 0.0
        bad = np.zeros(queries.shape[0], bool)
        for s in self._sums(queries, x, w, jnp.asarray(t, x.dtype)):
            info = _sum_info(s, plan)
            ab, lb = np.asarray(info.avg_bound), np.asarray(info.lse_bound)
            avg_b, lse_b = max(avg_b, float(ab.max())), max(lse_b, float(lb.max()))
            scale = max(1.0, float(info.value_half_range))
            bad |= ~np.asarray(info.in_box) | (lb > tol) | (ab > tol * scale)
        return dataclasses.replace(report, max_avg_bound=avg_b, max_lse_bound=lse_b,
                                   fallback_rows=int(bad.sum()))


@eqx.filter_jit
def _sum_info(s: GaussianSum, plan):
    return fast_lse_average_with_info(s.a, s.b, s.v, s.bias, s.gamma, plan, throw=False)[2]


def _row_norm_bound(params, owner: str) -> tuple[float | None, str]:
    """max over rows (of every head, every layer) of |row|_2, or (None, why)."""
    best = 0.0
    for p in params:
        if isinstance(p, PiecewiseConstant):
            values = p.values
        elif callable(p):
            return None, (f"{owner}: a callable parameter has no norm bound before the run; pass "
                          "score_radius=R (a bound on |Qx|_inf, |Kx|_inf), or a PiecewiseConstant")
        else:
            values = p
        if not is_concrete(values):
            return None, (f"{owner}: Q, K are traced when the attention is built; pass "
                          "score_radius=R (a bound on |Qx|_inf, |Kx|_inf)")
        rows = np.linalg.norm(np.asarray(values, np.float64), axis=-1)
        best = max(best, float(rows.max()))
    return best, ""


def bind_backend(backend, owner: str, *, Q, K, beta, gamma_factor=1.0, causal=False) -> AbstractBackend:
    """The attention's backend with its :class:`ScoreBox` (the static facts a plan needs).

    ``backend=None`` is ``Exact()``. R comes from ``score_radius`` or from ``radius`` times the
    largest row norm of Q and K; the γ window from ``beta=(lo, hi)`` or the concrete β, times
    ``gamma_factor`` (a Python number: 2 for ℓ², 1/ε for Sinkhorn, None when ε is traced).
    """
    if backend is None:
        return Exact()
    if not isinstance(backend, AbstractBackend):
        raise ValueError(f"{owner}.backend must be a kernel backend such as tp.kernels.Exact(), "
                         f"tp.kernels.Fast(tol=1e-8) or tp.kernels.Auto(), got {backend!r}")
    if isinstance(backend, Exact):
        return backend
    k = int(param_shape(Q)[-2])
    notes = []
    if backend.score_radius is not None:
        radius = float(backend.score_radius)
        notes.append(f"R = score_radius = {radius:.6g}")
    else:
        rows, why = _row_norm_bound((Q, K), owner)
        radius = None if rows is None else float(backend.radius) * rows
        notes.append(why or f"R = radius {backend.radius:g} x max row norm of Q, K {rows:.6g}")
    if gamma_factor is None:
        gamma = None
        notes.append(f"{owner}: epsilon is traced when the attention is built; build it with a "
                     "concrete epsilon")
    elif backend.beta is not None:
        lo, hi = backend.beta
        if is_concrete(beta) and not lo <= float(beta) <= hi:
            raise ValueError(f"{owner}: beta={float(beta):g} lies outside the declared window "
                             f"beta={backend.beta}")
        gamma = (gamma_factor * float(lo), gamma_factor * float(hi))
        notes.append(f"gamma in [{gamma[0]:.6g}, {gamma[1]:.6g}] from the declared beta window")
    elif is_concrete(beta):
        if not float(beta) > 0:
            gamma = None
            notes.append(f"{owner}: beta={float(beta):g} <= 0 has no Gaussian form")
        else:
            gamma = (gamma_factor * float(beta),) * 2
            notes.append(f"gamma = {gamma[0]:.6g} from the concrete beta")
    else:
        gamma = None
        notes.append(f"{owner}: beta is traced when the attention is built (a sweep or a fit); "
                     "declare its window, beta=(lo, hi)")
    box = ScoreBox(k=k, radius=radius, gamma=gamma, note="; ".join(n for n in notes if n))
    return backend.bind(box, causal=causal, owner=owner)


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


def bilinear_fields(cls_name: str, Q, K, V, beta, causal):
    """The checked fields (Q, K, V, beta, causal) of a bilinear-score attention."""
    Q, K, V = check_qkv(cls_name, Q, K, V, beta)
    return Q, K, V, scalar_param(beta, f"{cls_name}.beta"), bool(causal)


def qkv_features(attn, queries, x, t):
    """β Q q_i, K x_j and V x_j as row arrays (scores s_ij = β⟨Q q_i, K x_j⟩)."""
    Q, K, V = evaluate(attn.Q, t), evaluate(attn.K, t), evaluate(attn.V, t)
    return attn.beta * (queries @ Q.T), x @ K.T, x @ V.T
