"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).
"""

from . import (
    causal,
    convergence,
    diagnostics,
    gaussian,
    interpolation,
    kde,
    kernels,
    perceptron,
    plot,
    random_heads,
    sharding,
)
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
from .causal import CausalAttention, LitMCircle
from .checkpoint import Checkpoint, solve_checkpointed
from .dynamics import AbstractDynamics
from .fit import FitResult, checkpointed_adjoint, fit
from .gaussian_solve import GaussianSolution, solve_gaussian
from .interpolation import AttentionPerceptron
from .kde import MeanShift
from .measures import Gaussian
from .params import PiecewiseConstant
from .perceptron import PerceptronBlock
from .random_heads import GaussianHeads
from .sharding import Sharded
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
    "CausalAttention",
    "Gaussian",
    "GaussianHeads",
    "GaussianSolution",
    "L2Attention",
    "LabeledArray",
    "MultiHeadAttention",
    "NonFiniteStateError",
    "LitMCircle",
    "MeanShift",
    "PerceptronBlock",
    "PiecewiseConstant",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "Sharded",
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
    "causal",
    "kde",
    "kernels",
    "layers",
    "normalize",
    "perceptron",
    "plot",
    "random_heads",
    "sharding",
    "solve",
    "solve_checkpointed",
    "sweep",
    "solve_gaussian",
    "tangent_projection",
    "uniform_sphere",
]
