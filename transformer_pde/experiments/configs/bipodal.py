"""The `bipodal` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.bipodal`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.bipodal"


@dataclasses.dataclass(frozen=True)
class BipodalConfig(Options):
    a: float = 0.0
    """K = diag(a, b): the weaker axis."""
    b: float = 2.0
    """K = diag(a, b): the stronger axis (b > a; γ* = b)."""
    ns: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    """Token counts n (>= 4): by default the full law of issue 38, n = 2⁴ … 2¹²."""
    seeds: Annotated[int, Ge(2)] = 16
    """Independent uniform starts per n."""
    t1: Annotated[float, Gt(0)] = 250.0
    """End of each run; it should pass the merge of the two clusters."""
    saves: Annotated[int, Ge(10)] = 2001
    """Equally spaced saves of (R₁, R₂, δ) on [0, t1]: the time resolution of the phase."""
    eps: Annotated[float, Interval(gt=0, lt=0.5)] = 0.05
    """Detection threshold ε of R₂ >= 1 − ε and R₁ <= 1 − ε."""
    rtol: Annotated[float, Interval(gt=0, lt=1)] = 1e-7
    fast_from: Annotated[int, Ge(4)] = 2048
    """Token count from which the NUFFT kernel (tp.kernels.Fast) replaces the exact one (above max(ns): exact
    throughout). In float32 on 2 CPU cores the two cost the same at n = 1024, the fast one 3x less at 2048."""
    fast_tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-5
    """The fast kernel's planned error, relative to the total mass of each kernel sum (float32 reaches 1e-5)."""

    def validate(self):
        if not self.b > self.a:
            raise ValueError(f"need b > a (a dominant axis of K = diag(a, b)), got a = {self.a}, b = {self.b}")
        if any(n < 4 for n in self.ns) or len(self.ns) < 2:
            raise ValueError(f"ns must list >= 2 token counts, each >= 4, got {self.ns}")

    def footprint(self):
        exact = ("max(ns below fast_from)", max((n for n in self.ns if n < self.fast_from), default=0))
        return {"attention scores": sizes(self, "seeds", exact, exact),  # the fast kernel holds no n x n array
                "saved statistics": sizes(self, "ns", "seeds", "saves", ("statistics", 3))}


register(Experiment(
    "bipodal", "the bipodal phase on S¹ (K = diag(a, b)) lasts C ln n + D: fitted C against 1/(2λ), λ = 2/(e^{2γ*}+1)",
    BipodalConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(ns=(16, 32, 64), seeds=4, t1=120.0, saves=601)))
