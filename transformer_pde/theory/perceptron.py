"""Stationary measures of the perceptron block (sphere.md §7, Perc)."""

from __future__ import annotations

import jax.numpy as jnp

from ..models.perceptron import PerceptronBlock
from ..models.sphere import tangent_projection


def stationarity_residual(block: PerceptronBlock, positions, masses):
    r"""max_k |P⊥_{z_k}(Σ_l m_l e^{β⟨z_k,z_l⟩} z_l + Σ_j ω_j σ(a_j·z_k) a_j)| for μ = Σ_k m_k δ_{z_k}.

    Zero exactly when the atomic measure is a critical point of E_{β,ϑ} (sphere.md §7).
    """
    z = jnp.asarray(positions)
    v = tangent_projection(z, block.raw_field(z, jnp.asarray(masses, z.dtype)))
    return float(jnp.max(jnp.linalg.norm(v, axis=-1)))


__all__ = ["stationarity_residual"]
