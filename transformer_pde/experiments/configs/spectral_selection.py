"""The `spectral-selection` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.spectral_selection`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.spectral_selection"


@dataclasses.dataclass(frozen=True)
class SpectralSelectionConfig(Options):
    n: Annotated[int, Ge(2)] = 32
    """the number of tokens."""
    dominant: tuple[float, ...] = (1.0, 0.6, -0.8)
    """eigenvalues of V with a dominant positive one (λ_1 > |λ_l|), d = their number."""
    negative: tuple[float, ...] = (-0.3, -0.6, -1.0)
    """eigenvalues of a negative definite V, as many as ``dominant``."""
    beta: Annotated[float, Gt(0)] = 0.5
    """inverse temperature of the two cases (0.5: the split along e_1 of ``dominant`` is unstable)."""
    positives: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2)
    """λ₊ of the circle sweep V = diag(λ₊, −1), each > 0."""
    sweep_beta: Annotated[float, Gt(0)] = 1.0
    """inverse temperature of the circle sweep."""
    runs: Annotated[int, Ge(1)] = 8
    """random starts per case and per λ₊."""
    t1: Annotated[float, Gt(0)] = 150.0
    """end time of every run (the end state is classified there)."""
    num_saves: Annotated[int, Ge(2)] = 61
    """saves of the two cases' trajectories, geometric in t."""
    tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-3
    """a token is at ±e_k when |⟨x, e_k⟩| > 1 − tol."""
    rtol: Annotated[float, Gt(0)] = 1e-7
    """relative tolerance of the adaptive solves."""
    seed: int = 0
    """seed of the rotations and the random starts."""

    def validate(self):
        if len(self.dominant) < 2 or len(self.negative) != len(self.dominant):
            raise ValueError(f"dominant and negative must give the same number d >= 2 of eigenvalues, got "
                             f"{self.dominant} and {self.negative}")
        top = int(np.argmax(np.abs(self.dominant)))
        if not (self.dominant[top] > 0 and sum(abs(v) >= self.dominant[top] for v in self.dominant) == 1):
            raise ValueError(f"dominant must have one positive eigenvalue above every other |λ|, got {self.dominant}")
        if any(not v < 0 for v in self.negative):
            raise ValueError(f"negative must be negative definite (every eigenvalue < 0), got {self.negative}")
        if any(not v > 0 for v in self.positives):
            raise ValueError(f"positives must all be > 0, got {self.positives}")

    def footprint(self):
        return {"saved trajectories": sizes(self, ("cases", 2), "runs", "num_saves", "n", ("d", len(self.dominant))),
                "end states of the sweep": sizes(self, "positives", "runs", "n", ("d", 2))}


register(Experiment(
    "spectral-selection", "symmetric attention (QᵀK = V = Vᵀ): tokens align with a dominant positive eigenvector, "
    "split by sign along the most negative one when V ≺ 0; end states against the pure-mode stability criteria",
    SpectralSelectionConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=8, positives=(0.3, 1.2), runs=2, t1=100.0, num_saves=21)))
