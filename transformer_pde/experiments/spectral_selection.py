r"""Spectral selection in symmetric attention (Kuehn–Yoon, arXiv 2604.26085; issue 38 item 4; docs:
math/sphere.md#spectral-selection).

Softmax attention on the sphere with QᵀK = V = Vᵀ (``tp.theory.spectral_selection.symmetric_attention``),
V = R diag(λ) Rᵀ for a random rotation R, from uniform random starts:

* ``dominant``: a positive eigenvalue above every other |λ_l|: every run ends with all tokens at
  one point ±e_1 (homogeneous alignment);
* ``negative``: V negative definite: every run ends split by sign along the eigenvector of the most
  negative eigenvalue;
* a sweep on the circle, V = diag(λ₊, −1) for each λ₊ of ``positives``: the fraction of runs
  ending split along e_2, against the closed-form criterion (the balanced split is stable iff
  λ₊ < tanh(β)).

Every end state is classified as a pure mode (all tokens within ``tol`` of ±e_k) and checked
against the linear stability criterion ``pure_mode_growth`` (< 0: stable).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._common import finish_panel, pid
from .configs.spectral_selection import SpectralSelectionConfig


def classify(y, tol):
    """``(k, plus)`` of end tokens ``y`` in the eigenbasis (rows: tokens): k the eigenvector every
    token is within ``tol`` of (±), ``plus`` how many at +e_k; ``(-1, -1)`` if none."""
    for k in range(y.shape[1]):
        if np.all(np.abs(y[:, k]) > 1 - tol):
            return k, int(np.sum(y[:, k] > 0))
    return -1, -1


def _rotation(key, d):
    R, _ = np.linalg.qr(np.asarray(jax.random.normal(key, (d, d)), dtype=np.float64))
    return R


def _run(eigenvalues, R, beta, x0, ts, cfg):
    V = R @ np.diag(eigenvalues) @ R.T
    V = jnp.asarray((V + V.T) / 2, x0.dtype)
    model = tp.Sphere(tp.theory.spectral_selection.symmetric_attention(V, beta))
    return np.asarray(tp.solve(model, x0, t1=cfg.t1, dt0=0.05, saveat=diffrax.SaveAt(ts=ts),
                               stepsize_controller=pid(cfg.rtol, x0.dtype, atol_ratio=1e-3)).xs)


def _end_states(eigenvalues, R, beta, xs_end, cfg):
    """Mode, plus count and predicted growth of each run's end state (growth NaN if not pure)."""
    ss = tp.theory.spectral_selection
    modes, plus, growth = [], [], []
    for x in xs_end:
        k, p = classify(x @ R, cfg.tol)
        modes.append(k)
        plus.append(p)
        growth.append(ss.pure_mode_growth(eigenvalues, k, p, cfg.n - p, beta) if k >= 0 else np.nan)
    return np.asarray(modes), np.asarray(plus), np.asarray(growth)


