"""The `sweep-phase` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.sweep_phase`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.sweep_phase"


@dataclasses.dataclass(frozen=True)
class SweepPhaseConfig(Options):
    n: Annotated[int, Ge(2)] = 32
    dims: Annotated[tuple[int, ...], Ge(2)] = (2, 3, 4, 8)
    """dimensions d (one compiled sweep each)."""
    beta_min: float = 0.5
    """Smallest β of the grid linspace(beta_min, beta_max, num_betas)."""
    beta_max: float = 12.0
    """Largest β of the grid."""
    num_betas: Annotated[int, Ge(1)] = 16
    """Number of β values of the grid."""
    seeds: Annotated[int, Ge(1)] = 4
    t1: Annotated[float, Gt(0)] = 60.0
    dt: Annotated[float, Gt(0)] = 0.1
    num_saves: Annotated[int, Ge(2)] = 241
    threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.999
    chunk_size: Annotated[int, Ge(0)] = 0
    """points per vmapped chunk (0: all points of a dimension in one chunk)."""

    def validate(self):
        if not 0 <= self.beta_min <= self.beta_max:
            raise ValueError(f"need 0 <= beta_min <= beta_max, got {self.beta_min}, {self.beta_max}")

    def footprint(self):
        # one vmapped chunk of (β, seed) points per dimension, each with its n x n scores
        points = ("chunk_size",) if self.chunk_size else ("num_betas", "seeds")
        return {"attention scores": sizes(self, *points, "n", "n"),
                "token states": sizes(self, *points, "n", ("max(dims)", max(self.dims))),
                "saved cluster counts": sizes(self, "num_betas", "seeds", "num_saves")}


register(Experiment(
    "sweep-phase", "(beta, d) phase diagram of the time to one cluster on the sphere (vmapped sweep)",
    SweepPhaseConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=12, dims=(2, 3), num_betas=16, seeds=4, beta_max=9.0, t1=12.0, dt=0.25, num_saves=25)))
