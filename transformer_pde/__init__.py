"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).

The house, by role (``docs/architecture.md``): :mod:`.kernels` (pair reductions) →
:mod:`.models` (every dynamics) → :mod:`.solvers` (the one place that integrates) →
:mod:`.diagnostics` and :mod:`.theory` (functions of states; closed forms) →
:mod:`.sweeps`, :mod:`.fitting`, :mod:`.convergence`, :mod:`.statistics` → :mod:`.experiments` →
:mod:`.cli`.
Importing the package does not import the experiments.
"""

from . import convergence, diagnostics, kernels, models, plot, solvers, statistics, theory
from ._checks import NonFiniteStateError
from .fitting import FitResult, checkpointed_adjoint, fit
from .models import *  # noqa: F403  (every dynamics is top-level: tp.SoftmaxAttention; list in models)
from .params import PiecewiseConstant
from .solvers import (
    BlowUp,
    Coupled,
    Gaussian,
    GaussianSolution,
    Particles,
    Retracted,
    Solution,
    Tracers,
    layers,
    solve,
)
from .solvers.checkpoint import Checkpoint
from .sweeps import heatmap, sweep

__version__ = "0.1.0"

__all__ = [
    "BlowUp",
    "Checkpoint",
    "Coupled",
    "FitResult",
    "Gaussian",
    "GaussianSolution",
    "NonFiniteStateError",
    "Particles",
    "PiecewiseConstant",
    "Retracted",
    "Solution",
    "Tracers",
    "checkpointed_adjoint",
    "convergence",
    "diagnostics",
    "fit",
    "heatmap",
    "kernels",
    "layers",
    "models",
    "plot",
    "solve",
    "solvers",
    "statistics",
    "sweep",
    "theory",
]
__all__ += models.__all__
