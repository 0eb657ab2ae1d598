"""Sinkhorn attention (Sander, Ablin, Blondel, Peyré 2022; euclidean.md §2d), through ott-jax."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from ott.geometry import costs, geometry, pointcloud
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn

from .._checks import check_points, check_scalar, check_weights
from .._types import Param
from ..kernels import choose_path, lse_average, softmax_average
from ..params import evaluate
from .base import AbstractAttention, check_qkv, matrix_dim, scalar_param


class _StreamingCloud(pointcloud.PointCloud):
    """ott-jax point cloud whose log-sum-exp kernel streams.

    Sinkhorn in the log domain only touches the cost through ``apply_lse_kernel``
    (potential updates, marginals, the regularized cost), which here runs on
    :func:`transformer_pde.kernels.lse_average` in blocks of ``batch_size`` keys:
    O(n · block) memory, the cost matrix is never formed. A subclass writes its cost as
    s·c(a, b) = −m⟨a, b⟩ − α(a) − α(b) (s = ``inv_scale_cost``) through :meth:`_split`.
    """

    def _split(self, a, b):
        """(m, α(a), α(b)) of the cost, see the class docstring."""
        raise NotImplementedError

    def apply_lse_kernel(self, f, g, eps, vec=None, axis=0):
        # ott's contract: eps·log Σ_j exp((h_j − s·c_ij)/eps) [· vec_j] over the reduced axis
        a, b, h = (self.x, self.y, g) if axis == 1 else (self.y, self.x, f)
        m, alpha_a, alpha_b = self._split(a, b)
        values = jnp.ones((b.shape[0], 1), a.dtype) if vec is None else vec[:, None]
        avg, lse = lse_average(a * (m / eps), b, values, (h + alpha_b) / eps,
                               block_size=self._batch_size)
        avg = avg[:, 0]
        return eps * (lse + jnp.log(jnp.abs(avg))) + alpha_a, jnp.sign(avg)


@jax.tree_util.register_pytree_node_class
class _StreamingDotCloud(_StreamingCloud):
    """Streaming point cloud for the cost c(x, y) = −⟨x, y⟩ (Sinkhorn attention)."""

    def _split(self, a, b):
        return self.inv_scale_cost, 0.0, 0.0


@jax.tree_util.register_pytree_node_class
class StreamingSqEuclideanCloud(_StreamingCloud):
    """Streaming point cloud for the cost c(x, y) = |x − y|² = |x|² + |y|² − 2⟨x, y⟩.

    Sinkhorn divergences between clouds of 10^5+ points never form the cost matrix (ott's own
    ``batch_size=`` path fails under jax 0.10).
    """

    def _split(self, a, b):
        s = self.inv_scale_cost
        return 2.0 * s, -s * jnp.sum(a * a, axis=1), -s * jnp.sum(b * b, axis=1)


class SinkhornPotentials(eqx.Module):
    """Outcome of the Sinkhorn solve behind one velocity evaluation."""

    g: jax.Array
    """Key potential divided by ε (the key bias of the attention logits)."""
    converged: jax.Array
    n_iters: jax.Array
    error: jax.Array
    """Last marginal error reported by ott-jax."""


class SinkhornAttention(AbstractAttention):
    r"""Doubly stochastic attention (euclidean.md §2d).

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
        block_size: kernel path (:func:`transformer_pde.kernels.choose_path`). On the
            streaming path the n x n cost is never stored: ott-jax's Sinkhorn runs on a
            ``PointCloud(βQx, Kx, NegDotProduct())`` whose log-sum-exp kernel streams
            (:class:`_StreamingDotCloud`), and the attention average streams too.
    """

    Q: Param
    K: Param
    V: Param
    beta: jax.Array
    epsilon: jax.Array
    threshold: float = eqx.field(static=True)
    max_iterations: int = eqx.field(static=True)
    throw: bool = eqx.field(static=True)
    block_size: int | tuple[int, int] | None = eqx.field(static=True)

    def __init__(self, Q, K, V, beta=1.0, *, epsilon=1.0, threshold: float = 1e-6,
                 max_iterations: int = 2000, throw: bool = True,
                 block_size: int | tuple[int, int] | None = None):
        name = type(self).__name__
        self.Q, self.K, self.V = check_qkv(name, Q, K, V, beta)
        check_scalar(epsilon, f"{name}.epsilon", positive=True)
        if not threshold > 0:
            raise ValueError(f"{name}.threshold must be > 0, got {threshold}")
        if int(max_iterations) < 1:
            raise ValueError(f"{name}.max_iterations must be >= 1, got {max_iterations}")
        self.beta = scalar_param(beta)
        self.epsilon = scalar_param(epsilon)
        self.threshold = float(threshold)
        self.max_iterations = int(max_iterations)
        self.throw = bool(throw)
        choose_path(1, 1, block_size)  # validates block_size
        self.block_size = block_size

    @property
    def dim(self):
        return matrix_dim(self.V)

    def _potentials(self, x, weights, t) -> SinkhornPotentials:
        Q, K = evaluate(self.Q, t), evaluate(self.K, t)
        path = choose_path(x.shape[0], x.shape[0], self.block_size)
        if path == 0:
            scores = (x @ Q.T) @ (x @ K.T).T  # s_ij = <Q x_i, K x_j>, row i = query
            cost = -self.beta * scores
            geom = geometry.Geometry(cost_matrix=cost, epsilon=self.epsilon)
        else:
            # the same cost c_ij = -β<Q x_i, K x_j>, recomputed in blocks of rows: O(n·block)
            geom = _StreamingDotCloud(self.beta * (x @ Q.T), x @ K.T, costs.NegDotProduct(),
                                      batch_size=path[1], epsilon=self.epsilon)
        problem = linear_problem.LinearProblem(geom, a=weights, b=weights)
        # inner_iterations=1 so the iteration count and the check happen every step
        solver = sinkhorn.Sinkhorn(threshold=self.threshold, max_iterations=self.max_iterations,
                                   inner_iterations=1)
        out = solver(problem)
        # ott's plan is exp((f_i + g_j - C_ij)/ε); row i, renormalized, is the conditional law.
        err = out.errors[jnp.maximum(out.n_iters - 1, 0)]
        return SinkhornPotentials(out.g / self.epsilon, out.converged, out.n_iters, err)

    def potentials(self, x, weights=None, t=0.0) -> SinkhornPotentials:
        """Solve the self-transport problem of μ and report its convergence."""
        x = check_points(x, "x", self.dim)
        w = check_weights(weights, x.shape[0], x.dtype)
        return self._potentials(x, w, jnp.asarray(t, x.dtype))

    def _field(self, queries, x, weights, t, query_offset=0):
        pot = self._potentials(x, weights, t)
        g = pot.g
        if self.throw:
            g = eqx.error_if(g, ~pot.converged,
                             f"Sinkhorn attention did not converge in max_iterations="
                             f"{self.max_iterations} (threshold={self.threshold}); raise "
                             "max_iterations or epsilon, or pass throw=False and inspect "
                             "SinkhornAttention.potentials(x)")
        Q, K, V = evaluate(self.Q, t), evaluate(self.K, t), evaluate(self.V, t)
        q = (self.beta / self.epsilon) * (queries @ Q.T)
        return softmax_average(q, x @ K.T, x @ V.T, g, block_size=self.block_size)

    def gaussian_velocity(self, mean, cov, t=0.0):
        from ..gaussian import sinkhorn_moments

        return sinkhorn_moments(self, mean, cov, t)
