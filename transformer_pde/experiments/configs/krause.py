"""The `krause` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.krause`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.krause"

# tp.KrauseAttention's default layout (KRAUSE_LAYOUT): dense up to 512² pairs, then spatially
# sorted tiles of 128 queries x 128 keys. Restated here so that `list` and `--help` import no JAX
# (tests/experiments/test_krause.py checks it against the layout itself).
DENSE_PAIRS, TILE = 512 * 512, (128, 128)


@dataclasses.dataclass(frozen=True)
class KrauseConfig(Options):
    n: Annotated[int, Ge(2)] = 200
    radii: tuple[float, ...] = (0.04, 0.06, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4)
    """confidence radii r (> 0), one run each."""
    sigma: Annotated[float, Gt(0)] = 10.0
    """Gaussian width σ of the scores (σ much above 1: the plain HK mean over the neighbours)."""
    t1: Annotated[float, Gt(0)] = 60.0
    dt: Annotated[float, Gt(0)] = 0.1
    threshold: Annotated[float, Interval(gt=0, lt=1)] = 1e-3
    """tokens at most this far apart at t1 are in one cluster (single linkage on the line)."""

    def validate(self):
        if any(not r > 0 for r in self.radii):
            raise ValueError(f"radii must all be > 0, got {self.radii}")

    def footprint(self):
        # the default layout streams tiles above 512² pairs: the n x n distances exist only below
        dense = self.n * self.n <= DENSE_PAIRS
        pairs = sizes(self, "n", "n") if dense else (("query block", TILE[0]), ("key block", TILE[1]))
        return {"pair distances": pairs, "final positions": sizes(self, ("len(radii)", len(self.radii)), "n")}


register(Experiment(
    "krause", "Krause (bounded-confidence) attention: clusters at the end against the radius, 1/(2r) to consensus",
    KrauseConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=40, radii=(0.08, 0.15, 0.5), t1=40.0, dt=0.2)))
