"""The `clustering` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.clustering`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from .._base import Deferred, Experiment, register
from .._common import MODELS, rescaled_usa_step
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.clustering"


@dataclasses.dataclass(frozen=True)
class ClusteringConfig(Options):
    n: Annotated[int, Ge(1)] = 256
    d: Annotated[int, Ge(2)] = 3
    beta: float = 1.0
    """Inverse temperature β of the attention, any real number (β < 0: repulsive attention)."""
    t1: Annotated[float, Gt(0)] = 30.0
    dt: Annotated[float, Gt(0)] = 0.1
    """Step of SA; USA uses dt / max(sqrt(β) e^{β−1/2}, 1) (the authors' rule)."""
    seed: int = 0
    models: tuple[Literal["SA", "USA"], ...] = MODELS
    """Models to run: SA (softmax) and/or USA (unnormalized, GLPR's 1/n)."""
    num_saves: Annotated[int, Ge(2)] = 61
    threshold: Annotated[float, Interval(ge=-1, lt=1)] = 0.999
    animate: bool = True
    """Write clustering.gif (tokens over time; d = 2 or 3)."""
    frames: Annotated[int, Ge(2)] = 31
    """Animation frames (at most num_saves), spread evenly over the saves."""
    scheme: Literal["projected", "post-ln"] = "projected"
    """Layer normalization: 'projected' x ← N(x + h P⊥Γ(x)) (tp.Sphere, GLPR's flow) or 'post-ln'
    x ← N(x + h Γ(x)) (tp.PostLN, the authors' code)."""
    solver: Literal["tsit5", "euler"] = "tsit5"
    """'tsit5': the continuous flow (steps dt); 'euler': the discrete layers of step dt (saves
    must fall on layers)."""
    usa_step: Literal["rescaled", "raw"] = "rescaled"
    """USA's step: 'rescaled' dt / max(√β e^{β−1/2}, 1) (the authors' phase-diagram rule) or 'raw' dt."""
    backend: Literal["exact", "fast", "auto"] = "exact"
    """pair kernel: 'exact' (dense / streaming), 'fast' (NUFFT Gaussian sums, d <= 3: n = 10^6 in
    minutes), 'auto' (fast where predicted cheaper and accurate; kernels/backends.py)."""
    tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-8
    """planned error of the fast kernel, relative to the total mass."""
    max_tokens_saved: Annotated[int, Ge(2)] = 4096
    """Above this n, the saved trajectories, cluster counts, energies and figures use a fixed random
    subsample of this many tokens (counts and energies are O(n²) in the tokens they see; the
    dynamics always moves all n). With ``backend = "fast"`` this runs n = 10⁶."""
    start: Literal["uniform", "kinetic"] = "uniform"
    """'uniform': i.i.d. uniform on S^{d-1} (seed); 'kinetic': GKPR kinetic.py's five tokens on
    the circle (n = 5, d = 2)."""

    def footprint(self):
        # the statistics see at most max_tokens_saved tokens, every save at once (pairs: counts)
        m = ("min(n, max_tokens_saved)", min(self.n, self.max_tokens_saved))
        return {"pair statistics of the saves": sizes(self, "num_saves", m, m),
                "saved trajectory": sizes(self, "num_saves", m, "d"), "tokens": sizes(self, "n", "d")}

    def validate(self):
        if self.start == "kinetic" and (self.n, self.d) != (5, 2):
            raise ValueError(f"start='kinetic' is kinetic.py's five tokens on the circle: needs n=5, "
                             f"d=2, got n={self.n}, d={self.d}")
        if self.solver == "euler":
            interval = self.t1 / (self.num_saves - 1)
            for model in self.models:
                k = interval / self.step_of(model)
                if not abs(k - round(k)) < 1e-9 * max(k, 1):
                    raise ValueError(f"solver='euler' runs layers: the saves every {interval:g} must fall on "
                                     f"layers of {model}'s step {self.step_of(model):g} (choose t1, num_saves"
                                     f"{', usa_step=raw' if model == 'USA' else ''})")

    def step_of(self, model: str) -> float:
        """The step of ``model``: dt, or USA's rescaled step unless ``usa_step='raw'``."""
        return self.dt if model == "SA" or self.usa_step == "raw" else rescaled_usa_step(self.dt, self.beta)


register(Experiment(
    "clustering", "tokens uniform on S^2, Q=K=V=I, SA and USA: collapse to one cluster (GLPR)",
    ClusteringConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures"),
    tiny=dict(n=32, t1=15.0, dt=0.2, num_saves=7, frames=4), resumable=True))
