"""The `rd-spectrum` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.rd_spectrum`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.rd_spectrum"


@dataclasses.dataclass(frozen=True)
class RdSpectrumConfig(Options):
    n: int = 20
    d: int = 2
    box: Annotated[float, Gt(0)] = 5.0
    """Start: i.i.d. uniform on [−box, box]^d (the authors' set-up,
    docs: math/attention.md#the-rescaled-model-and-the-spectrum-of-v)."""
    t1: Annotated[float, Gt(0)] = 10.0
    top_ratio: Annotated[float, Interval(ge=0, lt=1)] = 0.5
    """V = diag(1, top_ratio, ...) for the simple-top-eigenvalue case (needs top_ratio < 1)."""
    n1d: Annotated[int, Ge(2)] = 12
    """Tokens of the d = 1 'leaders' run."""
    t1_1d: Annotated[float, Gt(0)] = 8.0
    """Final time of the d = 1 'leaders' run."""
    num_saves: Annotated[int, Ge(2)] = 41
    rtol: Annotated[float, Interval(gt=0, lt=1)] = 1e-8
    rank_rtol: Annotated[float, Interval(gt=0, lt=1)] = 1e-3
    """Relative tolerance of the numerical rank of the attention matrix P."""
    tol: float = 0.1
    """Distance at which a token counts as at a hull vertex / on a hyperplane."""
    seed: int = 0

    def validate(self):
        if self.n < 3 or self.d != 2:
            raise ValueError(f"rd-spectrum uses d = 2 (hull vertices in the plane) and n >= 3, "
                             f"got n={self.n}, d={self.d}")

    def footprint(self):
        return {"attention matrices of the saves": sizes(self, "num_saves", "n", "n")}


register(Experiment(
    "rd-spectrum", "unnormalized R^d model, z = e^{-tV}x: polytope, hyperplanes, origin, Boolean leaders",
    RdSpectrumConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=12, n1d=8, t1=8.0, t1_1d=6.0, num_saves=9, rtol=1e-6)))
