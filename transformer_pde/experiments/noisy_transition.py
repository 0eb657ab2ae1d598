r"""The phase transition of noisy attention on S¹: stationary branches, folds, a phase diagram (sphere.md §12).

Noisy USA (Mun–Rosenzweig, arXiv 2606.05140, 2604.16288): dX = K P⊥Γ dt + σ dB^S. The uniform law
is linearly stable iff K < K_#(β) = σ²β/(2I_1(β)); the transition is continuous for β < β_* (root of
I_2/I_1 = 1/2, β_* = 2.447) and discontinuous beyond: the clustered branch leaves K_# backwards and
turns at a fold K_c < K_#, so on [K_c, K_#] the uniform and the clustered state are both stable.
Here the branches are computed, not guessed: Newton continuation of the stationary Fokker–Planck
equation (:mod:`transformer_pde.solvers.circle_branches`), each point with the spectrum of its
linearization. Left: the order parameter m = |∫x dρ| against K for each β, stable solid, unstable
dashed, K_# of the theory and the folds marked. Right: the phase diagram over (β, K): K_#(β) and
the computed fold K_c(β).

Particle curves (the order parameter of noisy particles on S¹ and S², K swept up then down for
the hysteresis) need independent noise on particles in ``tp.solve`` (issue 21 item 1, another
branch): ``particles = true`` is refused until that lands.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt

import transformer_pde as tp

from .._lazy import jax, jnp
from ..runs.result import Result, grid
from ._base import Experiment, register
from ._common import ATTENTIONS
from ._options import Options


@dataclasses.dataclass(frozen=True)
class NoisyTransitionConfig(Options):
    model: Literal["SA", "USA"] = "USA"
    """USA (spec §12's noisy USA) or SA (softmax; its transition stays continuous on S¹)."""
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
    particles: bool = False
    """Noisy particle curves (S¹ and S², K swept up then down). Needs independent noise on
    particles in tp.solve (issue 21 item 1), not on this branch: true is refused for now."""

    def validate(self):
        if self.particles:
            raise ValueError("particles = true needs independent noise on particles in tp.solve "
                             "(tp.solve(..., noise=...), issue 21 item 1), not available yet")


def _dynamics(cfg, beta):
    return tp.Sphere(ATTENTIONS[cfg.model]().identity(2, float(beta), dtype=jnp.float64))


def _theory(cfg, beta):
    ns = tp.theory.noisy_sphere
    return {"SA": ns.NoisySA, "USA": ns.NoisyUSA}[cfg.model](beta=float(beta), sigma=cfg.sigma)


def compute(cfg: NoisyTransitionConfig, progress: bool = False) -> Result:
    with jax.enable_x64(True):  # the solvers and Newton tolerances are float64 ones
        cb = tp.solvers.circle_branches
        branches = []
        for beta in cfg.betas:
            Ks = _theory(cfg, beta).critical_coupling()
            branches.append(cb.branch_from_uniform(_dynamics(cfg, beta), cfg.sigma, modes=cfg.modes,
                                                   K_max=cfg.K_factor * Ks, max_points=cfg.max_points))
        P = max(len(b.K) for b in branches)
        pad = lambda v: np.concatenate([v, np.full(P - len(v), np.nan)])  # noqa: E731
        K = np.stack([pad(b.K) for b in branches])
        order = np.stack([pad(b.order) for b in branches])
        stable = np.stack([pad(b.stable.astype(float)) for b in branches])
        fold = np.array([b.folds[0] if b.folds else np.nan for b in branches])
        pb = np.asarray(cfg.phase_betas, dtype=float)
        K_sharp = np.array([_theory(cfg, b).critical_coupling() for b in pb])
        K_bif = np.zeros_like(pb)
        K_fold = np.full_like(pb, np.nan)
        for i, beta in enumerate(pb):
            b = cb.branch_from_uniform(_dynamics(cfg, beta), cfg.sigma, modes=cfg.modes,
                                       K_max=cfg.K_factor * K_sharp[i], max_points=cfg.max_points)
            K_bif[i] = b.bifurcation
            K_fold[i] = b.folds[0] if b.folds else np.nan
        try:
            beta_star = tp.theory.noisy_sphere.critical_beta(type(_theory(cfg, 1.0)), 2)
        except ValueError:
            beta_star = np.nan
        arrays = {"betas": np.asarray(cfg.betas, float), "K": K, "order": order, "stable": stable, "fold": fold,
                  "K_sharp_branches": np.array([_theory(cfg, b).critical_coupling() for b in cfg.betas]),
                  "bifurcation": np.array([b.bifurcation for b in branches]),
                  "phase_betas": pb, "K_sharp": K_sharp, "K_bifurcation": K_bif, "K_fold": K_fold,
                  "beta_star": np.asarray(beta_star)}
        grids = {"phase": grid({"beta": pb}, K_sharp=(("beta",), K_sharp), K_bifurcation=(("beta",), K_bif),
                               K_fold=(("beta",), K_fold))}
        return Result(arrays, grids)


def figures(res: Result, cfg: NoisyTransitionConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for i, beta in enumerate(res["betas"]):
        K, m, st = res["K"][i], res["order"][i], res["stable"][i]
        ok = np.isfinite(K)
        K, m, st = K[ok], m[ok], st[ok] > 0.5
        Ks = float(res["K_sharp_branches"][i])
        x = K / Ks
        for j in range(len(x) - 1):
            ax.plot(x[j:j + 2], m[j:j + 2], "-" if st[j + 1] else "--", color=f"C{i}")
        ax.plot([0.5, 1.0], [0, 0], "-", color=f"C{i}")
        ax.plot([1.0, x.max()], [0, 0], "--", color=f"C{i}")
        ax.plot([], [], "-", color=f"C{i}", label=f"β = {beta:g}")
        if np.isfinite(res["fold"][i]):
            ax.plot(res["fold"][i] / Ks, m[np.argmin(K)], "v", color=f"C{i}", ms=8,
                    label=f"fold K_c = {res['fold'][i] / Ks:.3f} K_#")
    ax.axvline(1.0, color="k", lw=0.8, ls=":", label="K_# (theory)")
    ax.set_xlabel("K / K_#(β)")
    ax.set_ylabel("order parameter m = |∫x dρ|")
    ax.set_title(f"{cfg.model} on S¹, σ = {cfg.sigma:g}: stationary branches (solid stable)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1]
    pb = res["phase_betas"]
    ax.plot(pb, res["K_sharp"], "k-", label="K_#(β): uniform law loses stability")
    ax.plot(pb, res["K_bifurcation"], "k+", ms=8, label="bifurcation found by continuation")
    f = np.isfinite(res["K_fold"])
    if f.any():
        ax.plot(pb[f], res["K_fold"][f], "o-", color="C3", label="fold K_c(β)")
        ax.fill_between(pb[f], res["K_fold"][f], res["K_sharp"][f], color="C3", alpha=0.2, label="bistable")
    if np.isfinite(res["beta_star"]):
        ax.axvline(float(res["beta_star"]), color="C2", ls=":", label=f"β_* = {float(res['beta_star']):.3f}")
    ax.set_yscale("log")
    ax.set_xlabel("β")
    ax.set_ylabel("K")
    ax.set_title("phase diagram: uniform below, clustered above")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return [tp.plot.save_figure(fig, out_dir / "noisy_transition.png")]


register(Experiment(
    "noisy-transition", "noisy attention on S¹: stationary branches, folds and the (β, K) phase diagram",
    NoisyTransitionConfig, compute, figures,
    tiny=dict(betas=(1.5, 4.0), phase_betas=(2.0, 4.0), modes=24, max_points=60)))
