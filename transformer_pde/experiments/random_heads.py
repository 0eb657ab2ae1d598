"""Random multi-head attention (docs: math/random_heads.md): the chain, its common-noise SDE, the logistic law.

Heads θ = (V, A = W W'ᵀ) with Gaussian entries are drawn afresh in every layer. Three outcomes:

1. **Zero drift** in the Gaussian case: the mean field b = E_θ B_θ vanishes (B is odd in V);
   with V = I + Gaussian it does not.
2. **Weak error**: in the diffusive clock s = ℓη²σ²/H the chain converges, as depth L grows at
   fixed s, to the Itô SDE with common noise (diffrax, VirtualBrownianTree); the error in
   E m(s), m = n^{-2}Σ⟨x_i, x_j⟩, decreases like 1/L.
3. **Logistic overlaps**: for small β the mean overlap follows u' = u(1 − u) up to O(1/d).
"""
from __future__ import annotations

import jax
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import finish_panel
from ._progress import progress_bar
from .configs.random_heads import RandomHeadsConfig


def compute(cfg: RandomHeadsConfig, progress: bool = False) -> Result:
    runs = tp.solvers.random_transformer
    key = jax.random.key(cfg.seed)
    k_x, k_b, k_sde, k_chain, k_log = jax.random.split(key, 5)
    x0 = tp.uniform_sphere(k_x, cfg.n, cfg.d)
    heads = tp.GaussianHeads(cfg.d, beta=cfg.beta)
    bar = progress_bar(progress, total=3 + len(cfg.depths) + len(cfg.logistic_dims), desc="random-heads")
    # 1. drift
    b, b_se = tp.models.random_heads.expected_head(k_b, heads, x0, cfg.drift_samples)
    b1, b1_se = tp.models.random_heads.expected_head(k_b, tp.GaussianHeads(cfg.d, beta=cfg.beta, v_mean=1.0), x0,
                                 cfg.drift_samples)
    bar.update(2)
    # 2. weak error, chain vs SDE at s1
    sde_x = tp.runs.kept(lambda keys: jax.lax.map(
        lambda k: runs.sde(k, heads, x0, cfg.s1, cfg.s1 / cfg.sde_steps, num_nodes=cfg.sde_nodes)[-1],
        keys, batch_size=256))(jax.random.split(k_sde, cfg.sde_paths))
    m_sde = np.asarray(tp.diagnostics.mean_overlap(sde_x))
    bar.update()
    depths = np.asarray(cfg.depths)
    m_chain, se_chain = [], []
    for i, L in enumerate(depths):
        keys = jax.random.split(jax.random.fold_in(k_chain, i), cfg.chain_paths)
        xs = jax.lax.map(lambda k, L=int(L): runs.diffusive_chain(k, heads, x0, cfg.s1, L, cfg.num_heads)[-1],
                         keys, batch_size=1024)
        m = np.asarray(tp.diagnostics.mean_overlap(xs))
        m_chain.append(m.mean())
        se_chain.append(m.std(ddof=1) / np.sqrt(len(m)))
        bar.update()
    m_chain, se_chain = np.array(m_chain), np.array(se_chain)
    se_sde = m_sde.std(ddof=1) / np.sqrt(len(m_sde))
    err = m_chain - m_sde.mean()
    se_err = np.sqrt(se_chain**2 + se_sde**2)
    resolved = np.abs(err) > 3 * se_err
    slope = (np.polyfit(np.log(depths[resolved]), np.log(np.abs(err[resolved])), 1)[0]
             if resolved.sum() >= 2 else np.nan)
    # 3. logistic overlaps
    dims = np.asarray(cfg.logistic_dims)
    s_grid = np.linspace(0, cfg.logistic_s1, 11)
    m_log, u_log, se_log = [], [], []
    for i, d in enumerate(dims):
        hd = tp.GaussianHeads(int(d), beta=cfg.logistic_beta, sigma_A=float(d) ** -0.5)
        y0 = tp.uniform_sphere(jax.random.fold_in(k_log, 100 + i), cfg.logistic_n, int(d))
        keys = jax.random.split(jax.random.fold_in(k_log, i), cfg.logistic_paths)
        xs = tp.runs.kept(lambda keys, hd=hd, y0=y0: jax.vmap(lambda k: runs.diffusive_chain(
            k, hd, y0, cfg.logistic_s1, cfg.logistic_layers, save_every=cfg.logistic_layers // 10))(keys))(keys)
        m = np.asarray(tp.diagnostics.mean_overlap(xs))
        m_log.append(m.mean(0))
        se_log.append(m.std(0, ddof=1) / np.sqrt(m.shape[0]))
        u_log.append(tp.theory.logistic_overlap.logistic(float(m[0, 0]), s_grid))
        bar.update()
    bar.close()
    m_log, u_log, se_log = np.stack(m_log), np.stack(u_log), np.stack(se_log)
    arrays = {
        "b_gauss": np.asarray(b), "b_gauss_se": np.asarray(b_se),
        "b_gauss_z": np.asarray(np.max(np.abs(b) / b_se)),
        "b_shift": np.asarray(b1), "b_shift_z": np.asarray(np.max(np.abs(b1) / b1_se)),
        "depths": depths, "m_chain": m_chain, "se_chain": se_chain,
        "m_sde": np.asarray(m_sde.mean()), "se_sde": np.asarray(se_sde),
        "weak_error": err, "weak_error_se": se_err, "weak_slope": np.asarray(slope),
        "m0": np.asarray(tp.diagnostics.mean_overlap(x0)),
        "logistic_dims": dims, "logistic_s": s_grid, "logistic_m": m_log, "logistic_se": se_log,
        "logistic_u": u_log, "logistic_err": np.abs(m_log - u_log).max(1),
    }
    grids = {
        "weak_error": grid({"depth": depths}, m_chain=(("depth",), m_chain), se_chain=(("depth",), se_chain),
                           weak_error=(("depth",), err), weak_error_se=(("depth",), se_err),
                           describe={
                               "depth": ("depth L of the chain at fixed diffusive time s1", ""),
                               "m_chain": ("mean overlap m = n^{-2} Σ_ij <x_i, x_j> of the chain at s1, "
                                           "mean over paths", ""),
                               "se_chain": ("standard error of m_chain over paths", ""),
                               "weak_error": ("weak error: m_chain minus the SDE's mean overlap at s1", ""),
                               "weak_error_se": ("standard error of weak_error (chain and SDE)", "")}),
        "logistic": grid({"d": dims, "s": s_grid}, m=(("d", "s"), m_log), se=(("d", "s"), se_log),
                         u=(("d", "s"), u_log),
                         describe={
                             "d": ("dimension d of the tokens", ""),
                             "s": ("diffusive clock s = ℓη²σ²/H", ""),
                             "m": ("mean overlap m = n^{-2} Σ_ij <x_i, x_j> of the chain, mean over paths", ""),
                             "se": ("standard error of m over paths", ""),
                             "u": ("logistic law u' = u(1 − u) started at the measured m(0)", "")}),
    }
    return Result(arrays, grids)


def figures(res: Result, cfg: RandomHeadsConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    ax = axes[0]
    z = np.abs(res["b_gauss"]).ravel() / res["b_gauss_se"].ravel()
    ax.hist(z, bins=15, alpha=0.7, label="Gaussian V: |b̂|/s.e.")
    ax.axvline(float(res["b_shift_z"]), color="C3", label=f"V = I + Gaussian: max {float(res['b_shift_z']):.0f}")
    ax.set_xlabel("|E_θ B_θ| in standard errors")
    ax.set_title("mean field b = E_θ B_θ")
    ax.legend(fontsize=8)
    ax = axes[1]
    L, e, se = res["depths"], np.abs(res["weak_error"]), res["weak_error_se"]
    ax.errorbar(L, e, yerr=2 * se, fmt="o-", capsize=3, label="|E m_chain − E m_SDE| (±2 s.e.)")
    ax.plot(L, e[0] / L, "k--", lw=1, label="1/L")
    ax.axhline(float(2 * np.median(se)), color="0.6", ls=":", label="Monte Carlo floor")
    finish_panel(ax, grid="both", xscale="log", yscale="log", xlabel="depth L (fixed diffusive time s)",
                 title=f"weak error at s={cfg.s1:g}: slope {float(res['weak_slope']):.2f}")
    ax = axes[2]
    for i, d in enumerate(res["logistic_dims"]):
        ax.errorbar(res["logistic_s"], res["logistic_m"][i], yerr=2 * res["logistic_se"][i], fmt="o",
                    ms=3, color=f"C{i}", label=f"E m(s), d={d}")
    for i in range(len(res["logistic_dims"])):
        ax.plot(res["logistic_s"], res["logistic_u"][i], "-", color=f"C{i}",
                label="logistic u' = u(1−u)" if i == 0 else None)
    finish_panel(ax, xlabel="s", title=f"mean overlap, β={cfg.logistic_beta:g}: error ~ 1/d")
    return [tp.plot.save_figure(fig, out_dir / "random_heads.png")]
