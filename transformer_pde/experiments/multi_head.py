r"""Scalar multi-head attention on equiangular starts (arXiv 2605.04279; issue 38 item 4; docs:
math/sphere.md#equiangular-multi-head-attention).

Head h scores with β a_h⟨x, y⟩ and writes w_h times its softmax average
(``tp.MultiHeadAttention.scalar``); an equiangular start keeps a common inner product ρ, which
follows ``tp.theory.equiangular.MultiHeadReducedODE``. Two parts:

* **critical β**: a selective head (a, w) against a uniform repulsive one (0, −c). Tokens cluster
  (ρ → 1) below β_c = ln(1 + n(w/c − 1)) / (a(1 − ρ0)) and spread to the simplex (ρ → −1/(n−1))
  above it; particles and the reduced ODE at β = ratio · β_c for each ratio of ``beta_ratios``.
* **super-additive rates**: two attractive heads of scores a₁ ≠ a₂ (``rate_scores``), alone and
  together; the rate 1/T of reaching ρ = ``rho_target`` together exceeds the sum of the rates alone
  (T by quadrature of the reduced ODE, and measured on the particles).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._common import finish_panel, pid
from .configs.multi_head import MultiHeadConfig


def _mean_rho(x):
    """The mean pairwise inner product of each saved state, (T,)."""
    n = x.shape[-2]
    return (jnp.sum(x @ jnp.swapaxes(x, -1, -2), axis=(-2, -1)) - n) / (n * (n - 1))


def _particles(cfg, scores, values, beta, x0, ts):
    attn = tp.Sphere(tp.MultiHeadAttention.scalar(cfg.d, np.asarray(scores), np.asarray(values), beta))
    sol = tp.solve(attn, x0, t1=cfg.t1, dt0=1e-2, saveat=diffrax.SaveAt(ts=ts, fn=lambda t, x, args: _mean_rho(x)),
                   stepsize_controller=pid(cfg.rtol, x0.dtype))
    return np.asarray(sol.stats)


def crossing_time(ts, rho, target):
    """The first time ρ(t) reaches ``target`` (linear interpolation between saves; inf if never)."""
    above = np.nonzero(rho >= target)[0]
    if above.size == 0:
        return np.inf
    i = above[0]
    if i == 0:
        return float(ts[0])
    return float(ts[i - 1] + (target - rho[i - 1]) * (ts[i] - ts[i - 1]) / (rho[i] - rho[i - 1]))


def compute(cfg: MultiHeadConfig, progress: bool = False) -> Result:
    eq = tp.theory.equiangular
    x0 = eq.equiangular_start(jax.random.key(cfg.seed), cfg.n, cfg.d, cfg.rho0)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
    controller = pid(cfg.rtol, x0.dtype, atol_ratio=1e-20)
    beta_c = eq.multihead_critical_beta(cfg.n, cfg.score, cfg.value, cfg.repulsion, cfg.rho0)
    scores, values = (cfg.score, 0.0), (cfg.value, -cfg.repulsion)
    rho, rho_ode = [], []
    for ratio in cfg.beta_ratios:
        beta = ratio * beta_c
        rho.append(_particles(cfg, scores, values, beta, x0, ts))
        ode = eq.MultiHeadReducedODE(cfg.n, beta, scores, values)
        rho_ode.append(1 - np.asarray(eq.reduced_gap(ode, jnp.asarray(cfg.rho0, x0.dtype), ts, controller)))
    rho, rho_ode = np.stack(rho), np.stack(rho_ode)

    # rates: head 1 alone, head 2 alone, both
    heads = ([cfg.rate_scores[0]], [cfg.rate_scores[1]], list(cfg.rate_scores))
    T_quad, T_part, rho_rates = [], [], []
    for sc in heads:
        vals = [1.0] * len(sc)
        T_quad.append(eq.hitting_time(eq.MultiHeadReducedODE(cfg.n, cfg.rate_beta, sc, vals), cfg.rho0, cfg.rho_target))
        r = _particles(cfg, sc, vals, cfg.rate_beta, x0, ts)
        rho_rates.append(r)
        T_part.append(crossing_time(np.asarray(ts), r, cfg.rho_target))
    T_quad, T_part = np.asarray(T_quad), np.asarray(T_part)
    return Result({
        "ts": np.asarray(ts), "beta_ratios": np.asarray(cfg.beta_ratios, dtype=float), "beta_c": np.asarray(beta_c),
        "rho": rho, "rho_ode": rho_ode, "max_deviation": np.abs(rho - rho_ode).max(axis=1),
        "rho_rates": np.stack(rho_rates), "hitting_time_quadrature": T_quad, "hitting_time_particles": T_part,
        # 1/T of heads 1, 2, both, and the excess of both over the sum (super-additivity > 0)
        "rate_quadrature": 1 / T_quad, "rate_particles": 1 / T_part,
        "excess_quadrature": np.asarray(1 / T_quad[2] - 1 / T_quad[0] - 1 / T_quad[1]),
        "excess_particles": np.asarray(1 / T_part[2] - 1 / T_part[0] - 1 / T_part[1]),
    })


def figures(res: Result, cfg: MultiHeadConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts, ratios = res["ts"], res["beta_ratios"]
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2), layout="constrained")
    cmap = plt.get_cmap("coolwarm")
    every = max(1, len(ts) // 30)
    for k, r in enumerate(ratios):
        c = cmap(k / max(1, len(ratios) - 1))
        axs[0].plot(ts, res["rho_ode"][k], color=c, label=f"β/β_c = {r:g}")
        axs[0].plot(ts[::every], res["rho"][k][::every], "o", ms=2.5, color=c)
    axs[0].axhline(-1 / (cfg.n - 1), color="k", lw=0.6, ls=":")
    axs[0].set(xlabel="t", ylabel="ρ(t)", title=f"selective (a={cfg.score:g}, w={cfg.value:g}) + repulsive "
               f"(−{cfg.repulsion:g}) head, n={cfg.n}\nlines: reduced ODE, dots: particles "
               f"(max dev {res['max_deviation'].max():.1e})")
    axs[0].legend(fontsize=6, ncol=2)
    axs[0].grid(alpha=0.3)
    axs[1].plot(ratios, res["rho_ode"][:, -1], "-", color="C0", label="reduced ODE")
    axs[1].plot(ratios, res["rho"][:, -1], "o", color="C1", label="particles")
    axs[1].axvline(1.0, color="k", ls="--", lw=0.8, label=f"closed form β_c = {float(res['beta_c']):.4g}")
    finish_panel(axs[1], legend=7, xscale="log", xlabel="β / β_c", ylabel=f"ρ(t = {cfg.t1:g})",
                 title="one cluster below β_c, simplex above")
    labels = [f"a={cfg.rate_scores[0]:g}", f"a={cfg.rate_scores[1]:g}", "sum", "both heads"]
    rq, rp = res["rate_quadrature"], res["rate_particles"]
    x = np.arange(4)
    axs[2].bar(x - 0.2, [rq[0], rq[1], rq[0] + rq[1], rq[2]], 0.4, label="quadrature of the reduced ODE")
    axs[2].bar(x + 0.2, [rp[0], rp[1], rp[0] + rp[1], rp[2]], 0.4, label="particles")
    axs[2].set_xticks(x, labels)
    finish_panel(axs[2], legend=7, ylabel=f"rate 1/T, T: ρ0 → {cfg.rho_target:g}",
                 title=f"super-additive: excess {float(res['excess_quadrature']):.3g} (ODE), "
                       f"{float(res['excess_particles']):.3g} (particles)")
    return [tp.plot.save_figure(fig, out_dir / "multi_head.png")]
