"""The `instability` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.instability`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.instability"


@dataclasses.dataclass(frozen=True)
class InstabilityConfig(Options):
    model: Literal["SA", "USA"] = "USA"
    """SA (softmax) or USA (GLPR's 1/n), Q = K = V/K = I on S¹."""
    range_reasons = {"beta": "the growth rates of the uniform state (tp.theory.noisy_sphere) are stated for β > 0"}
    beta: Annotated[float, Gt(0)] = 2.0
    """Inverse temperature β."""
    K: Annotated[float, Gt(0)] = 1.0
    """The value matrix V = K·I (the coupling K; docs: math/noise.md#nonlinear-fokker-planck-equation)."""
    sigma: Annotated[float, Gt(0)] = 0.8
    """The noise of the noisy runs (the noiseless runs have σ = 0)."""
    k_max: Annotated[int, Ge(1)] = 6
    """Modes k = 1..k_max."""
    eps: Annotated[float, Gt(0)] = 1e-5
    """Amplitude of the perturbation (linear regime)."""
    t1: Annotated[float, Gt(0)] = 0.5
    """The rate is fitted on [0, t1]."""
    num_saves: Annotated[int, Ge(3)] = 11
    """Save times on [0, t1]."""
    modes: Annotated[int, Ge(4)] = 32
    """Fourier modes of the PDE."""
    n: Annotated[int, Ge(8)] = 256
    """Weighted deterministic particles θ_j = 2πj/n."""
    rtol: Annotated[float, Gt(0)] = 1e-11
    """Relative tolerance of the adaptive solves (atol = rtol/100)."""
    follow_n_min: Annotated[int, Ge(8)] = 256
    """Smallest n of the i.i.d. particles that follow the mean field (powers of 2 up to the max)."""
    follow_n_max: Annotated[int, Ge(16)] = 4096
    """Largest n of the i.i.d. particles."""
    follow_seeds: Annotated[int, Ge(1)] = 8
    """Independent draws per n."""
    follow_delta: Annotated[float, Gt(0)] = 0.3
    """The level δ of max_k |ρ̂_k| that ends the following (δ >> n^{-1/2})."""
    follow_dt: Annotated[float, Gt(0)] = 0.05
    """Step of the particle runs (Tsit5, constant steps)."""

    def validate(self):
        if self.n <= 2 * self.k_max or self.modes <= self.k_max:
            raise ValueError(f"n = {self.n} and modes = {self.modes} must exceed the modes k <= {self.k_max}")
        if self.follow_n_max < 2 * self.follow_n_min:
            raise ValueError(f"follow_n_max = {self.follow_n_max} must be at least twice follow_n_min = "
                             f"{self.follow_n_min} (two sizes or more)")
        if not self.follow_delta < 1:
            raise ValueError(f"follow_delta = {self.follow_delta} must be < 1 (|ρ̂_k| <= 1)")

    def footprint(self):
        return {"attention scores": sizes(self, "follow_seeds", "follow_n_max", "follow_n_max"),
                "mode amplitudes": sizes(self, "num_saves", "modes", "n")}


register(Experiment(
    "instability", "growth rates of the modes of a perturbed uniform law on S¹ (PDE, particles) vs Funk–Hecke",
    InstabilityConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(k_max=3, modes=16, n=64, num_saves=5, t1=0.3, rtol=1e-10, follow_n_min=128,
              follow_n_max=512, follow_seeds=4, follow_dt=0.1)))
