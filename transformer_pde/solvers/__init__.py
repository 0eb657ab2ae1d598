"""The one place that integrates: ``tp.solve`` over typed states, and the discrete layers.

:func:`solve` is one thin ``diffrax.diffeqsolve`` (:mod:`.solve`, the only call to it); the states it
evolves own their equations (:mod:`.states`: particles, the Gaussian closure, tracers, coupled
systems, plain ODEs; densities checked by :func:`solve_density` (:mod:`.density`): on the circle,
:mod:`.circle`, on S², :mod:`.sphere` with its transforms :mod:`.sphere_harmonics`, zonal densities
on S^{d−1}, :mod:`.zonal`; stationary branches are :mod:`transformer_pde.stationary`'s); noise is
a family of values (:mod:`.noise`: independent, common) drawing Brownian paths
(:mod:`.brownian`); steps stop at a dynamics' switches (:mod:`.switches`); stop conditions are
values (:mod:`.events`). :func:`layers` is the residual map, Euler step by step with the same
noise increment. Nothing here writes a file: chunked,
resumable runs are the runs layer's (:mod:`transformer_pde.runs`).
"""

from . import circle, random_transformer, sphere, sphere_harmonics, zonal
from .brownian import AbstractBrownian, BrownianGrid, BrownianIncrements, BrownianTree
from .circle import CircleDensity
from .density import AbstractDensity, DensitySolution, UnderResolvedError, solve_density
from .events import AbstractBlowUp, BlowUp, BlowUpAtSaves
from .layers import layers
from .noise import AbstractNoise, CommonNoise, Noise
from .residual import ResidualLayer
from .retracted import Retracted
from .solution import GaussianSolution, Solution, raise_if_failed
from .solve import solve
from .sphere import SphereDensity
from .states import (
    AbstractNoisyState,
    AbstractODE,
    AbstractState,
    Coupled,
    Gaussian,
    ODEState,
    Particles,
    Tracers,
    WithLogDensity,
)
from .zonal import ZonalDensity

__all__ = ["AbstractBlowUp", "AbstractBrownian", "AbstractDensity", "AbstractNoise", "AbstractNoisyState",
           "AbstractODE", "AbstractState", "BlowUp", "BlowUpAtSaves", "BrownianGrid", "BrownianIncrements",
           "BrownianTree",
           "CircleDensity", "CommonNoise", "Coupled", "DensitySolution",
           "Gaussian", "GaussianSolution", "Noise", "ODEState", "Particles", "ResidualLayer", "Retracted", "Solution",
           "SphereDensity", "Tracers", "UnderResolvedError", "WithLogDensity", "circle",
           "ZonalDensity",
           "layers", "raise_if_failed", "random_transformer", "solve", "solve_density", "sphere",
           "sphere_harmonics", "zonal"]
