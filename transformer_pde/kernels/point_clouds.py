"""ott-jax point clouds whose log-sum-exp kernel streams through :func:`.exact.lse_average`, or
runs on the NUFFT Gaussian sum (:class:`FastDotCloud`).

Sinkhorn attention (the dot cost) and the Sinkhorn divergences of the diagnostics (the squared
Euclidean cost) never form an n x n cost matrix: O(n · block) memory. With scores in R^k,
k <= 3, each Sinkhorn half-iteration of Sinkhorn attention is a Gaussian sum:
:class:`FastDotCloud`, O(n + M log M) per half-iteration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from ott.geometry import costs, pointcloud

from .exact import DenseOrStreaming, Streaming, lse_average


def batch_layout(batch_size: int | None):
    """The exact kernel's layout for ott's ``batch_size`` (keys per block; None: automatic)."""
    return DenseOrStreaming() if batch_size is None else Streaming(key_block=int(batch_size))


class _StreamingCloud(pointcloud.PointCloud):
    """ott-jax point cloud whose log-sum-exp kernel streams.

    Sinkhorn in the log domain only touches the cost through ``apply_lse_kernel``
    (potential updates, marginals, the regularized cost), which here runs on
    :func:`transformer_pde.kernels.exact.lse_average` in blocks of ``batch_size`` keys:
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
                               layout=batch_layout(self._batch_size))
        avg = avg[:, 0]
        return eps * (lse + jnp.log(jnp.abs(avg))) + alpha_a, jnp.sign(avg)


@jax.tree_util.register_pytree_node_class
class StreamingDotCloud(_StreamingCloud):
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


@jax.tree_util.register_pytree_node_class
class FastDotCloud(_StreamingCloud):
    r"""Point cloud for the cost c(a, b) = −γ⟨a, b⟩ whose log-sum-exp kernel is the NUFFT
    Gaussian sum (the backend's checked ``fast_lse_average``, :mod:`.backends`).

    ott's log-domain Sinkhorn touches the cost only through ``apply_lse_kernel``: with potential
    h, ``eps·log Σ_j exp((h_j + γ⟨a_i, b_j⟩)/eps)`` is the log-normalizer of logits
    (γ/eps)⟨a_i, b_j⟩ + h_j/eps, a Gaussian sum in R^k for a = Qx, b = Kx in the plan's box. The
    backend's checks apply (``Fast`` raises outside the box, ``Auto`` recomputes unreliable rows
    exactly). Applications to a vector (``vec``, ott's implicit differentiation) run on the exact
    streaming kernel (blocks of ``batch_size`` keys).

    Args:
        x, y: a = Qx and b = Kx, rows in the plan's box.
        gamma: γ (a JAX scalar, traced under ``jit``; γ/ε must lie in the plan's window).
        backend: a bound ``Fast`` or ``Auto`` backend; plan: its plan for this dtype.
        batch_size, epsilon: as in ott's ``PointCloud``.
    """

    def __init__(self, x, y, gamma, *, backend, plan, batch_size=None, epsilon=None, **kwargs):
        kwargs.pop("cost_fn", None)
        super().__init__(x, y, cost_fn=costs.NegDotProduct(), batch_size=batch_size,
                         epsilon=epsilon, **kwargs)
        self.gamma, self.backend, self.plan = gamma, backend, plan

    @property
    def inv_scale_cost(self):
        return self.gamma

    def _split(self, a, b):
        return self.gamma, 0.0, 0.0

    def apply_lse_kernel(self, f, g, eps, vec=None, axis=0):
        if vec is not None:
            return super().apply_lse_kernel(f, g, eps, vec, axis)
        a, b, h = (self.x, self.y, g) if axis == 1 else (self.y, self.x, f)
        ones = jnp.ones((b.shape[0], 1), a.dtype)
        _, lse = self.backend.fast_lse_average(self.plan, a, b, ones, h / eps, self.gamma / eps)
        return eps * lse, jnp.ones_like(lse)

    def tree_flatten(self):
        children, aux = super().tree_flatten()
        aux = dict(aux, backend=self.backend, plan=self.plan)
        aux.pop("scale_cost", None)
        return (*children, self.gamma), aux

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        x, y, epsilon, _, gamma = children
        return cls(x, y, gamma, epsilon=epsilon, **aux_data)


__all__ = ["FastDotCloud", "StreamingDotCloud", "StreamingSqEuclideanCloud"]
