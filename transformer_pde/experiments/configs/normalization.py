"""The `normalization` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.normalization`)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.normalization"

Scheme = Literal["post-ln", "projected", "pre-ln", "peri-ln", "ngpt", "mix-ln", "ln-scaling"]
SCHEME_NAMES = typing.get_args(Scheme)
MASKS = ("none", "causal")


@dataclasses.dataclass(frozen=True)
class NormalizationConfig(Options):
    n: Annotated[int, Ge(2)] = 64
    d: Annotated[int, Ge(2)] = 16
    heads: Annotated[int, Ge(1)] = 8
    """Heads, averaged (W_h = I/H); each head is full width: Q_h, K_h, V_h are (d, d)."""
    betas: tuple[float, ...] = (1.0, 5.0, 9.0)
    """Inverse temperatures β of the attention, any real numbers (β < 0: repulsive attention)."""
    masks: tuple[Literal["none", "causal"], ...] = MASKS
    """'none': every token attends to all; 'causal': token i attends to j <= i."""
    schemes: tuple[Scheme, ...] = SCHEME_NAMES
    """Layer schemes compared (table in the module docstring): post-ln, projected, pre-ln, peri-ln, ngpt, mix-
    ln, ln-scaling."""
    t1: Annotated[float, Gt(0)] = 30.0
    """Depth: t1/step layers."""
    step: Annotated[float, Gt(0)] = 0.1
    """The layer step h (the authors' 0.1)."""
    seeds: Annotated[int, Ge(1)] = 32
    """Independent draws (tokens and weights) averaged."""
    seed: int = 0
    threshold: Annotated[float, Interval(gt=-1, lt=1)] = 0.999
    ngpt_alpha: Annotated[float, Gt(0)] = 0.2 / 1.02
    """nGPT's eigen learning rate α (scalar). The default 0.2/(1 + 0.2h) at h = 0.1 is the authors'
    layer N(θ + 0.2hÂ) layer for layer (αh/(1 − αh) = 0.2h): their 200 layers are this run's 200."""
    mix_fraction: Annotated[float, Interval(gt=0, le=1)] = 0.25
    """Mix-LN: the fraction α of post-LN layers, ⌊αL⌋ (the Mix-LN scripts use 1/4)."""

    def validate(self):
        if not abs(self.t1 / self.step - round(self.t1 / self.step)) < 1e-9 * self.t1 / self.step:
            raise ValueError(f"t1 must be a whole number of layers of step {self.step}, got t1={self.t1}")
        if self.ngpt_alpha * self.step > 1:
            raise ValueError(f"nGPT needs ngpt_alpha * step <= 1 (its layer interpolates between x and "
                             f"N(A(x))), got {self.ngpt_alpha} * {self.step}")
        for name, values in (("schemes", self.schemes), ("masks", self.masks), ("betas", self.betas)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice: {values}")

    @property
    def num_layers(self) -> int:
        return int(round(self.t1 / self.step))

    def footprint(self):
        # every draw at once (a vmap over seeds): each head's scores, the heads' weights, and
        # the states of every layer
        return {"attention scores": sizes(self, "seeds", "heads", "n", "n"),
                "head weights": sizes(self, "seeds", "heads", "d", "d"),
                "states of every layer": sizes(self, "seeds", ("num_layers + 1", self.num_layers + 1), "n", "d")}


register(Experiment(
    "normalization",
    "post-LN, projected, Pre-/Peri-/Mix-LN, nGPT, LN-scaling: clustered pairs and token speed "
    "vs depth (Karagodin et al.)",
    NormalizationConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(n=12, d=4, heads=2, betas=(1.0, 9.0), masks=("none",), t1=2.0, seeds=3)))
