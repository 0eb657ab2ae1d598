r"""Softmax attention on R^d in the rescaled variable z = e^{−tV} x
(docs: math/attention.md#the-rescaled-model-and-the-spectrum-of-v).

With x = e^{tV} z the R^d model ẋ_i = Σ_j P_ij(x) V x_j becomes
ż_i = Σ_j P_ij(e^{tV} z) V (z_j − z_i), whose long-time limits (polytope vertices, parallel
hyperplanes, collapse) depend on the spectrum of V.
"""

from __future__ import annotations

import jax

from .._checks import as_float_array, check_finite
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

    def __init__(self, Q, K, V):
        Q, K, V = (check_finite(as_float_array(a, f"RescaledSoftmax.{m}"), f"RescaledSoftmax.{m}")
                   for m, a in (("Q", Q), ("K", K), ("V", V)))
        if Q.ndim != 2 or Q.shape != K.shape:
            raise ValueError(f"RescaledSoftmax: Q and K must both have shape (k, d), got Q {Q.shape} and "
                             f"K {K.shape}")
        d = Q.shape[1]
        if V.shape != (d, d):
            raise ValueError(f"RescaledSoftmax: V must be square with shape ({d}, {d}) to match Q, K of "
                             f"shape {Q.shape}, got V {V.shape}")
        self.Q, self.K, self.V = Q, K, V

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
