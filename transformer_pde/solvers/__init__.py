"""The one place that integrates: particles, the Gaussian closure, layers, SDEs, checkpointed runs.

:func:`solve` is the public entry point; :mod:`.core` holds the only call to
``diffrax.diffeqsolve`` and the :class:`Retracted` solver wrapper.
"""

from .api import solve
from .checkpoint import DEFAULT_EVERY, Checkpoint
from .core import Retracted, integrate
from .gaussian import GaussianSolution
from .particles import Solution, layers

__all__ = ["DEFAULT_EVERY", "Checkpoint", "GaussianSolution", "Retracted", "Solution", "integrate",
           "layers", "solve"]
