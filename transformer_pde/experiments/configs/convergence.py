"""The `convergence` and `convergence-moving` experiments' options and entries (light: import no
JAX; the computation is :mod:`transformer_pde.experiments.convergence`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._options import Options, require_at_least, sizes

_HEAVY = "transformer_pde.experiments.convergence"


@dataclasses.dataclass(frozen=True)
class ConvergenceConfig(Options):
    model: Literal["gaussian", "sphere", "circle", "cap"] = "gaussian"
    """'gaussian' (Gaussian data on R^d, Gaussian closure reference), 'sphere' (uniform data on
    S^{d-1}, stationary), 'circle' (1 + perturbation·cos(mode·θ) on S¹, moves) or 'cap' (a von
    Mises–Fisher cap of concentration kappa on S², moves); the last two use the quadrature
    reference."""
    attention: Literal["softmax", "l2", "multihead", "sinkhorn", "sigmoid"] = "softmax"
    """The attention (on R^d: random Q, K = −Q, V = G Gᵀ/2; on spheres: Q = K = V = I); multihead
    splits into 2 heads (1 when d is odd)."""
    d: int = 3
    """Dimension of the tokens (model='circle': 2, 'cap': 3)."""
    beta: float = 1.0
    log2_n_min: Annotated[int, Ge(1)] = 6
    """Smallest particle number, n = 2^log2_n_min."""
    log2_n_max: int = 16
    """Largest particle number, n = 2^log2_n_max (above log2_n_min)."""
    log2_n_step: Annotated[int, Ge(1)] = 1
    """Step of log2 n between the particle numbers of the study."""
    seeds: Annotated[int, Ge(2)] = 4  # >= 2: confidence bands
    t1: Annotated[float, Gt(0)] = 1.0
    dt: Annotated[float, Gt(0)] = 0.05
    num_times: Annotated[int, Ge(2)] = 3
    """Times at which the errors are measured, evenly spaced from 0 to t1."""
    reference: Literal["exact", "uniform", "particles", "quadrature"] = "exact"
    """'exact': the Gaussian closure (gaussian), the stationary uniform law (sphere; 'uniform' is
    the same), the quadrature rule (circle, cap); 'particles': a 2^log2_n_ref-particle system;
    'quadrature': a quadrature rule evolved as weighted tokens (any attention; R^d for d <= 3)."""
    log2_n_ref: int = 14
    """reference size for reference='particles'."""
    order: Annotated[int, Ge(0)] = 0
    """order of the quadrature reference (0: the law's default: 256 nodes on S¹, 24 on S², 24/12/8
    nodes per axis on R^1/R^2/R^3); its error is estimated against the coarser rule."""
    perturbation: float = 0.2
    """model='circle': ε of the density 1 + ε cos(mode·θ), |ε| < 1."""
    mode: Annotated[int, Ge(1)] = 2
    """model='circle': the frequency k of the perturbation."""
    kappa: Annotated[float, Gt(0)] = 3.0
    """model='cap': the von Mises–Fisher concentration."""
    w2_epsilon: Annotated[float, Ge(0)] = 0.0
    """ε of the Sinkhorn W₂ relative to the data's scale (ε = w2_epsilon · tr Cov of the reference
    at each time); 0: 0.05 (at 0.01 ℓ² attention on Gaussian data in R² does not converge in 2000
    iterations, issue 22). Not used on S¹ and R, where the distances are exact."""
    w2_max_iterations: Annotated[int, Ge(1)] = 2000
    """Sinkhorn iteration budget; an unconverged distance is NaN, counted in the report."""
    log2_w2_max: int = 12
    """compute the Sinkhorn W_2 only up to n = 2^this (O(n²) per Sinkhorn iteration)."""
    leave_distance: Annotated[float, Gt(0)] = 0.1
    """n leaves the mean field at the first time its error (the primary distance, geometric mean
    over seeds) exceeds this (reported per n; NaN: not by t1)."""
    seed: int = 0
    """seed of the random attention matrices."""
    backend: Literal["exact", "fast", "auto"] = "exact"
    """kernel of the particle and reference runs (spheres only, softmax: the fast kernel plans
    for bounded tokens): 'fast' takes n = 2^22 on a workstation (issue 13)."""
    tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-8
    """planned error of the fast kernel, relative to the total mass."""

    @property
    def w2_scale(self) -> float:
        """The relative ε in use (``w2_epsilon``, or 0.05 when 0)."""
        return self.w2_epsilon or 0.05

    @property
    def on_sphere(self) -> bool:
        return self.model != "gaussian"

    def validate(self):
        if self.backend != "exact" and not (self.on_sphere and self.attention == "softmax"):
            raise ValueError(f"backend={self.backend!r} needs bounded tokens and softmax attention: use "
                             "model='sphere', 'circle' or 'cap' with attention='softmax'")
        require_at_least(self, d=2 if self.on_sphere else 1)
        fixed = {"circle": 2, "cap": 3}.get(self.model)
        if fixed is not None and self.d != fixed:
            raise ValueError(f"model={self.model!r} lives in R^{fixed}: pass d={fixed}, got d={self.d}")
        if self.model == "circle" and not abs(self.perturbation) < 1:
            raise ValueError(f"perturbation must satisfy |ε| < 1 (a positive density), got {self.perturbation}")
        if self.reference == "uniform" and self.model != "sphere":
            raise ValueError("reference='uniform' is the stationary law of model='sphere'")
        if self.reference == "quadrature" and self.model == "sphere":
            raise ValueError("model='sphere' is stationary: its exact reference is reference='exact'")
        if self.reference == "quadrature" and self.model == "gaussian" and self.d > 3:
            raise ValueError(f"the quadrature reference on R^d needs d <= 3, got d={self.d}")
        if not self.log2_n_min < self.log2_n_max:
            raise ValueError(f"need log2_n_min < log2_n_max, got {self.log2_n_min}, {self.log2_n_max}")

    def footprint(self):
        # the largest study runs 2^log2_n_max tokens per seed; Sinkhorn holds n x n costs up to 2^log2_w2_max
        def two_to(name):
            return (f"2^{name}", 2 ** min(max(getattr(self, name), 0), 62))  # 2^62: over any budget

        w2 = ("2^min(log2_w2_max, log2_n_max)", 2 ** min(max(min(self.log2_w2_max, self.log2_n_max), 0), 62))
        return {"tokens of the largest runs": sizes(self, "seeds", two_to("log2_n_max"), "d"),
                "reference tokens": sizes(self, two_to("log2_n_ref"), "d"),
                "Sinkhorn costs": sizes(self, w2, w2)}


register(Experiment(
    "convergence", "mean-field convergence: n-particle error vs n and t (closure, stationary or quadrature reference)",
    ConvergenceConfig, Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(log2_n_min=4, log2_n_max=10, log2_n_step=3, seeds=12, t1=0.5, dt=0.1, num_times=2, log2_w2_max=0)))


@dataclasses.dataclass(frozen=True)
class MovingConvergenceConfig(ConvergenceConfig):
    """The study of a law that moves, at its own default size: 1 + 0.2 cos 2θ on S¹ under SA at
    β = 9 (the uniform law is unstable: the perturbation grows) against the quadrature reference
    (exact W₁), n = 2⁸ … 2¹⁶, until t = 3. n = 2²⁰ is ``--log2-n-max 20`` (fast kernel above the
    crossover; about 16x the cost of the n = 2¹⁶ share, estimated in benchmarks/README.md)."""
    model: Literal["gaussian", "sphere", "circle", "cap"] = "circle"
    d: int = 2
    beta: float = 9.0
    log2_n_min: Annotated[int, Ge(1)] = 8
    log2_n_max: int = 16
    log2_n_step: Annotated[int, Ge(1)] = 2
    t1: Annotated[float, Gt(0)] = 3.0
    dt: Annotated[float, Gt(0)] = 0.1
    num_times: Annotated[int, Ge(2)] = 7
    backend: Literal["exact", "fast", "auto"] = "auto"


register(Experiment(
    "convergence-moving", "mean-field convergence of a law that moves (S¹, β = 9): distance vs n and t, and when "
    "each n leaves the mean field", MovingConvergenceConfig, Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(log2_n_min=4, log2_n_max=8, log2_n_step=4, seeds=2, t1=0.4, dt=0.1, num_times=2, order=64,
              log2_n_ref=4)))  # n_ref is the particle reference's only: n > n_ref is fine here
