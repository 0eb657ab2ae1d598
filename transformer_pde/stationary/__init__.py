"""Stationary states of the mean field and their continuation in a parameter, with their linear
stability: :mod:`.circle` (S¹, densities by Newton and pseudo-arclength continuation,
docs: math/noise.md#stationary-branches). S^{d−1} has no module here yet.
"""

from . import circle
from .circle import Branch, ContinuationError, branch_from_uniform, spectrum

__all__ = ["Branch", "ContinuationError", "branch_from_uniform", "circle", "spectrum"]
