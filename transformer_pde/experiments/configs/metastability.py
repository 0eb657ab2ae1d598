"""The `metastability` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.metastability`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.metastability"


@dataclasses.dataclass(frozen=True)
class MetastabilityConfig(Options):
    range_reasons = {"cap_betas": "the metastability laws (tp.theory.metastability) are stated for β > 0"}
    # Part 1: caps.
    cap_betas: Annotated[tuple[float, ...], Gt(0)] = (2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
    """Inverse temperatures β at which the cap exit time is measured."""
    num_caps: Annotated[int, Ge(2)] = 2
    """Number k of caps on the circle."""
    per_cap: Annotated[int, Ge(1)] = 4
    """Tokens per cap, symmetric about its center."""
    cap_angle: float = 1.5707963267948966
    """Angle θ0 between neighbouring cap centers on S^1 (default π/2)."""
    eps: Annotated[float, Interval(gt=0, lt=1 / 16)] = 0.05
    """Cap size ε: caps S_q(ε) = {x : ⟨x, w_q⟩ ≥ 1 − ε}; the theorem needs ε < 1/16
    (docs: math/sphere.md#metastability)."""
    rtol: Annotated[float, Interval(gt=0, lt=1)] = 1e-6
    # Part 2: staircase.
    stair_betas: Annotated[tuple[float, ...], Gt(1)] = (500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0)
    """Inverse temperatures β of the energy staircase (n = 5 on the circle)."""
    theta0: tuple[float, ...] = (0.0, 0.5, 2.0, 4.0, 7.0)
    """Start θ_i = ½ · theta0_i · log β₀ / sqrt(β₀), β₀ = theta_beta (the authors' start)."""
    theta_beta: float = 2000.0
    """β₀ of the staircase start (see theta0)."""
    step: float = 1e-5
    """Step h of the normalized-gradient staircase steps θ ← θ + h log β · g/|g|."""
    merge_angle: Annotated[float, Interval(ge=0, lt=1)] = 1e-3
    """Tokens closer than this angle merge. 1e-3 is the authors' code (it reproduces their
    collapse at 0.12 for β = 500); 0 merges at the theorem's 1/sqrt(β log β) (0.114 at β = 500)."""
    tau_max: float = 0.2
    """Rescaled time τ to which the staircase runs."""
    save_every: int = 100
    """Staircase steps between saves of φ and the cluster masses."""

    def validate(self):
        if not 2 * np.arccos(1 - 2 * self.eps) < self.cap_angle <= 2 * np.pi / self.num_caps:
            raise ValueError(f"cap_angle={self.cap_angle} must separate the 2ε-caps and fit "
                             f"{self.num_caps} caps on the circle")
        if len(self.theta0) < 2:
            raise ValueError(f"theta0 must list >= 2 angles, got {self.theta0}")
        if not (self.step > 0 and self.tau_max > self.step and self.save_every >= 1):
            raise ValueError(f"need step > 0, tau_max > step, save_every >= 1; got {self.step}, "
                             f"{self.tau_max}, {self.save_every}")

    def footprint(self):
        tokens = ("num_caps × per_cap", self.num_caps * self.per_cap)
        return {"attention scores": sizes(self, "cap_betas", tokens, tokens)}


register(Experiment(
    "metastability", "caps left after times ~e^{cβ}; the energy staircase on S^1 with plateaus Σ(m_k/n)² (GKPR)",
    MetastabilityConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(cap_betas=(2.0, 4.0, 6.0), stair_betas=(2000.0, 4000.0), tau_max=0.12)))
