"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).
"""

from . import convergence, diagnostics, gaussian, interpolation, kernels, plot
from ._checks import NonFiniteStateError
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
from .checkpoint import Checkpoint, solve_checkpointed
from .dynamics import AbstractDynamics
from .fit import FitResult, checkpointed_adjoint, fit
from .gaussian_solve import GaussianSolution, solve_gaussian
from .interpolation import AttentionPerceptron
from .measures import Gaussian
from .params import PiecewiseConstant
from .solve import Solution, layers, solve
from .spaces import Sphere, normalize, tangent_projection, uniform_sphere
from .sweep import LabeledArray, heatmap, sweep

__version__ = "0.1.0"

__all__ = [
    "AbstractAttention",
    "AbstractDynamics",
    "Checkpoint",
    "AttentionPerceptron",
    "FitResult",
    "Gaussian",
    "GaussianSolution",
    "L2Attention",
    "LabeledArray",
    "MultiHeadAttention",
    "NonFiniteStateError",
    "PiecewiseConstant",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "Solution",
    "Sphere",
    "UnnormalizedAttention",
    "checkpointed_adjoint",
    "convergence",
    "diagnostics",
    "fit",
    "heatmap",
    "interpolation",
    "gaussian",
    "kernels",
    "layers",
    "normalize",
    "plot",
    "solve",
    "solve_checkpointed",
    "sweep",
    "solve_gaussian",
    "tangent_projection",
    "uniform_sphere",
]
