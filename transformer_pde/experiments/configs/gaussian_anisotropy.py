"""The `gaussian-anisotropy` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.gaussian_anisotropy`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.gaussian_anisotropy"

REGIMES = ("zero", "line", "two-lines", "blowup", "mixed")
VARIANTS = ("softmax", "l2", "multihead", "sinkhorn")
Regime = Literal["zero", "line", "two-lines", "blowup", "mixed"]
Variant = Literal["softmax", "l2", "multihead", "sinkhorn"]


@dataclasses.dataclass(frozen=True)
class AnisotropyConfig(Options):
    grid: Annotated[int, Ge(2)] = 10
    """Grid points per axis for ``zero`` and ``line``; ``two-lines``, ``mixed`` and ``blowup``
    use 2×, 3× and 4× as many (the authors' 10/20/30/40)."""
    t_long: Annotated[float, Gt(0)] = 1e4
    """Horizon of ``zero`` and ``line`` (convergence is O(1/t))."""
    t_two_lines: Annotated[float, Gt(0)] = 500.0
    """Horizon of ``two-lines``."""
    t_mixed: Annotated[float, Gt(0)] = 150.0
    """Horizons of ``two-lines`` and ``mixed`` (the authors' step × max_iter)."""
    max_steps: Annotated[int, Ge(1)] = 10_000
    """Step budget per run (runs are vmapped in lockstep, so one stiff run costs the whole
    batch this many steps); a run that exhausts it is reported as 'unfinished'."""
    tol_high: Annotated[float, Gt(1)] = 1e4
    """The solve stops when tr Σ exceeds this (the authors' ``tol_high``)."""
    rtol: Annotated[float, Gt(0)] = 1e-7
    num_saves: Annotated[int, Ge(3)] = 120
    """Saved times: evenly spaced for ``blowup``; 0, then a geometric grid from 10⁻³ of the horizon
    to it for the regimes that converge like 1/t."""
    regimes: tuple[Regime, ...] = REGIMES
    """Regimes to run: zero, line, two-lines, blowup, mixed (the module docstring says what each shows)."""
    variants: tuple[Variant, ...] = VARIANTS
    """Attention variants run in every regime: softmax, l2, multihead (H = 2), sinkhorn."""

    def footprint(self):
        return {"moment trajectories": sizes(self, "variants", "grid", "grid", "num_saves", ("d × d", 4))}


# one compilation per variant dominates the cost: the tiny run keeps one Riccati closure
# (softmax) and one with bounded growth (Sinkhorn)
register(Experiment(
    "gaussian-anisotropy", "d=2 covariance trajectories in the PSD cone: to 0, to a line, two lines, blow-up",
    AnisotropyConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(grid=2, t_long=3000.0, t_two_lines=300.0, t_mixed=100.0, num_saves=20, rtol=1e-6,
              variants=("softmax", "sinkhorn"))))
