r"""Softmax attention on R^d in the rescaled variable z = e^{−tV} x
(docs: math/attention.md#the-rescaled-model-and-the-spectrum-of-v).

With x = e^{tV} z the R^d model ẋ_i = Σ_j P_ij(x) V x_j becomes
ż_i = Σ_j P_ij(e^{tV} z) V (z_j − z_i), whose long-time limits (polytope vertices, parallel
hyperplanes, collapse) depend on the spectrum of V.
"""

from __future__ import annotations

import jax

from .attention.softmax import SoftmaxAttention
from .base import AbstractDynamics

__all__ = ["RescaledSoftmax"]


class RescaledSoftmax(AbstractDynamics):
    r"""ż_i = Σ_j P_ij(e^{tV} z) V (z_j − z_i): the unnormalized model in z = e^{−tV} x.

    Attributes:
        Q, K: ``(k, d)``; V: ``(d, d)``; scores ⟨Q e^{tV} z_i, K e^{tV} z_j⟩ (β = 1).
    """

    Q: jax.Array
    K: jax.Array
    V: jax.Array

    @property
    def dim(self):
        return self.V.shape[0]

    def vector_field(self, z, weights, t):
        E = jax.scipy.linalg.expm(t * self.V)
        attn = SoftmaxAttention(self.Q @ E, self.K @ E, self.V, 1.0)
        return attn.vector_field(z, weights, t) - z @ self.V.T

    def unscaled(self, z, t):
        """x = e^{tV} z."""
        return z @ jax.scipy.linalg.expm(t * self.V).T
