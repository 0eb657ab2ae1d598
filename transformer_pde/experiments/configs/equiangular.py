"""The `equiangular` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.equiangular`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._common import MODELS
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.equiangular"


@dataclasses.dataclass(frozen=True)
class EquiangularConfig(Options):
    n: int = 16
    d: int = 16
    betas: tuple[float, ...] = (0.5, 1.0, 4.0)
    """Inverse temperatures β, any real numbers (the reduced ODE holds for β < 0, repulsive
    attention, too); each runs every model of ``models`` against the reduced ODE."""
    models: tuple[Literal["SA", "USA"], ...] = MODELS
    """The models run: ``SA`` alone runs the published setting (n = d = 128, β up to 9), where
    USA's rate 2e^β makes its solve stiff."""
    rho0: float = 0.0
    """Common initial inner product, in [−1/(n−1), 1); 0 = orthogonal tokens."""
    t1: Annotated[float, Gt(0)] = 10.0
    num_saves: Annotated[int, Ge(2)] = 101
    rtol: Annotated[float, Gt(0)] = 1e-8
    """Relative tolerance of both adaptive solves (Tsit5 with a PID controller)."""
    seed: int = 0

    def validate(self):
        if self.n < 2 or self.d < self.n:
            raise ValueError(f"equiangular starts need n >= 2 and d >= n, got n={self.n}, d={self.d}")
        if not -1.0 / (self.n - 1) - 1e-12 <= self.rho0 < 1:
            raise ValueError(f"rho0 must lie in [-1/(n-1), 1) = [{-1 / (self.n - 1):.4g}, 1), "
                             f"got {self.rho0}")

    def footprint(self):
        return {"pair statistics of the saves": sizes(self, "betas", "models", "num_saves", "n", "n")}


register(Experiment(
    "equiangular", "orthogonal starts (d >= n) against the reduced ODE for the common inner product, SA/USA",
    EquiangularConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=6, d=6, betas=(1.0, 3.0), t1=8.0, num_saves=33)))
