"""The `multi-head` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.multi_head`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.multi_head"


@dataclasses.dataclass(frozen=True)
class MultiHeadConfig(Options):
    n: Annotated[int, Ge(2)] = 8
    """the number of tokens."""
    d: Annotated[int, Ge(2)] = 8
    """the dimension (d >= n: equiangular starts)."""
    rho0: float = 0.0
    """the common initial inner product, in [−1/(n−1), 1); 0 = orthogonal tokens."""
    score: Annotated[float, Gt(0)] = 1.0
    """score scale a of the selective head."""
    value: Annotated[float, Gt(0)] = 1.0
    """value scale w of the selective head."""
    repulsion: Annotated[float, Gt(0)] = 0.5
    """value scale c of the uniform repulsive head (score 0, value −c); below ``value``."""
    beta_ratios: tuple[float, ...] = (0.25, 0.5, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.5, 2.0)
    """β / β_c of the critical-β runs (each > 0)."""
    rate_scores: tuple[float, ...] = (0.2, 2.0)
    """score scales of the two attractive heads (value 1 each) of the rate runs."""
    rate_beta: Annotated[float, Gt(0)] = 3.0
    """inverse temperature of the rate runs."""
    rho_target: Annotated[float, Interval(gt=0, lt=1)] = 0.9
    """the inner product whose hitting time T defines the clustering rate 1/T."""
    t1: Annotated[float, Gt(0)] = 60.0
    """end time of every run."""
    num_saves: Annotated[int, Ge(2)] = 1201
    """saves of the mean inner product (scalars: cheap; fine saves resolve the hitting times)."""
    rtol: Annotated[float, Gt(0)] = 1e-8
    """relative tolerance of the adaptive solves (particles and reduced ODE)."""
    seed: int = 0
    """seed of the random rotation of the equiangular start."""

    def validate(self):
        if self.d < self.n:
            raise ValueError(f"equiangular starts need d >= n, got n={self.n}, d={self.d}")
        if not -1.0 / (self.n - 1) - 1e-12 <= self.rho0 < self.rho_target:
            raise ValueError(f"rho0 must lie in [-1/(n-1), rho_target) = [{-1 / (self.n - 1):.4g}, "
                             f"{self.rho_target}), got {self.rho0}")
        if not self.value > self.repulsion:
            raise ValueError(f"value must exceed repulsion (else no β clusters), got value={self.value}, "
                             f"repulsion={self.repulsion}")
        if any(not r > 0 for r in self.beta_ratios):
            raise ValueError(f"beta_ratios must all be > 0, got {self.beta_ratios}")
        if len(self.rate_scores) != 2 or any(not a > 0 for a in self.rate_scores):
            raise ValueError(f"rate_scores must be two scores > 0, got {self.rate_scores}")

    def footprint(self):
        return {"saved mean inner products": sizes(self, ("runs", len(self.beta_ratios) + 3), "num_saves")}


register(Experiment(
    "multi-head", "scalar multi-head attention on equiangular starts: the reduced ODE against particles, the "
    "closed-form critical β, super-additive clustering rates of heterogeneous heads",
    MultiHeadConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=5, d=5, beta_ratios=(0.6, 1.6), t1=30.0, num_saves=301)))
