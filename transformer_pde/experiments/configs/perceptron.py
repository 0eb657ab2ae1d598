"""The `perceptron` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.perceptron`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.perceptron"


@dataclasses.dataclass(frozen=True)
class PerceptronConfig(Options):
    beta: Annotated[float, Gt(0)] = 3.0
    angles: tuple[float, ...] = (0.3, 2.0, 4.0)
    """directions a_j = (cos, sin) of the hidden units"""
    omegas: tuple[float, ...] = (20.0, -15.0, 10.0)
    """Output weights ω_j of the hidden units (one per angle)."""
    ns: Annotated[tuple[int, ...], Ge(2)] = (64, 256)
    """Token numbers of the runs: the atoms must not depend on n."""
    t1: Annotated[float, Gt(0)] = 10.0
    """the flows settle by t ≈ 2 at these parameters"""
    rtol: Annotated[float, Interval(gt=0, lt=1)] = 1e-6
    atom_threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.9999
    """Tokens whose cosine exceeds this form one atom."""
    num_saves: Annotated[int, Ge(2)] = 101

    def validate(self):
        if len(self.angles) != len(self.omegas):
            raise ValueError(f"angles and omegas must have the same length, got {self.angles} and "
                             f"{self.omegas}")

    def footprint(self):
        n = ("max(ns)", max(self.ns))
        return {"pair statistics of the saves": sizes(self, "num_saves", n, n)}


register(Experiment(
    "perceptron", "attention + ReLU perceptron on S^1: critical points are finitely atomic (d = 2)",
    PerceptronConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(ns=(24, 72), t1=10.0, rtol=1e-5, num_saves=11)))
