"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (spec: ``shared/spec/``).

The house, by role (``docs/architecture.md``): :mod:`.kernels` (pair reductions) →
:mod:`.models` (every dynamics) → :mod:`.solvers` (the one place that integrates) →
:mod:`.diagnostics` and :mod:`.theory` (functions of states; closed forms) →
:mod:`.sweeps`, :mod:`.fitting`, :mod:`.convergence` → :mod:`.runs` (run directories,
resumable solves) → :mod:`.experiments` → :mod:`.cli`.
Importing the package does not import the experiments.
"""

from . import convergence, diagnostics, kernels, models, plot, runs, solvers, theory
from ._checks import NonFiniteStateError
from .fitting import FitResult, checkpointed_adjoint, fit
from .measures import Gaussian, cap_sample
from .models import *  # noqa: F403  (every dynamics is top-level: tp.SoftmaxAttention; list in models)
from .params import PiecewiseConstant
from .runs import Result
from .solvers import GaussianSolution, Retracted, Solution, layers, solve
from .sweeps import heatmap, sweep

__version__ = "0.1.0"

__all__ = [
    "FitResult",
    "Gaussian",
    "GaussianSolution",
    "NonFiniteStateError",
    "PiecewiseConstant",
    "Result",
    "Retracted",
    "Solution",
    "cap_sample",
    "checkpointed_adjoint",
    "convergence",
    "diagnostics",
    "fit",
    "heatmap",
    "kernels",
    "layers",
    "models",
    "plot",
    "runs",
    "solve",
    "solvers",
    "sweep",
    "theory",
]
__all__ += models.__all__
