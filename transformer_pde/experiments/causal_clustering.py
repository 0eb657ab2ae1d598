"""Causal clustering (docs: math/causal.md#clustering-to-the-first-token): decoder attention drives every token to
x_1(0).

CSA with Q = K = V = I on S^{d-1}: token k attends to tokens j <= k (softmax over the
prefix, self included, as in the authors' blog code). The first token never moves; for almost
every start all tokens converge to x_1(0) (Thm 1; asserted here only for Q = K = I, the case
that has been checked; docs: math/causal.md#clustering-to-the-first-token). At larger β the tokens first gather into
metastable clusters around the strong Rényi centers, tokens farther than δ = cβ^{-1/2} from every earlier token;
their expected number among n i.i.d. uniform tokens is (1 − (1 − p)^n)/p with p = σ(B_δ), which
is Θ(β^{(d−1)/2}) for n large.
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import finish_panel
from .configs.causal_clustering import CausalClusteringConfig


def compute(cfg: CausalClusteringConfig, progress: bool = False) -> Result:
    betas = np.asarray(cfg.betas)
    keys = jax.random.split(jax.random.key(0), cfg.seeds)
    x0s = [tp.uniform_sphere(k, cfg.n, cfg.d) for k in keys]
    counts = np.zeros((len(betas), cfg.seeds), dtype=int)
    renyi_low = np.zeros_like(counts)
    renyi_high = np.zeros_like(counts)
    for a, beta in enumerate(betas):
        dyn = tp.Sphere(tp.Causal(tp.SoftmaxAttention.identity(cfg.d, float(beta))))
        for s, x0 in enumerate(x0s):
            sol = tp.solve(dyn, x0, t1=cfg.t1, dt0=cfg.dt, solver=diffrax.Euler())
            counts[a, s] = int(tp.diagnostics.cluster_count(sol.final, cfg.threshold))
            renyi_low[a, s] = int(tp.diagnostics.renyi_centers(x0, cfg.c_high / np.sqrt(beta)).sum())
            renyi_high[a, s] = int(tp.diagnostics.renyi_centers(x0, cfg.c_low / np.sqrt(beta)).sum())
    expected_low = np.array([tp.theory.causal_clustering.expected_renyi_centers(cfg.n, cfg.d, cfg.c_high / np.sqrt(b))
                             for b in betas])
    expected_high = np.array([tp.theory.causal_clustering.expected_renyi_centers(cfg.n, cfg.d, cfg.c_low / np.sqrt(b))
                              for b in betas])
    mean = counts.mean(1)
    slope = np.polyfit(np.log(betas), np.log(mean), 1)[0] if len(betas) > 1 else np.nan
    # the long run: all tokens to x_1(0)
    dyn = tp.Sphere(tp.Causal(tp.SoftmaxAttention.identity(cfg.d, cfg.beta_long)))
    dist = []
    for x0 in x0s:
        sol = tp.solve(dyn, x0, t1=cfg.t_long, dt0=cfg.dt, solver=diffrax.Tsit5(),
                    saveat=jnp.linspace(0, cfg.t_long, 51))
        dist.append(np.asarray(jnp.max(jnp.linalg.norm(sol.xs - x0[0][None, None, :], axis=-1), axis=-1)))
    arrays = {
        "betas": betas, "counts": counts, "mean_count": mean,
        "renyi_low": renyi_low, "renyi_high": renyi_high,
        "expected_renyi_low": expected_low, "expected_renyi_high": expected_high,
        "slope": np.asarray(slope), "slope_law": np.asarray((cfg.d - 1) / 2),
        "long_ts": np.linspace(0, cfg.t_long, 51), "long_dist": np.stack(dist),
        "long_final_dist": np.asarray(np.stack(dist)[:, -1].max()),
    }
    seeds = np.arange(cfg.seeds)
    grids = {"clusters": grid({"beta": betas, "seed": seeds}, count=(("beta", "seed"), counts),
                              renyi_low=(("beta", "seed"), renyi_low),
                              renyi_high=(("beta", "seed"), renyi_high),
                              expected_renyi_low=(("beta",), expected_low),
                              expected_renyi_high=(("beta",), expected_high),
                              describe={
                                  "beta": ("inverse temperature β of the causal attention", ""),
                                  "seed": ("index of the uniform start on the sphere", ""),
                                  "count": ("clusters of the final tokens (cluster_count at the threshold)", ""),
                                  "renyi_low": ("Rényi centers of the start at δ = c_high β^{-1/2}", ""),
                                  "renyi_high": ("Rényi centers of the start at δ = c_low β^{-1/2}", ""),
                                  "expected_renyi_low": ("expected Rényi centers of n uniform tokens at "
                                                         "δ = c_high β^{-1/2}", ""),
                                  "expected_renyi_high": ("expected Rényi centers of n uniform tokens at "
                                                          "δ = c_low β^{-1/2}", "")}),
             "long_run": grid({"seed": seeds, "t": arrays["long_ts"]}, dist=(("seed", "t"), arrays["long_dist"]),
                              describe={
                                  "seed": ("index of the uniform start on the sphere", ""),
                                  "t": ("time t of the dynamics at β = beta_long", ""),
                                  "dist": ("largest distance |x_k(t) - x_1(0)| over the tokens", "")})}
    return Result(arrays, grids)


def figures(res: Result, cfg: CausalClusteringConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    b = res["betas"]
    for s in range(res["counts"].shape[1]):
        ax.plot(b, res["counts"][:, s], "o", color="C0", alpha=0.4, ms=4)
    ax.plot(b, res["mean_count"], "o-", color="C0", label=f"clusters at t={cfg.t1:g} (mean)")
    ax.fill_between(b, res["expected_renyi_low"], res["expected_renyi_high"], color="C1", alpha=0.3,
                    label=f"E #Rényi centers, δ ∈ [{cfg.c_low:g}, {cfg.c_high:g}]/√β")
    bb = np.geomspace(b.min(), b.max(), 50)
    law = (cfg.d - 1) / 2
    c0 = np.exp(np.mean(np.log(res["mean_count"]) - law * np.log(b)))
    ax.plot(bb, c0 * bb**law, "k--", lw=1, label=f"β^{{{law:g}}} law")
    finish_panel(ax, grid="both", xscale="log", yscale="log", xlabel="β", ylabel="clusters",
                 title=f"causal SA, n={cfg.n}, d={cfg.d}: fitted slope {float(res['slope']):.2f} (law {law:g})")
    ax = axes[1]
    for s in range(res["long_dist"].shape[0]):
        ax.semilogy(res["long_ts"], np.maximum(res["long_dist"][s], 1e-16))
    ax.set_xlabel("t")
    ax.set_ylabel("max_k |x_k(t) − x_1(0)|")
    ax.set_title(f"β={cfg.beta_long:g}: all tokens go to x_1(0)")
    ax.grid(alpha=0.3)
    return [tp.plot.save_figure(fig, out_dir / "causal_clustering.png")]
