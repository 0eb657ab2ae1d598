"""Small dense linear algebra shared by the models, the Gaussian closure and the distances."""

from __future__ import annotations

import jax.numpy as jnp


def symmetrize(m):
    """(M + Mᵀ)/2 over the last two axes."""
    return 0.5 * (m + jnp.swapaxes(m, -1, -2))


def sqrtm_psd(S):
    """Symmetric square root of a positive semi-definite matrix (eigh; negative rounding clipped).
    Leading axes are batch axes."""
    lam, U = jnp.linalg.eigh(symmetrize(S))
    return (U * jnp.sqrt(jnp.clip(lam, 0.0))[..., None, :]) @ jnp.swapaxes(U, -1, -2)
