"""The `stability` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.stability`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.stability"

VARIANTS = ("softmax", "l2", "multihead", "sinkhorn")


@dataclasses.dataclass(frozen=True)
class StabilityConfig(Options):
    n: Annotated[int, Ge(2)] = 128
    d: Annotated[int, Ge(1)] = 2
    t1: Annotated[float, Gt(0)] = 2.0
    dt: Annotated[float, Gt(0)] = 0.02
    num_saves: Annotated[int, Ge(2)] = 21
    radius: Annotated[float, Gt(0)] = 1.0
    """Radius R₀ of the disk in which the tokens start uniformly."""
    beta: float = 1.0
    scale: float = 0.7
    """Entries of Q, K, V are scale · N(0, 1)."""
    deltas: Annotated[tuple[float, ...], Gt(0)] = (0.001, 0.01, 0.1)
    """Sizes δ of the perturbation ν_0 = μ_0 moved by δ·ξ (ξ standard normal)."""
    seed: int = 0
    variants: tuple[Literal["softmax", "l2", "multihead", "sinkhorn"], ...] = VARIANTS
    """Variants whose support radius is tracked (multi-head needs an even d)."""

    def validate(self):
        if "multihead" in self.variants and self.d % 2:
            raise ValueError(f"multihead splits d into 2 heads: needs an even d, got d={self.d}")

    def footprint(self):
        return {"attention scores": sizes(self, "n", "n"),
                "saved states": sizes(self, "variants", "deltas", "num_saves", "n", "d")}


register(Experiment(
    "stability", "support radius and W2 stability ratio of particles vs the support and Lipschitz stability bounds",
    StabilityConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=16, t1=0.5, dt=0.05, num_saves=6, deltas=(0.01, 0.1), variants=("softmax", "multihead"))))
