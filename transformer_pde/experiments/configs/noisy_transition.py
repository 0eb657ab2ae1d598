"""The `noisy-transition` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.noisy_transition`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.noisy_transition"


@dataclasses.dataclass(frozen=True)
class NoisyTransitionConfig(Options):
    model: Literal["SA", "USA"] = "USA"
    """USA (the noisy USA; docs: math/noise.md#nonlinear-fokker-planck-equation) or SA
    (softmax; its transition stays continuous on S¹)."""
    range_reasons = {
        "betas": "the noisy-sphere laws (tp.theory.noisy_sphere) are stated for β > 0",
        "phase_betas": "the noisy-sphere laws (tp.theory.noisy_sphere) are stated for β > 0",
    }
    betas: Annotated[tuple[float, ...], Gt(0)] = (1.5, 4.0)
    """β of the branch plot: one below and one above β_* = 2.447."""
    sigma: Annotated[float, Gt(0)] = 1.0
    """The noise σ of every token (stationary states depend on K/σ² only)."""
    K_factor: Annotated[float, Gt(1)] = 1.6
    """Branches are followed up to K = K_factor·K_#."""
    phase_betas: Annotated[tuple[float, ...], Gt(0)] = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)
    """β of the phase diagram (a fold is computed for each)."""
    modes: Annotated[int, Ge(8)] = 32
    """Fourier modes of the stationary densities."""
    max_points: Annotated[int, Ge(3)] = 300
    """The most points of one branch."""
    particles: bool = True
    """Noisy particle curves on S¹ and S² (K swept up then down, hysteresis)."""
    dims: tuple[int, ...] = (2, 3)
    """Particle curves on S^{d−1} for these d (2: S¹, drawn with the branches; 3: S², its own panel)."""
    n: Annotated[int, Ge(8)] = 256
    """Particles of each noisy run."""
    seeds: Annotated[int, Ge(1)] = 2
    """Independent particle systems per curve (averaged)."""
    K_points: Annotated[int, Ge(2)] = 11
    """K values of a particle sweep (each way), evenly spaced over [K_lo, K_factor]·K_#."""
    K_lo: Annotated[float, Gt(0)] = 0.6
    """The sweep starts (and ends) at K = K_lo·K_#."""
    run_time: Annotated[float, Gt(0)] = 20.0
    """Time spent at each K (the order parameter is averaged over its second half)."""
    dt: Annotated[float, Gt(0)] = 0.02
    """Step of the noisy residual layer (Euler)."""
    degree: Annotated[int, Ge(8)] = 48
    """Degree of the zonal densities of the S² branch (drawn with the S² particles; USA only)."""

    def validate(self):
        if self.degree > 512:
            raise ValueError(f"degree = {self.degree}: at most 512 (the zonal S² branch; 48 resolves beta <= 4)")
        if not self.dims or any(d not in (2, 3) for d in self.dims) or len(set(self.dims)) < len(self.dims):
            raise ValueError(f"dims must be distinct values among 2 (S¹) and 3 (S²), got {self.dims}")
        if not self.K_lo < self.K_factor:
            raise ValueError(f"K_lo = {self.K_lo} must be below K_factor = {self.K_factor}")
        if self.run_time < 4 * self.dt:
            raise ValueError(f"run_time = {self.run_time} must be at least 4 steps dt = {self.dt}")

    def footprint(self):
        return {"attention scores": sizes(self, "seeds", "n", "n"),
                "branch points": sizes(self, "phase_betas", "max_points", "modes"),
                "S² branch points": sizes(self, "betas", "max_points", "degree")}


register(Experiment(
    "noisy-transition",
    "noisy attention on S¹ and S²: stationary branches, folds, particles swept in K, the (β, K) phase diagram",
    NoisyTransitionConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(betas=(1.5, 4.0), phase_betas=(2.0, 4.0), modes=24, max_points=60,
              dims=(2,), n=48, seeds=1, K_points=3, run_time=2.0, dt=0.1)))
