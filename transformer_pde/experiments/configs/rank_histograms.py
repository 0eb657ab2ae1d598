"""The `rank-histograms` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.rank_histograms`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.rank_histograms"

VARIANTS = ("softmax", "l2")


@dataclasses.dataclass(frozen=True)
class RankConfig(Options):
    dims: Annotated[tuple[int, ...], Ge(2)] = (3, 4, 5)
    """Dimensions d of the covariances."""
    runs: Annotated[int, Ge(1)] = 100
    """Initial covariances (and parameter draws) per dimension."""
    t_long: Annotated[float, Gt(0)] = 1e5
    """Every run is integrated to t_long; the eigenvalues are read at t_long/100, /10 and 1."""
    t_max: float = 1e8
    """Runs undecided at t_long are integrated on to t_max (read at every decade); still
    undecided there, they are 'unconverged' (rank -2)."""
    keep_ratio: Annotated[float, Interval(gt=0, lt=1)] = 0.5
    """An eigenvalue that fell below keep_ratio times its value a decade earlier has vanished."""
    settle_tol: Annotated[float, Gt(0)] = 0.1
    """An eigenvalue whose relative change over the last decade is below settle_tol, and no
    larger than over the decade before, has settled (it persists in the limit)."""
    rtol: Annotated[float, Gt(0)] = 1e-7
    late_rtol: Annotated[float, Gt(0)] = 1e-6
    """Tolerance of the longer solves of runs undecided at t_long: past t ≈ 1e5 Kvaerno5 at
    rtol = 1e-7 stalls (rounding limits its steps: 80 000 steps short of t = 1e6 for some draws,
    240 at 1e-6)."""
    max_steps: int = 50_000
    """Step budget per solve; runs that exhaust it are reported with rank -1 ('unfinished')."""
    seed: int = 40
    variants: tuple[Literal["softmax", "l2"], ...] = VARIANTS
    """Attention variants: softmax and/or l2."""

    def validate(self):
        if not self.t_max >= self.t_long:
            raise ValueError(f"need t_max >= t_long; got t_max={self.t_max}, t_long={self.t_long}")

    @property
    def decades(self) -> np.ndarray:
        """The save times: t_long/100, t_long/10, t_long, then every decade up to t_max."""
        extra = int(np.floor(np.log10(self.t_max / self.t_long) + 1e-9))
        return self.t_long * 10.0 ** np.arange(-2, extra + 1)

    def footprint(self):
        d = ("max(dims)", max(self.dims))
        return {"runs' matrices": sizes(self, "variants", "runs", d, d)}


register(Experiment(
    "rank-histograms", "ranks of limit covariances for d=3,4,5 with K=-Q (softmax, L2): always <= ceil(d/2)",
    RankConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(dims=(3, 4), runs=4, t_long=1e4, rtol=1e-6, variants=("softmax",))))
