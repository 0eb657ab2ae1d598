"""The logistic law of the mean overlap of random-heads Transformers
(docs: math/random_heads.md#overlaps-and-the-logistic-law).

For β ∈ [0, 1] the mean overlap m = n^{-2} Σ_ij ⟨x_i, x_j⟩ of the random-heads chain
(:mod:`transformer_pde.models.random_heads`) follows u' = u(1 − u) in the diffusive clock, up to
O(1/d)."""

from __future__ import annotations

import numpy as np

from .._checks import check_real


def logistic(u0, s):
    """Solution of u' = u(1 − u), u(0) = u0: u0 e^s/(1 − u0 + u0 e^s) (the overlap ODE of
    equiangular data in the diffusive clock, up to O(1/d))."""
    check_real(u0, "u0")
    s = np.asarray(check_real(s, "s"), dtype=float)
    return u0 * np.exp(s) / (1 - u0 + u0 * np.exp(s))


__all__ = ["logistic"]
