"""The `energy-flow` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.energy_flow`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.energy_flow"


@dataclasses.dataclass(frozen=True)
class EnergyFlowConfig(Options):
    n: Annotated[int, Ge(2)] = 8
    range_reasons = {
        "beta": "the experiment follows log E_β, and E_β = (1/2β) Σ e^{β⟨Dx_i, x_j⟩} is negative for β < 0",
    }
    beta: Annotated[float, Gt(0)] = 1.0
    t1: Annotated[float, Gt(0)] = 300.0
    num_saves: Annotated[int, Ge(2)] = 60
    """Saved times: 0, then a geometric grid from 0.01 to t1."""
    rtol: Annotated[float, Interval(gt=0, lt=1)] = 1e-7
    threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.9999
    indefinite_d2: tuple[float, ...] = (0.2, 1.0)
    """d₂ values of the indefinite cases D = diag(−1, d₂)."""
    four_d1: Annotated[float, Gt(0)] = 1.0  # four particles: D = diag(d1, d2), d1, d2 > 0
    """d₁ of D = diag(d₁, d₂) in the four-particle descent."""
    four_d2: Annotated[float, Gt(0)] = 2.0
    """d₂ of D = diag(d₁, d₂) in the four-particle descent."""
    four_x1: Annotated[float, Interval(gt=0, lt=1)] = 0.3
    """Start of the four-particle descent: (±x1, ±sqrt(1 − x1²))."""
    seed: int = 0

    def cases(self) -> dict[str, np.ndarray]:
        out = {"identity": np.eye(2), "posdef": np.diag([1.0, 3.0, 4.0]), "negdef": -np.eye(3)}
        for d2 in np.asarray(self.indefinite_d2):
            out[f"indefinite_{d2:g}"] = np.diag([-1.0, d2])
        return out

    def footprint(self):
        return {"pair energies of the saves": sizes(self, "num_saves", "n", "n")}


register(Experiment(
    "energy-flow", "gradient ascent/descent of the energy with Q^T K = V = D (Burger et al.): extremal measures",
    EnergyFlowConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=6, t1=60.0, num_saves=12, rtol=1e-6)))
