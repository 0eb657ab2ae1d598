"""The `interpolation` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.interpolation`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.interpolation"


@dataclasses.dataclass(frozen=True)
class InterpolationConfig(Options):
    num_measures: Annotated[int, Ge(1)] = 3
    """Number N of input measures, each carried to its own target cap."""
    n: Annotated[int, Ge(2)] = 48
    """Tokens per measure."""
    layers: Annotated[int, Ge(1)] = 6
    """Layers of the Transformer: its parameters are piecewise constant over this many pieces of [0, t1]."""
    width: Annotated[int, Ge(1)] = 16
    """Hidden width of the perceptron block."""
    t1: Annotated[float, Gt(0)] = 3.0
    substeps: Annotated[int, Ge(1)] = 2
    """solver steps per layer."""
    solver: Literal["euler", "heun", "tsit5"] = "heun"
    """'euler' (the discrete layer-normalized Transformer), 'heun' or 'tsit5'."""
    epsilon: Annotated[float, Gt(0)] = 0.01
    """Entropic regularization ε of the Sinkhorn divergence in the loss."""
    steps: Annotated[int, Ge(1)] = 300
    """Adam steps of the training."""
    learning_rate: Annotated[float, Gt(0)] = 0.03
    """Adam learning rate."""
    spread: Annotated[float, Gt(0)] = 0.15
    """Spread of the caps: tokens are normalize(centre + spread · N(0, I))."""
    seed: int = 0

    def footprint(self):
        return {"attention scores": sizes(self, "num_measures", "n", "n"),
                "layer states": sizes(self, "num_measures", "layers", "substeps", "n", "width")}


register(Experiment(
    "interpolation", "learn a Transformer mapping input measures to target measures on S^2 (Sinkhorn loss)",
    InterpolationConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(num_measures=2, n=12, layers=3, width=8, substeps=1, steps=60, learning_rate=0.05)))
