"""The `kde-modes` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.kde_modes`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.kde_modes"


@dataclasses.dataclass(frozen=True)
class KDEModesConfig(Options):
    n: Annotated[int, Ge(2)] = 10000
    betas: Annotated[tuple[float, ...], Gt(1)] = (1000.0, 3000.0, 10000.0)
    """β from n^0.75 to n: at n = 10^4 the ratio count/√(β log β) is 0.21, 0.33 at β = 100, 300
    (pre-asymptotic), 0.49, 0.49, 0.45 at β = 10^3, 3·10^3, 10^4, and 0.40 at 3·10^4 ≳ n, where
    the count starts to saturate; the window where the law holds is narrow at this n."""
    runs: Annotated[int, Ge(1)] = 16
    """Independent samples of n points whose KDE modes are counted, per β."""
    n_dynamics: Annotated[int, Ge(2)] = 2000
    """Points of the sample started in the mean-shift dynamics."""
    betas_dynamics: Annotated[tuple[float, ...], Gt(1)] = (30.0, 100.0, 300.0, 1000.0)  # log β > 0
    """Inverse temperatures β of the mean-shift dynamics (log β > 0)."""
    t_dynamics: float = 20.0
    """time at which the mean-shift clusters are counted (a plateau: counts are flat on [10, 40])"""
    dt: float = 0.1
    cluster_gap: float = 0.1
    """points farther apart than cluster_gap·β^{-1/2} are in different clusters"""
    seed: int = 0

    def footprint(self):
        return {"samples": sizes(self, "runs", "n"), "mean-shift kernel": sizes(self, "n_dynamics", "n")}


register(Experiment(
    "kde-modes", "modes of a Gaussian KDE vs √(β log β) and vs clusters of 1-D self-attention",
    KDEModesConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=2000, betas=(300.0, 1000.0, 3000.0), runs=2, n_dynamics=400, betas_dynamics=(100.0, 300.0),
              t_dynamics=10.0, dt=0.25)))
