"""The `random-heads` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.random_heads`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.random_heads"


@dataclasses.dataclass(frozen=True)
class RandomHeadsConfig(Options):
    n: Annotated[int, Ge(2)] = 6
    d: Annotated[int, Ge(2)] = 3
    beta: float = 1.0
    num_heads: Annotated[int, Ge(1)] = 1
    """Heads H per layer of the chain."""
    s1: float = 2.0
    """End of the diffusive clock s = ℓη²σ²/H at which chain and SDE are compared."""
    depths: Annotated[tuple[int, ...], Ge(1)] = (1, 2, 4, 8, 16, 32)
    """Depths L of the chain at fixed s1 (the weak error decreases like 1/L)."""
    chain_paths: Annotated[int, Ge(1)] = 32768
    """Paths of the chain per depth."""
    sde_paths: Annotated[int, Ge(1)] = 16384
    """Paths of the common-noise SDE."""
    sde_steps: Annotated[int, Ge(1)] = 64
    """Euler–Maruyama steps of the SDE over [0, s1]."""
    sde_nodes: Annotated[int, Ge(1)] = 16
    """Quadrature nodes A_q of the SDE's noise (one matrix Brownian motion each)."""
    drift_samples: Annotated[int, Ge(1)] = 20000
    """Head draws of the Monte Carlo mean field E_θ B_θ (zero drift)."""
    logistic_n: Annotated[int, Ge(2)] = 8
    """Tokens of the logistic-overlap runs."""
    logistic_dims: Annotated[tuple[int, ...], Ge(3)] = (8, 32)
    """Dimensions d of the logistic-overlap runs (the law holds up to O(1/d))."""
    logistic_beta: float = 0.5
    """β of the logistic-overlap runs (small β)."""
    logistic_s1: float = 4.0
    """End of the diffusive clock of the logistic-overlap runs."""
    logistic_layers: Annotated[int, Ge(10)] = 100
    """Layers of the logistic-overlap chain (a multiple of 10: saved every tenth)."""
    logistic_paths: Annotated[int, Ge(1)] = 256
    """Paths of the logistic-overlap chain, per dimension."""
    seed: int = 0

    def validate(self):
        if self.logistic_layers % 10:
            raise ValueError(f"logistic_layers must be a multiple of 10, got {self.logistic_layers}")

    def footprint(self):
        return {"chain states": sizes(self, "chain_paths", "n", "d"),
                "chain head draws": sizes(self, "chain_paths", "num_heads", "d", "d"),
                "SDE states and noise": sizes(self, "sde_paths", "sde_nodes", "n", "d"),
                "drift head draws": sizes(self, "drift_samples", "d", "d"),
                "logistic chains": sizes(self, "logistic_paths", "logistic_n",
                                         ("max(logistic_dims)", max(self.logistic_dims)))}


register(Experiment(
    "random-heads", "random Gaussian heads: zero drift, weak error vs the common-noise SDE, logistic overlaps",
    RandomHeadsConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(depths=(1, 16), chain_paths=2048, sde_paths=512, sde_steps=8, sde_nodes=8, drift_samples=2000,
              logistic_layers=20, logistic_paths=64)))