def compute(cfg: SpectralSelectionConfig, progress: bool = False) -> Result:
    ss = tp.theory.spectral_selection
    d = len(cfg.dominant)
    keys = jax.random.split(jax.random.key(cfg.seed), 3)
    # geometric saves: the selection happens over decades of t
    ts = jnp.concatenate([jnp.zeros(1), jnp.geomspace(1e-2, cfg.t1, cfg.num_saves - 1)])
    out = {"ts": np.asarray(ts)}
    for case, ev, key in (("dominant", cfg.dominant, keys[0]), ("negative", cfg.negative, keys[1])):
        ev = np.asarray(ev, dtype=float)
        R = _rotation(key, d)
        coeff, ends, starts = [], [], []
        for r in range(cfg.runs):
            x0 = tp.uniform_sphere(jax.random.fold_in(key, r), n=cfg.n, d=d)
            xs = _run(ev, R, cfg.beta, x0, ts, cfg)
            coeff.append(np.mean((xs @ R) ** 2, axis=1))  # (T, d): each eigenvector's share
            ends.append(xs[-1])
            starts.append(np.asarray(x0) @ R)
        modes, plus, growth = _end_states(ev, R, cfg.beta, ends, cfg)
        k_pred, _ = ss.predicted_mode(ev)
        # for the split: do tokens end on the side of e_k where they started?
        kept = [np.mean(np.sign(s[:, k_pred]) == np.sign(e @ R[:, k_pred])) for s, e in zip(starts, ends)]
        out |= {f"{case}_eigenvalues": ev, f"{case}_share": np.stack(coeff), f"{case}_mode": modes,
                f"{case}_plus": plus, f"{case}_growth": growth, f"{case}_predicted": np.asarray(k_pred),
                f"{case}_sign_kept": np.asarray(kept)}

    # the sweep on the circle: V = diag(λ₊, −1)
    split, split_e1, growth_sweep, modes_sweep = [], [], [], []
    end_ts = jnp.asarray([0.0, cfg.t1])
    for i, lp in enumerate(cfg.positives):
        ev = np.array([lp, -1.0])
        ends = [_run(ev, np.eye(2), cfg.sweep_beta, tp.uniform_sphere(jax.random.fold_in(keys[2], i * cfg.runs + r),
                                                                        n=cfg.n, d=2), end_ts, cfg)[-1]
                for r in range(cfg.runs)]
        modes, plus, growth = _end_states(ev, np.eye(2), cfg.sweep_beta, ends, cfg)
        modes_sweep.append(modes)
        growth_sweep.append(growth)
        split.append(np.mean((modes == 1) & (plus > 0) & (plus < cfg.n)))
        split_e1.append(np.mean((modes == 0) & (plus > 0) & (plus < cfg.n)))
    positives = np.asarray(cfg.positives, dtype=float)
    out |= {"positives": positives, "split_fraction": np.asarray(split), "split_e1_fraction": np.asarray(split_e1),
            "sweep_mode": np.stack(modes_sweep),
            "sweep_growth": np.stack(growth_sweep),
            "balanced_split_stable": np.asarray([ss.balanced_split_stable([lp, -1.0], 1, cfg.sweep_beta)
                                                 for lp in positives])}
    return Result(out)


def figures(res: Result, cfg: SpectralSelectionConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts = res["ts"]
    fig, axs = plt.subplots(1, 3, figsize=(17, 4.6), layout="constrained")
    for ax, case, title in ((axs[0], "dominant", "dominant positive eigenvalue"),
                            (axs[1], "negative", "V ≺ 0")):
        ev, share = res[f"{case}_eigenvalues"], res[f"{case}_share"]
        for k, lam in enumerate(ev):
            for r in range(share.shape[0]):
                ax.plot(ts, share[r, :, k], color=f"C{k}", alpha=0.5, lw=0.8,
                        label=f"e_{k + 1} (λ = {lam:g})" if r == 0 else None)
        pure = res[f"{case}_mode"] == res[f"{case}_predicted"]
        stable = np.nan_to_num(res[f"{case}_growth"], nan=1.0) < 0
        finish_panel(ax, legend=7, xlabel="t", ylabel="mean ⟨x_i, e_k⟩²", xscale="symlog",
                     title=f"{title} (n={cfg.n}, β={cfg.beta:g}): {pure.sum()}/{pure.size} runs end\nin the "
                           f"predicted mode, {stable.sum()} at a stable pure mode")
        ax.title.set_fontsize(9)
    if "negative_sign_kept" in res:
        axs[1].text(0.02, 0.5, f"tokens ending on their starting side: {np.mean(res['negative_sign_kept']):.0%}",
                    transform=axs[1].transAxes, fontsize=7)
    pos = res["positives"]
    axs[2].plot(pos, res["split_fraction"], "o-", label="runs ending split along e_2")
    axs[2].plot(pos, res["split_e1_fraction"], "s--", ms=4, label="runs ending split along e_1 (stable too)")
    axs[2].axvline(np.tanh(cfg.sweep_beta), color="k", ls="--", lw=0.8,
                   label=f"balanced split stable iff λ₊ < tanh(β) = {np.tanh(cfg.sweep_beta):.3f}")
    axs[2].axvline(1.0, color="gray", ls=":", lw=0.8, label="λ₊ = |λ₋|: dominance")
    finish_panel(axs[2], legend=7, xlabel="λ₊ (V = diag(λ₊, −1), S¹)", ylabel="fraction of runs", ylim=(-0.05, 1.05),
                 title=f"S¹: split or alignment ({cfg.runs} random starts each, β={cfg.sweep_beta:g})")
    axs[2].title.set_fontsize(9)
    return [tp.plot.save_figure(fig, out_dir / "spectral_selection.png")]
