"""transformer_pde: self-attention dynamics and the Transformer PDE, in JAX.

Tokens move as interacting particles, dx_i/dt = Γ_μ(x_i), and their empirical measure μ
follows the continuity equation ∂_t μ + div(μ Γ_μ) = 0 (docs: math/index.md).

The house, by role (``docs/architecture.md``): :mod:`.kernels` (pair reductions) →
:mod:`.models` (every dynamics) → :mod:`.solvers` (the one place that integrates) →
:mod:`.measures` (quadrature rules) and :mod:`.stationary` (stationary states, continuation) →
:mod:`.diagnostics` and :mod:`.theory` (functions of states; closed forms) →
:mod:`.sweeps`, :mod:`.fitting`, :mod:`.convergence`, :mod:`.statistics` → :mod:`.runs` (run directories,
resumable solves) → :mod:`.experiments` → :mod:`.cli`.

Importing the package imports nothing but its lazy loader (PEP 562): a submodule, or a name it
exports (``tp.solve``, ``tp.SoftmaxAttention``), is imported on first access, so the command line
can print text without loading JAX. Importing the package never imports the experiments.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from ._lazy import stub_exports as _stub_exports

__version__ = "0.1.0"

_SUBMODULES = ("convergence", "diagnostics", "fitting", "kernels", "measures", "models", "params", "plot", "runs",
               "solvers", "stationary", "statistics", "sweeps", "theory")

# exported name -> the module that defines it (the models' names below)
_NAMES = {
    "NonFiniteStateError": "._checks",
    "BestIterate": ".fitting", "FitResult": ".fitting", "checkpointed_adjoint": ".fitting", "fit": ".fitting",
    "PiecewiseConstant": ".params",
    "Result": ".runs",
    "BlowUp": ".solvers", "BlowUpAtSaves": ".solvers", "BrownianGrid": ".solvers", "BrownianIncrements": ".solvers", "BrownianTree": ".solvers", "CircleDensity": ".solvers", "Coupled": ".solvers", "Gaussian": ".solvers", "GaussianSolution": ".solvers",
    "AbstractNoise": ".solvers", "CommonNoise": ".solvers", "Noise": ".solvers",
    "Particles": ".solvers", "CircleRule": ".measures", "SphereRule": ".measures", "GaussHermiteRule": ".measures", "ResidualLayer": ".solvers", "Retracted": ".solvers", "Solution": ".solvers", "SphereDensity": ".solvers", "Tracers": ".solvers",
    "WithLogDensity": ".solvers",
    "layers": ".solvers", "raise_if_failed": ".solvers", "solve": ".solvers", "solve_density": ".solvers",
    "ZonalDensity": ".solvers",
    "heatmap": ".sweeps", "sweep": ".sweeps",
}
# the models' names: listed once, in the stub models/__init__.pyi, read here without importing them
_NAMES.update(dict.fromkeys(_stub_exports(os.path.join(os.path.dirname(__file__), "models", "__init__.py")), ".models"))

__all__ = sorted(_NAMES) + [m for m in _SUBMODULES if m != "params"]

if TYPE_CHECKING:  # what static tools see: the same names, imported eagerly
    from . import (  # noqa: F401
        convergence,
        diagnostics,
        fitting,
        kernels,
        measures,
        models,
        params,
        plot,
        runs,
        solvers,
        stationary,
        statistics,
        sweeps,
        theory,
    )
    from ._checks import NonFiniteStateError  # noqa: F401
    from .fitting import BestIterate, FitResult, checkpointed_adjoint, fit  # noqa: F401
    from .measures import CircleRule, GaussHermiteRule, SphereRule  # noqa: F401
    from .models import *  # noqa: F403
    from .params import PiecewiseConstant  # noqa: F401
    from .runs import Result  # noqa: F401
    from .solvers import (  # noqa: F401
        AbstractNoise,
        BlowUp,
        BlowUpAtSaves,
        BrownianGrid,
        BrownianIncrements,
        BrownianTree,
        CircleDensity,
        CommonNoise,
        Coupled,
        Gaussian,
        GaussianSolution,
        Noise,
        Particles,
        ResidualLayer,
        Retracted,
        Solution,
        SphereDensity,
        Tracers,
        WithLogDensity,
        ZonalDensity,
        layers,
        raise_if_failed,
        solve,
        solve_density,
    )
    from .sweeps import heatmap, sweep  # noqa: F401


def __getattr__(name: str):
    if name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
