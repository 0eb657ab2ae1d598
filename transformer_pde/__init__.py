"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).

The house, by role (``docs/architecture.md``): :mod:`.kernels` (pair reductions) →
:mod:`.models` (every dynamics) → :mod:`.solvers` (the one place that integrates) →
:mod:`.diagnostics` and :mod:`.theory` (functions of states; closed forms) →
:mod:`.sweeps`, :mod:`.fitting`, :mod:`.convergence` → :mod:`.experiments` → :mod:`.cli`.
Importing the package does not import the experiments.
"""

from . import convergence, diagnostics, kernels, models, plot, solvers, theory
from ._checks import NonFiniteStateError
from .fitting import FitResult, checkpointed_adjoint, fit
from .measures import Gaussian, cap_sample
from .models import (
    MLP,
    NGPT,
    AbstractAttention,
    AbstractBilinearAttention,
    AbstractDynamics,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractManifoldDynamics,
    AbstractNormalizationScheme,
    AbstractNormalizedAttention,
    AbstractRetractedDynamics,
    AbstractSwitched,
    AttentionPerceptron,
    Block,
    GaussianHeads,
    L2Attention,
    LitMCircle,
    LNScaling,
    MeanShift,
    MixLN,
    MultiHeadAttention,
    Norm,
    PerceptronBlock,
    PeriLN,
    PostLN,
    PreLN,
    RandomBatch,
    Sharded,
    SigmoidAttention,
    SinkhornAttention,
    SinkhornPotentials,
    SoftmaxAttention,
    Sphere,
    SphereBlock,
    Switched,
    UnnormalizedAttention,
    normalize,
    polar,
    polar_velocity,
    sharding,
    tangent_projection,
    uniform_sphere,
)
from .params import PiecewiseConstant
from .solvers import Checkpoint, GaussianSolution, Retracted, Solution, layers, solve
from .sweeps import heatmap, sweep

__version__ = "0.1.0"

__all__ = [
    "AbstractAttention",
    "AbstractBilinearAttention",
    "AbstractDynamics",
    "AbstractGaussianClosure",
    "AbstractKernelAttention",
    "AbstractManifoldDynamics",
    "AbstractNormalizationScheme",
    "AbstractNormalizedAttention",
    "AbstractRetractedDynamics",
    "AbstractSwitched",
    "AttentionPerceptron",
    "Block",
    "Checkpoint",
    "FitResult",
    "Gaussian",
    "GaussianHeads",
    "GaussianSolution",
    "L2Attention",
    "LNScaling",
    "LitMCircle",
    "MLP",
    "MeanShift",
    "MixLN",
    "MultiHeadAttention",
    "NGPT",
    "NonFiniteStateError",
    "Norm",
    "PerceptronBlock",
    "PeriLN",
    "PiecewiseConstant",
    "PostLN",
    "PreLN",
    "RandomBatch",
    "Retracted",
    "Sharded",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "Solution",
    "Sphere",
    "SphereBlock",
    "Switched",
    "UnnormalizedAttention",
    "cap_sample",
    "checkpointed_adjoint",
    "convergence",
    "diagnostics",
    "fit",
    "heatmap",
    "kernels",
    "layers",
    "models",
    "normalize",
    "plot",
    "polar",
    "polar_velocity",
    "sharding",
    "solve",
    "solvers",
    "sweep",
    "tangent_projection",
    "theory",
    "uniform_sphere",
]
