"""The `lost-in-the-middle` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.lost_in_the_middle`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.lost_in_the_middle"


@dataclasses.dataclass(frozen=True)
class LostInTheMiddleConfig(Options):
    n: Annotated[int, Ge(4)] = 64
    beta: Annotated[float, Ge(0)] = 1.0
    lam: Annotated[float, Ge(0)] = 1.0
    """ALiBi slope λ: token j weighs an earlier token k by e^{−λ(j−k)/N}."""
    t: Annotated[float, Gt(0)] = 1.0
    """depth at which the profile is read. The smallness condition allows t <= 2.23 at
    β = λ = 1, but the O(1/N) corrections grow with t (token self-decorrelation, ~ n²t²/(σ0N)):
    at t = 2 and N <= 64 Monte Carlo sits ~35% below the closed form, at t = 1 it agrees."""
    M: Annotated[int, Ge(1)] = 8
    """Width M of the soft retrieval accuracy (Fourier weights ω_n = e^{−π²n²/(2M²)})."""
    n_max: Annotated[int, Ge(1)] = 20
    """Fourier modes n = 1..n_max kept in the profile's sums."""
    num_runs: Annotated[int, Ge(1)] = 16384
    """Monte Carlo runs (i.i.d. starts) of the particle estimate (a multiple of chunk)."""
    chunk: Annotated[int, Ge(1)] = 512
    """Monte Carlo runs simulated together (vmapped) at a time."""
    dt: Annotated[float, Gt(0)] = 0.1
    bins: Annotated[int, Ge(2)] = 16
    """Source positions are averaged into this many bins for the Monte Carlo profile (at most n - 1)."""
    seed: int = 0

    def footprint(self):
        return {"attention scores of a chunk": sizes(self, "chunk", "n", "n"),
                "Monte Carlo profiles": sizes(self, "num_runs", "n")}

    def validate(self):
        if self.bins > self.n - 1:
            raise ValueError(f"need bins <= n - 1, got n={self.n}, bins={self.bins}")
        if self.num_runs % self.chunk:
            raise ValueError(f"num_runs={self.num_runs} must be a multiple of chunk={self.chunk}")


register(Experiment(
    "lost-in-the-middle", "LitM retrieval profile: Monte Carlo vs closed form S_t(σ0) (Bessel), U shape",
    LostInTheMiddleConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=24, num_runs=1024, chunk=512, bins=6, dt=0.2)))
