"""The `gaussian-control` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.gaussian_control`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.gaussian_control"


@dataclasses.dataclass(frozen=True)
class GaussianControlConfig(Options):
    dims: Annotated[tuple[int, ...], Ge(1)] = (2, 4)
    """Dimensions d of the Gaussians."""
    depths: Annotated[tuple[int, ...], Ge(1)] = (4, 32)
    """Numbers of layers L (piecewise-constant pieces of the controls on [0, T]); each (d, L)
    compiles its own fit (most of a run's time), hence two depths by default."""
    targets: Annotated[int, Ge(1)] = 3
    """Random same-rank targets per dimension."""
    t1: Annotated[float, Gt(0)] = 1.0
    """Horizon T."""
    max_step: Annotated[float, Gt(0)] = 1 / 64
    """Largest Tsit5 step of the fits (each layer gets ⌈T/(L·max_step)⌉ equal steps): at 1/64 the
    steps' error is far below w2_goal (the report gives W₂ of an adaptive rtol = 1e-12 solve
    with the fitted controls)."""
    beta: Annotated[float, Gt(0)] = 1.0
    """Inverse temperature of the attention."""
    init_scale: Annotated[float, Gt(0)] = 0.5
    """Standard deviation of the random initial controls."""
    iterations: Annotated[int, Ge(1)] = 300
    """Most L-BFGS iterations per fit (a fit stops earlier once W₂ < w2_stop)."""
    w2_goal: Annotated[float, Gt(0)] = 1e-8
    """The distance a same-rank fit must reach (reported as reached or not)."""
    w2_stop: Annotated[float, Gt(0)] = 1e-11
    """A fit stops once W₂ is below this."""
    start_rank: Annotated[int, Ge(1)] = 1
    """Rank r of the start of the rank-change fit (d = min(dims), target of rank d > r)."""
    gh_order: Annotated[int, Ge(1)] = 8
    """Gauss–Hermite nodes per axis of the particle check (order**d weighted particles)."""
    mc_n: Annotated[int, Ge(2)] = 1024
    """Monte Carlo particles of the particle check."""
    seed: int = 0

    def validate(self):
        if self.start_rank >= min(self.dims):
            raise ValueError(f"start_rank={self.start_rank} must be below the smallest dimension "
                             f"{min(self.dims)} (the rank-change fit starts below the target's rank)")
        if self.gh_order ** max(self.dims) > 10**5:
            raise ValueError(f"gh_order**max(dims) = {self.gh_order}**{max(self.dims)} particles is too many "
                             "for the particle check; lower gh_order")

    def footprint(self):
        n = max(self.mc_n, self.gh_order ** max(self.dims))
        return {"particle check": sizes(self, ("max(mc_n, gh_order**max(dims))", n), ("max(dims)", max(self.dims))),
                "fit histories": sizes(self, "dims", "depths", "targets", "iterations")}


register(Experiment(
    "gaussian-control",
    "attention + affine feed-forward steer N(m0, S0) to any same-rank Gaussian (W2 < 1e-8); "
    "a rank change stalls at its bound",
    GaussianControlConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(dims=(2,), depths=(4,), targets=1, iterations=40, gh_order=10, mc_n=256)))
