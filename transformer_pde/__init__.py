"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).
"""

from . import causal, diagnostics, kde, kernels, perceptron, plot, random_heads
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
from .causal import CausalAttention, LitMCircle
from .dynamics import AbstractDynamics
from .gaussian_solve import GaussianSolution
from .kde import MeanShift
from .measures import Gaussian
from .params import PiecewiseConstant
from .perceptron import PerceptronBlock
from .random_heads import GaussianHeads
from .solve import Solution, layers, solve
from .spaces import Sphere, normalize, tangent_projection, uniform_sphere

__version__ = "0.1.0"

__all__ = [
    "AbstractAttention",
    "AbstractDynamics",
    "CausalAttention",
    "Gaussian",
    "GaussianHeads",
    "GaussianSolution",
    "L2Attention",
    "LitMCircle",
    "MeanShift",
    "MultiHeadAttention",
    "PerceptronBlock",
    "PiecewiseConstant",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "Solution",
    "Sphere",
    "UnnormalizedAttention",
    "causal",
    "diagnostics",
    "kde",
    "kernels",
    "layers",
    "normalize",
    "perceptron",
    "plot",
    "random_heads",
    "solve",
    "tangent_projection",
    "uniform_sphere",
]
