"""The `causal-clustering` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.causal_clustering`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.causal_clustering"


@dataclasses.dataclass(frozen=True)
class CausalClusteringConfig(Options):
    n: Annotated[int, Ge(2)] = 128
    d: Annotated[int, Ge(2)] = 2
    range_reasons = {"betas": "the predicted cluster counts scale with √β (Rényi radii c/√β, a fit in log β)"}
    betas: Annotated[tuple[float, ...], Gt(0)] = (4.0, 9.0, 16.0, 36.0, 64.0)
    """Inverse temperatures β at which the metastable clusters are counted (at t1)."""
    seeds: Annotated[int, Ge(1)] = 4
    t1: Annotated[float, Gt(0)] = 200.0
    """time at which metastable clusters are counted"""
    dt: Annotated[float, Gt(0)] = 0.1
    c_low: float = 3.0
    """Parking radius δ = c_low/√β of the blog code: the higher count of Rényi centers."""
    c_high: float = 4.4
    """parking radii δ = c/√β of the blog code (c_high gives the lower count)"""
    threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.9995
    beta_long: float = 1.0
    """β of the long run (t_long) in which every token reaches x_1(0)."""
    t_long: Annotated[float, Gt(0)] = 100.0
    """a run long enough to reach the limit x_1(0) (small β)"""

    def footprint(self):
        return {"attention scores": sizes(self, "n", "n")}  # one run at a time, dense causal scores


register(Experiment(
    "causal-clustering", "causal SA: tokens go to x_1(0); metastable clusters vs β and the Rényi-parking count",
    CausalClusteringConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=32, betas=(4.0, 36.0), seeds=2, t1=40.0, dt=0.25, t_long=40.0)))
