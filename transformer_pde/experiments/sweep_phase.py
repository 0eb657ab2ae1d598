"""Phase diagram of the time to one cluster over (β, d), one vmapped sweep per dimension.

SA on S^{d-1} (docs: math/sphere.md#clustering-theorems), Q = K = V = I, n tokens uniform at t = 0. For d >= 3
almost every start ends in one cluster for every β (``thm: boumal``), but the time it takes grows quickly
with β, because tokens first gather in metastable clusters (docs: math/sphere.md#metastability, GKPR); for d = 2
several clusters can persist. The time to one cluster (single linkage, ⟨x_i, x_j⟩ > threshold,
as in the published runs, docs: math/sphere.md#published-runs) is read from the cluster count saved along each run;
runs still split at t1 are censored (shown blank). All (β, seed) points of a dimension run in one ``tp.sweep`` call.
The grids are saved labelled (``results.nc``, group ``sweep``: dims d × beta × seed × t).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._progress import progress_bar
from .configs.sweep_phase import SweepPhaseConfig


def compute(cfg: SweepPhaseConfig, progress: bool = False) -> Result:
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)

    def run(beta, seed, d):
        x0 = tp.uniform_sphere(jax.random.key(seed), cfg.n, d)
        dyn = tp.Sphere(tp.SoftmaxAttention.identity(d, beta))
        # float counts: diffrax pre-fills unsaved slots with inf
        sol = tp.solve(dyn, x0, t1=cfg.t1, dt0=cfg.dt, saveat=diffrax.SaveAt(
            ts=ts, fn=lambda t, x, args: tp.diagnostics.cluster_count(x, cfg.threshold).astype(ts.dtype)))
        return {"clusters": sol.stats, "t_one": tp.sweeps.first_time(ts, sol.stats == 1)}

    betas = np.linspace(cfg.beta_min, cfg.beta_max, cfg.num_betas)
    with progress_bar(progress, total=len(cfg.dims), desc="sweep-phase (dimensions)") as bar:
        def report(line):
            bar.update()
            bar.note(line)

        out = tp.sweep(run, {"beta": betas, "seed": np.arange(cfg.seeds)}, static={"d": list(cfg.dims)},
                    chunk_size=cfg.chunk_size or None, progress=report)
    t_one = out["t_one"]
    arrays = {
        "betas": betas, "dims": np.asarray(list(cfg.dims)), "ts": np.asarray(ts),
        "t_one": t_one.values,                      # (d, beta, seed), inf when censored
        "clusters": out["clusters"].values,         # (d, beta, seed, time)
        "median_t_one": t_one.reduce(np.median, "seed").values,
        "fraction_one": (np.isfinite(t_one.values)).mean(axis=-1),
        "final_clusters": out["clusters"].values[..., -1],
    }
    labelled = grid(
        {"d": arrays["dims"], "beta": betas, "seed": np.arange(cfg.seeds), "t": arrays["ts"]},
        t_one=(("d", "beta", "seed"), arrays["t_one"]),
        clusters=(("d", "beta", "seed", "t"), arrays["clusters"]),
        median_t_one=(("d", "beta"), arrays["median_t_one"]),
        fraction_one=(("d", "beta"), arrays["fraction_one"]),
        describe={
            "d": ("dimension d of the sphere S^{d-1}", ""),
            "beta": ("inverse temperature β of the attention", ""),
            "seed": ("seed of the uniform start", ""),
            "t": ("time t of the dynamics", ""),
            "t_one": ("first saved time with one cluster (inf when censored at t1)", ""),
            "clusters": ("number of clusters (single linkage, <x_i, x_j> > threshold)", ""),
            "median_t_one": ("median over seeds of t_one", ""),
            "fraction_one": ("fraction of seeds that reach one cluster by t1", ""),
        },
    )
    return Result(arrays, {"sweep": labelled})


def figures(res: Result, cfg: SweepPhaseConfig, out_dir) -> list:
    import matplotlib.pyplot as plt
    import xarray as xr

    coords = {"d": res["dims"], "beta": res["betas"]}

    def labelled(values, name):
        return xr.DataArray(values, coords=coords, dims=("d", "beta"), name=name)

    med = np.where(np.isfinite(res["median_t_one"]), res["median_t_one"], np.nan)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), layout="constrained")
    tp.heatmap(labelled(med, "median time to one cluster"), "beta", "d", ax=axes[0], log_color=True)
    axes[0].set_title(f"median time to one cluster (blank: > t1 = {cfg.t1:g})")
    tp.heatmap(labelled(res["fraction_one"], "fraction in one cluster by t1"),
            "beta", "d", ax=axes[1], cmap="magma", vmin=0, vmax=1)
    axes[1].set_title(f"fraction of {cfg.seeds} seeds in one cluster by t1")
    mean_final = res["final_clusters"].mean(axis=-1)
    tp.heatmap(labelled(mean_final, "clusters at t1 (mean)"), "beta", "d",
            ax=axes[2], cmap="cividis", annotate=True, fmt="{:.1f}")
    axes[2].set_title("clusters at t1 (seed mean)")
    for ax in axes:
        ax.set_yticks(res["dims"])
        ax.set_xlabel("β")
    fig.suptitle(f"SA on S^(d-1), n = {cfg.n}: (β, d) phase diagram, {cfg.num_betas}×{cfg.seeds} "
                 "points per vmapped sweep")
    return [tp.plot.save_figure(fig, out_dir / "sweep-phase.png")]
