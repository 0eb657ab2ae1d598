"""Sinkhorn attention (Sander, Ablin, Blondel, Peyré 2022; docs: math/attention.md#sinkhorn-attention), through
ott-jax."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import (as_float_array, check_covariance, check_finite, check_int, check_points, check_scalar,
                        check_weights, is_concrete, runtime_check)
from ..._linalg import sqrtm_psd, symmetrize
from ..._types import Param
from ...kernels.backends import AbstractBackend, bind_backend
from ...kernels.reduction import SoftmaxReduction
from ...params import bilinear_params, evaluate, scalar_param
from .base import (
    AbstractAttention,
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractNormalizedAttention,
)


class SinkhornPotentials(eqx.Module):
    """Outcome of the Sinkhorn solve behind one velocity evaluation."""

    g: jax.Array
    """Key potential divided by ε (the key bias of the attention logits)."""
    converged: jax.Array
    n_iters: jax.Array
    error: jax.Array
    """Last marginal error reported by ott-jax."""


class SinkhornAttention(AbstractBilinearAttention, AbstractKernelAttention, AbstractNormalizedAttention,
                        AbstractGaussianClosure):
    r"""Doubly stochastic attention (docs: math/attention.md#sinkhorn-attention).

    With Ã = βA/ε (A = KᵀQ), let π(dx,dy) = e^{f(x)+g(y)+yᵀÃx} μ(dx)μ(dy) be the
    self-coupling of μ with both marginals equal to μ: the entropic OT plan of μ to itself
    for the cost c(x, y) = −β⟨Qx, Ky⟩ and regularization ε. Then

    $$\Gamma_\mu(x)=\mathbb E_\pi[\,Vy\mid x\,]=\frac{\int e^{g(y)+y^\top\tilde Ax}\,Vy\,d\mu(y)}
    {\int e^{g(y)+y^\top\tilde Ax}\,d\mu(y)}.$$

    The potentials come from ott-jax's Sinkhorn solver with explicit ``epsilon`` (never its
    data-dependent default). The conditional expectation is formed by row normalization,
    which also defines the field off the support (f extends as the log-partition).

    Args:
        Q, K, V, beta: as in :class:`SoftmaxAttention`.
        epsilon: entropic regularization ε > 0 (ε = 1 in the authors' code).
        threshold: ott-jax marginal-error tolerance.
        max_iterations: Sinkhorn iteration cap.
        throw: raise (``eqx.error_if``) when Sinkhorn does not converge; otherwise use
            :meth:`potentials` to inspect convergence yourself.
        backend: as in :class:`SoftmaxAttention` (γ = β/ε, ε concrete when built). With
            ``Exact(layout)`` streaming, the n x n cost is never stored: ott-jax's Sinkhorn runs
            on a ``PointCloud(βQx, Kx, NegDotProduct())`` whose log-sum-exp kernel streams
            (:class:`transformer_pde.kernels.point_clouds.StreamingDotCloud`), and the attention
            average streams too. On the fast path every Sinkhorn half-iteration is a Gaussian sum
            (:class:`transformer_pde.kernels.point_clouds.FastDotCloud`) and so is the attention average.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    epsilon: jax.Array
    threshold: float = eqx.field(static=True)
    max_iterations: int = eqx.field(static=True)
    throw: bool = eqx.field(static=True)
    backend: AbstractBackend = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, epsilon=1.0, threshold: float = 1e-6,
                 max_iterations: int = 2000, throw: bool = True,
                 backend: AbstractBackend | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V, self.beta = bilinear_params(name, Q, K, V, beta)
        epsilon = check_scalar(epsilon, f"{name}.epsilon", positive=True)
        check_scalar(threshold, f"{name}.threshold", positive=True)
        check_int(max_iterations, f"{name}.max_iterations", minimum=1)
        self.epsilon = scalar_param(epsilon, f"{name}.epsilon")
        self.threshold = float(threshold)
        self.max_iterations = int(max_iterations)
        self.throw = bool(throw)
        factor = 1.0 / float(self.epsilon) if is_concrete(self.epsilon) else None
        self.backend = bind_backend(backend, name, Q=self.Q, K=self.K, beta=self.beta,
                                    gamma_factor=factor)

    def _value_width(self):
        return self.dim

    def _potentials(self, x, weights, t) -> SinkhornPotentials:
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        # the cost c_ij = -β<Q x_i, K x_j> (row i = query), its kernel computed by the backend
        geom = self.backend.dot_cost_geometry(x @ Q.T, x @ K.T, self.beta, epsilon=self.epsilon,
                                              dtype=x.dtype)
        from ott.problems.linear import linear_problem  # ott only where Sinkhorn runs
        from ott.solvers.linear import sinkhorn

        problem = linear_problem.LinearProblem(geom, a=weights, b=weights)
        # inner_iterations=1 so the iteration count and the check happen every step
        solver = sinkhorn.Sinkhorn(threshold=self.threshold, max_iterations=self.max_iterations,
                                   inner_iterations=1)
        with jax.numpy_rank_promotion("allow"):  # ott broadcasts implicitly inside
            out = solver(problem)
        # ott's plan is exp((f_i + g_j - C_ij)/ε); row i, renormalized, is the conditional law.
        err = out.errors[jnp.maximum(out.n_iters - 1, 0)]
        return SinkhornPotentials(out.g / self.epsilon, out.converged, out.n_iters, err)

    def potentials(self, x, weights=None, t=0.0) -> SinkhornPotentials:
        """Solve the self-transport problem of μ and report its convergence."""
        x = check_points(x, "x", self.dim)
        w = check_weights(weights, x.shape[0], x.dtype)
        return self._potentials(x, w, jnp.asarray(t, x.dtype))

    def _reduction(self, queries, x, g, t):
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        return SoftmaxReduction(queries @ Q.T, x @ K.T, x @ V.T, g, self.beta / self.epsilon,
                                x.dtype)

    def _reductions(self, queries, x, weights, t, causal=False):
        if causal:  # the potentials balance the whole measure: no key mask keeps them
            raise ValueError("SinkhornAttention cannot be causal (its potentials balance every token against "
                             "every other); kernel_report(..., causal=True) does not apply")
        return [self._reduction(queries, x, self._potentials(x, weights, t).g, t)]

    # the potentials need the whole measure: every device's tokens are gathered
    shard_field = AbstractAttention.shard_field

    def query_field(self, queries, x, weights, t, query_offset=0):
        pot = self._potentials(x, weights, t)
        g = pot.g
        if self.throw:
            g = runtime_check(g, ~pot.converged,
                              f"Sinkhorn attention did not converge in max_iterations="
                              f"{self.max_iterations} (threshold={self.threshold}); raise "
                              "max_iterations or epsilon, or pass throw=False and inspect "
                              "SinkhornAttention.potentials(x)")
        avg, _ = self.backend.lse_average(self._reduction(queries, x, g, t))
        return avg

    def affine_field(self, mean, cov, t=0.0):
        r"""Sinkhorn attention (docs: math/gaussian.md#moment-equations) with Ã = βKᵀQ/ε: y | x ~
        N(α + PÃ(x − α), P) (:func:`sinkhorn_conditional_cov`), so Γ(x) = V(α + PÃ(x − α)):

        $$J = VP\tilde A,\qquad c = V\alpha - J\alpha,\qquad
        \dot\Sigma=VP\tilde A\Sigma+\Sigma\tilde A^\top PV^\top.$$

        Valid for every A (singular included) and every ε > 0.
        """
        V = evaluate(self.V, t)
        At = self.score_matrix(t) / self.epsilon
        J = V @ _conditional_cov(cov, At) @ At
        return J, V @ mean - J @ mean


def sinkhorn_conditional_cov(cov, At):
    r"""P ≻ 0 solving P + PÃΣÃᵀP = Σ (docs: math/gaussian.md#moment-equations), in the form with no inverse of Ã:

    $$P=2\,\Sigma^{1/2}\big(I+(I+4\Sigma^{1/2}\tilde A\Sigma\tilde A^\top\Sigma^{1/2})^{1/2}\big)^{-1}\Sigma^{1/2}.$$

    P is the covariance of y | x under the entropic self-coupling of N(α, Σ).

    Args:
        cov: Σ, ``(d, d)`` symmetric positive semi-definite; At: Ã, ``(d, d)``; both finite
            (ValueError naming the bad one; ``eqx.error_if`` when traced).
    """
    cov = check_finite(as_float_array(cov, "cov"), "cov")
    At = check_finite(as_float_array(At, "At"), "At")
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"cov must be a square (d, d) matrix, got shape {cov.shape}")
    if At.shape != cov.shape:
        raise ValueError(f"At must have shape {cov.shape} to match cov, got {At.shape}")
    return _conditional_cov(check_covariance(cov, "cov"), At)


def _conditional_cov(cov, At):
    """:func:`sinkhorn_conditional_cov` unchecked (the Gaussian closure's hot path)."""
    d = cov.shape[0]
    eye = jnp.eye(d, dtype=cov.dtype)
    R = sqrtm_psd(cov)
    inner = sqrtm_psd(eye + 4.0 * R @ At @ cov @ At.T @ R)
    return symmetrize(2.0 * R @ jnp.linalg.solve(eye + inner, R))
