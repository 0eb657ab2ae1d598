"""The one place that integrates: ``tp.solve`` over typed states, and the discrete layers.

:func:`solve` is one thin ``diffrax.diffeqsolve`` (:mod:`.solve`); the states it evolves own
their equations (:mod:`.states`: particles, the Gaussian closure, tracers, coupled systems,
plain ODEs; a density on the circle: :mod:`.circle`, its stationary branches:
:mod:`.circle_branches`); stop conditions are values (:mod:`.events`). Nothing here writes a
file: chunked, resumable runs are the runs layer's (:mod:`transformer_pde.runs`).
"""

from . import circle, circle_branches, quadrature, random_transformer
from .circle import CircleDensity, DensitySolution, UnderResolvedError, solve_density
from .events import AbstractBlowUp, BlowUp, BlowUpAtSaves
from .layers import layers
from .quadrature import AbstractRule, CircleRule, GaussHermiteRule, SphereRule
from .noise import AbstractBrownian, BrownianGrid, BrownianIncrements, BrownianTree, Noise
from .retracted import Retracted
from .solution import GaussianSolution, Solution
from .solve import solve
from .states import AbstractODE, AbstractState, Coupled, Gaussian, ODEState, Particles, Tracers, WithLogDensity

__all__ = ["AbstractBlowUp", "AbstractBrownian", "AbstractODE", "AbstractRule", "AbstractState", "BlowUp", "BlowUpAtSaves", "BrownianGrid", "BrownianIncrements",
           "BrownianTree", "CircleDensity", "CircleRule", "Coupled", "DensitySolution", "GaussHermiteRule",
           "Gaussian", "GaussianSolution", "Noise", "ODEState", "Particles", "Retracted", "Solution",
           "SphereRule", "Tracers", "UnderResolvedError", "WithLogDensity", "circle", "circle_branches",
           "layers", "quadrature", "random_transformer", "solve", "solve_density"]
