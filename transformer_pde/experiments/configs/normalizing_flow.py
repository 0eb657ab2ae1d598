"""The `normalizing-flow` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.normalizing_flow`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.normalizing_flow"

TARGET_NAMES = ("moons", "student")


@dataclasses.dataclass(frozen=True)
class NormalizingFlowConfig(Options):
    targets: tuple[Literal["moons", "student"], ...] = TARGET_NAMES
    """Targets ρ_*: 'moons' (a two-moon-like mixture of 16 Gaussians), 'student' (bivariate t, ν = 3)."""
    switches: Annotated[tuple[int, ...], Ge(0)] = (0, 1, 3)
    """Numbers of switches s of the controls (s + 1 constant pieces on [0, t1]); each fit starts
    from the fit of the next smaller s (embedded exactly), so more switches never train worse."""
    width: Annotated[int, Ge(1)] = 16
    """Neurons per piece (1 with relu: the abstract's field w(aᵀx + b)_+)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """σ of the field W σ(Ax + b) of a piece: tanh (smooth: a token crossing a neuron's level set
    inside a step is seen by the gradient) or relu (the abstract's; with width > 1 the kinks a
    token crosses inside a step make the carried log ρ, and the loss, jump in the controls)."""
    t1: Annotated[float, Gt(0)] = 4.0
    """Horizon T."""
    substeps: Annotated[int, Ge(1)] = 8
    """Solver steps per piece (the report gives the KL of a 4× finer Tsit5 solve of the fitted
    flow: the fit must not live on the solver's error)."""
    solver: Literal["euler", "heun", "tsit5"] = "heun"
    """Runge–Kutta method of the solves."""
    loss: Literal["monte-carlo", "quadrature"] = "monte-carlo"
    """The estimator of KL(ρ(T) ‖ ρ*) the fit minimizes: the mean over n fixed base samples, or
    the tensor Gauss–Hermite rule of the base with order² nodes (deterministic)."""
    n: Annotated[int, Ge(2)] = 4096
    """Base samples the Monte Carlo loss averages over (fixed during the fit)."""
    order: Annotated[int, Ge(2)] = 48
    """Gauss–Hermite nodes per axis of the quadrature loss."""
    n_eval: Annotated[int, Ge(2)] = 8192
    """Fresh base samples for the reported KL and the figures."""
    steps: Annotated[int, Ge(1)] = 300
    """Adam steps per fit (the iterate of least training loss is kept)."""
    learning_rate: Annotated[float, Gt(0)] = 0.03
    """Adam learning rate (cosine decay to 0 over the steps)."""
    seed: int = 0

    def footprint(self):
        pieces = ("max(switches) + 1", max(self.switches) + 1)
        nodes = ("n", self.n) if self.loss == "monte-carlo" else ("order²", self.order**2)
        return {"pushed samples": sizes(self, "targets", "switches", "n_eval", ("d", 2)),
                "fit states": sizes(self, nodes, pieces, "substeps", "width")}


register(Experiment(
    "normalizing-flow",
    "perceptron controls w(aᵀx+b)_+ transport N(0, I) to targets in R²; KL(ρ(T)‖ρ*) vs switches "
    "(Álvarez-López–Geshkovski–Ruiz-Balet, arXiv 2412.19366)",
    NormalizingFlowConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(targets=("moons",), switches=(0, 2), n=64, n_eval=64, steps=15, substeps=2)))
