r"""Blurring mean shift: self-attention on R^d with a Gaussian kernel
(docs: math/attention.md#mean-shift-and-kde-modes).

dx_i/dt = Σ_j softmax_j(−β|x_i − x_j|²/2)(x_j − x_i) = β^{-1} ∂_x log P̂_{μ_t}(x_i): ℓ² attention
minus the identity. Its metastable clusters track the modes of the Gaussian KDE
(:mod:`transformer_pde.diagnostics.kde`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._checks import check_scalar
from ..kernels import softmax_average
from ..kernels.exact import unchecked_log_weights
from ..params import scalar_param
from .base import AbstractDynamics

__all__ = ["MeanShift"]


class MeanShift(AbstractDynamics):
    r"""Blurring mean shift = self-attention on R with a Gaussian kernel
    (docs: math/attention.md#mean-shift-and-kde-modes):

    $$\dot x_i=\frac{\sum_j w_j e^{-\beta(x_i-x_j)^2/2}(x_j-x_i)}{\sum_j w_j e^{-\beta(x_i-x_j)^2/2}}
    =\frac1\beta\,\partial_x\log\hat P_{\mu_t}(x_i).$$

    Any dimension d works (|x_i − x_j|²); the KDE link is for d = 1.
    """

    beta: jax.Array

    def __init__(self, beta):
        beta = check_scalar(beta, "MeanShift.beta", positive=True)
        self.beta = scalar_param(beta)

    @property
    def dim(self):
        return None

    def vector_field(self, x, weights, t):
        # −β|x_i − x_j|²/2 = β⟨x_i, x_j⟩ − β|x_j|²/2 − (row constant)
        bias = -self.beta * jnp.sum(x * x, axis=-1) / 2 + unchecked_log_weights(weights)
        return softmax_average(self.beta * x, x, x, bias) - x
