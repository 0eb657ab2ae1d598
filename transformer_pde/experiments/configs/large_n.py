"""The `large-n` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.large_n`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.large_n"


@dataclasses.dataclass(frozen=True)
class LargeNConfig(Options):
    n: Annotated[int, Ge(2)] = 1_000_000
    beta: float = 1.0
    t1: Annotated[float, Gt(0)] = 30.0
    dt: Annotated[float, Gt(0)] = 0.2
    """layer step: one Euler step is one residual attention layer + normalization."""
    num_saves: Annotated[int, Ge(2)] = 16
    backend: Literal["fast", "auto", "exact"] = "fast"
    """Pair kernel: 'fast' (NUFFT Gaussian sums), 'auto' (fast where predicted cheaper and accurate) or 'exact'."""
    tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-8
    """the fast kernel's planned error, relative to the total mass (kernels/backends.py)."""
    num_plotted: Annotated[int, Ge(1)] = 3000
    """Size of the fixed random subsample of tokens saved, drawn and counted in clusters."""
    threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.999
    seed: int = 0

    def footprint(self):
        m = ("min(n, num_plotted)", min(self.n, self.num_plotted))
        return {"pair statistics of the saved sample": sizes(self, "num_saves", m, m),
                "tokens": sizes(self, "n", ("d", 3))}


register(Experiment(
    "large-n", "10^6 tokens on S^2 collapse to one cluster (fast NUFFT kernel, residual layers)",
    LargeNConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=2048, t1=16.0, dt=0.5, num_saves=5, num_plotted=200)))
