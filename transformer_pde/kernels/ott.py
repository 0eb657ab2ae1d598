"""ott-jax point clouds whose log-sum-exp kernel streams through :func:`.exact.lse_average`.

Sinkhorn attention (the dot cost) and the Sinkhorn divergences of the diagnostics (the squared
Euclidean cost) never form an n x n cost matrix: O(n · block) memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from ott.geometry import pointcloud

from .exact import lse_average


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
                               block_size=self._batch_size)
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


__all__ = ["StreamingDotCloud", "StreamingSqEuclideanCloud"]
