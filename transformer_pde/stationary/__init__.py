"""Stationary states of the mean field and their continuation in a parameter, with their linear
stability: :mod:`.circle` (S¹, densities by Newton and pseudo-arclength continuation,
docs: math/noise.md#stationary-branches), :mod:`.zonal` (zonal densities on S^{d−1}, the fold
K_c(β, d), docs: math/noise.md#stationary-branches-on-the-sphere); the continuation they share is
:mod:`.continuation`.
"""

from . import circle, continuation, zonal
from .circle import Branch, branch_from_uniform, spectrum
from .continuation import ContinuationError
from .zonal import Fold, ZonalBranch, critical_coupling, zonal_branch, zonal_spectrum

__all__ = ["Branch", "ContinuationError", "Fold", "ZonalBranch", "branch_from_uniform", "circle", "continuation",
           "critical_coupling", "spectrum", "zonal", "zonal_branch", "zonal_spectrum"]
