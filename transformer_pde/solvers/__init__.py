"""The one place that integrates: ``tp.solve`` over typed states, and the discrete layers.

:func:`solve` is one thin ``diffrax.diffeqsolve`` (:mod:`.solve`); the states it evolves own
their equations (:mod:`.states`: particles, the Gaussian closure, tracers, coupled systems,
plain ODEs); stop conditions are values (:mod:`.events`). Nothing here writes a file: chunked,
resumable runs are the runs layer's (:mod:`transformer_pde.runs`).
"""

from . import random_transformer
from .events import BlowUp
from .layers import layers
from .noise import AbstractBrownian, BrownianIncrements, BrownianTree, Noise
from .retracted import Retracted
from .solution import GaussianSolution, Solution
from .solve import solve
from .states import AbstractODE, AbstractState, Coupled, Gaussian, ODEState, Particles, Tracers

__all__ = ["AbstractBrownian", "AbstractODE", "AbstractState", "BlowUp", "BrownianIncrements", "BrownianTree", "Coupled", "Gaussian", "GaussianSolution", "Noise", "ODEState",
           "Particles", "Retracted", "Solution", "Tracers", "layers", "random_transformer", "solve"]
