r"""Equiangular starts against the reduced ODE for the common inner product
(docs: math/sphere.md#equiangular-starts).

If the Gram matrix of the start is equiangular, ⟨x_i, x_j⟩ = ρ0 for all i ≠ j (orthogonal
tokens: ρ0 = 0, which needs d >= n), symmetry keeps it equiangular and ρ(t) solves
(GLPR `thm: orthogonal`)

$$\text{SA: }\dot\rho=\frac{2e^{\beta\rho}(1-\rho)((n-1)\rho+1)}{e^\beta+(n-1)e^{\beta\rho}},\qquad
\text{USA: }\dot\rho=\tfrac2n e^{\beta\rho}(1-\rho)((n-1)\rho+1).$$

Fixed points: ρ = 1 (one cluster) and ρ = −1/(n−1) (the regular simplex, stationary). Near
ρ = 1, 1 − ρ decays like e^{−2t} (SA) and e^{−2e^β t} (USA). The experiment integrates the
n-token system and the scalar ODE (for the gap u = 1 − ρ, accurate however small u gets)
with the same adaptive solver and reports the largest deviation over all pairs and times,
and the late-time decay rates of the gap.
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._common import finish_panel, model_dynamics, pid
from ._progress import solver_meter
from .configs.equiangular import EquiangularConfig


def _controller(cfg, dtype):
    return pid(cfg.rtol, dtype)


_FINE = 20  # the reduced ODE is saved on a grid _FINE times finer, to resolve fast rates


def compute(cfg: EquiangularConfig, progress: bool = False) -> Result:
    x0 = tp.theory.equiangular.equiangular_start(jax.random.key(cfg.seed), cfg.n, cfg.d, cfg.rho0)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
    off = ~np.eye(cfg.n, dtype=bool)
    betas = np.asarray(cfg.betas)
    out = {"ts": np.asarray(ts), "betas": betas}
    equiangular = tp.theory.equiangular
    reduced_ode = {"SA": equiangular.SAReducedODE, "USA": equiangular.USAReducedODE}
    for model in cfg.models:
        rho_sim, rho_ode, gaps, dev, rate = [], [], [], [], []
        for beta in betas:
            sol = tp.solve(model_dynamics(model, cfg.d, beta), x0, t1=cfg.t1, dt0=1e-3,
                           saveat=diffrax.SaveAt(ts=ts, fn=lambda t, x, args: x @ x.T),
                           stepsize_controller=_controller(cfg, x0.dtype),
                           progress_meter=solver_meter(progress))
            gram = np.asarray(sol.stats)[:, off]  # (T, n(n-1)) pairwise inner products
            fine = jnp.linspace(0.0, cfg.t1, (cfg.num_saves - 1) * _FINE + 1)
            ode = reduced_ode[model](cfg.n, jnp.asarray(beta, x0.dtype))
            gap = np.asarray(tp.theory.equiangular.reduced_gap(ode, jnp.asarray(cfg.rho0, x0.dtype), fine,
                                                               pid(cfg.rtol, x0.dtype, atol_ratio=1e-20)))
            r = 1 - gap[::_FINE]
            rho_sim.append(gram.mean(axis=1))
            rho_ode.append(r)
            gaps.append(gap[::_FINE])
            dev.append(np.abs(gram - r[:, None]).max())
            rate.append(decay_rate(np.asarray(fine), 1 - gap))
        out[f"rho_{model}"] = np.stack(rho_sim)
        out[f"rho_ode_{model}"] = np.stack(rho_ode)
        out[f"gap_ode_{model}"] = np.stack(gaps)
        out[f"max_deviation_{model}"] = np.asarray(dev)
        out[f"rate_{model}"] = np.asarray(rate)
        out[f"predicted_rate_{model}"] = (2.0 * np.ones(len(betas)) if model == "SA"
                                          else 2.0 * np.exp(betas))
    return Result(out)


def decay_rate(ts, rho, lo=1e-12, hi=1e-4):
    """−d log(1 − ρ)/dt fitted where 1 − ρ lies in [lo, hi] (NaN if fewer than 3 points)."""
    gap = 1 - np.asarray(rho)
    m = (gap > lo) & (gap < hi)
    if m.sum() < 3:
        return np.nan
    return -np.polyfit(ts[m], np.log(gap[m]), 1)[0]


def figures(res: Result, cfg: EquiangularConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts, betas = res["ts"], res["betas"]
    models = list(cfg.models)
    fig, axs = plt.subplots(len(models), 2, figsize=(10, 3.5 * len(models)), layout="constrained",
                            squeeze=False)
    for r, model in enumerate(models):
        for k, beta in enumerate(betas):
            c = f"C{k}"
            axs[r, 0].plot(ts, res[f"rho_ode_{model}"][k], color=c, label=f"ODE, β = {beta:g}")
            axs[r, 0].plot(ts[::3], res[f"rho_{model}"][k][::3], "o", ms=3, color=c)
            gap = np.clip(res[f"gap_ode_{model}"][k], 1e-300, None)
            axs[r, 1].semilogy(ts, gap, color=c,
                               label=f"β = {beta:g}: rate {res[f'rate_{model}'][k]:.4g} "
                                     f"(predicted {res[f'predicted_rate_{model}'][k]:.4g})")
            axs[r, 1].semilogy(ts[::3], np.clip(1 - res[f"rho_{model}"][k][::3], 1e-300, None), "o",
                               ms=3, color=c)
        axs[r, 0].set_title(f"{model}: ⟨x_i,x_j⟩ (dots: n={cfg.n} tokens, max dev "
                            f"{res[f'max_deviation_{model}'].max():.1e})", fontsize=9)
        axs[r, 0].set_ylabel("ρ(t)")
        axs[r, 1].set_ylabel("1 − ρ(t)")
        axs[r, 1].set_ylim(1e-12, 2)
        for ax in axs[r]:
            finish_panel(ax, legend=7, xlabel="t")
    return [tp.plot.save_figure(fig, out_dir / "equiangular.png")]
