"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).
"""

from . import diagnostics, kernels, plot, sharding
from .attention import (
    AbstractAttention,
    L2Attention,
    MultiHeadAttention,
    SigmoidAttention,
    SinkhornAttention,
    SinkhornPotentials,
    SoftmaxAttention,
    UnnormalizedAttention,
)
from .dynamics import AbstractDynamics
from .gaussian_solve import GaussianSolution
from .measures import Gaussian
from .params import PiecewiseConstant
from .sharding import Sharded
from .solve import Solution, layers, solve
from .spaces import Sphere, normalize, tangent_projection, uniform_sphere

__version__ = "0.1.0"

__all__ = [
    "AbstractAttention",
    "AbstractDynamics",
    "Gaussian",
    "GaussianSolution",
    "L2Attention",
    "MultiHeadAttention",
    "PiecewiseConstant",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "Sharded",
    "SoftmaxAttention",
    "Solution",
    "Sphere",
    "UnnormalizedAttention",
    "diagnostics",
    "kernels",
    "layers",
    "normalize",
    "plot",
    "sharding",
    "solve",
    "tangent_projection",
    "uniform_sphere",
]
