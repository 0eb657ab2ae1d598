"""The `phase-diagram` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.phase_diagram`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.phase_diagram"


@dataclasses.dataclass(frozen=True)
class PhaseDiagramConfig(Options):
    n: Annotated[int, Ge(2)] = 32
    d: Annotated[int, Ge(2)] = 2
    batch: Annotated[int, Ge(1)] = 256
    """Uniform starts per β, averaged."""
    beta_min: float = 1.0
    """Smallest β of the grid."""
    beta_max: float = 9.0
    """Largest β of the grid."""
    num_betas: Annotated[int, Ge(1)] = 25
    """β grid: linspace(beta_min, beta_max, num_betas); the default holds 1, 11/3, 19/3, 9."""
    t1: Annotated[float, Gt(0)] = 30.0
    dt: Annotated[float, Gt(0)] = 0.1
    num_saves: Annotated[int, Ge(2)] = 61
    threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.999
    scheme: Literal["post-ln", "projected"] = "post-ln"
    """The layer: 'post-ln' x ← N(x + h Γ(x)) (tp.PostLN, the authors' code,
    docs: math/sphere.md#normalizations-across-papers); 'projected' x ← N(x + h P⊥Γ(x)) (explicit Euler for
        tp.Sphere). As in ``clustering``."""
    seed: int = 0

    def validate(self):
        if not 0 <= self.beta_min <= self.beta_max:
            raise ValueError(f"need 0 <= beta_min <= beta_max, got {self.beta_min}, {self.beta_max}")
        layers = self.num_layers
        if layers < 1 or abs(layers * self.dt - self.t1) > 1e-9 * self.t1:
            raise ValueError(f"t1 = {self.t1:g} must be a whole number of layers of step dt = {self.dt:g} "
                             f"(the model is the layer map, one layer per step)")
        if layers % (self.num_saves - 1):
            raise ValueError(f"num_saves = {self.num_saves} must fall on layers: num_saves - 1 must divide "
                             f"the {layers} layers t1/dt (e.g. num_saves = {_largest_divisor(layers, self.num_saves - 1) + 1})")

    @property
    def num_layers(self) -> int:
        """Layers of step dt up to t1 (``validate`` makes t1/dt whole)."""
        return int(round(self.t1 / self.dt))

    def footprint(self):
        # one vmap over every (β, start) pair: each holds its n x n attention scores at once
        return {"attention scores": sizes(self, "num_betas", "batch", "n", "n"),
                "token states": sizes(self, "num_betas", "batch", "n", "d"),
                "saved statistics": sizes(self, "num_betas", "batch", "num_saves")}


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most`` (a save spacing to suggest)."""
    return max(k for k in range(1, min(n, at_most) + 1) if n % k == 0)


register(Experiment(
    "phase-diagram", "clustered pairs and clusters over (β, t) on S^1, n=32, batch of starts (the authors' published run)",
    PhaseDiagramConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(batch=48, num_betas=4, num_saves=5, t1=30.0)))
