"""Phase diagram of the time to one cluster over (β, d), one vmapped sweep per dimension.

SA on S^{d-1} (sphere.md §1), Q = K = V = I, n tokens uniform at t = 0. For d >= 3 almost every
start ends in one cluster for every β (``thm: boumal``), but the time it takes grows quickly
with β, because tokens first gather in metastable clusters (sphere.md §2, GKPR); for d = 2
several clusters can persist. The time to one cluster (single linkage, ⟨x_i, x_j⟩ > threshold,
as in sphere.md §10) is read from the cluster count saved along each run; runs still split at
t1 are censored (shown blank). All (β, seed) points of a dimension run in one ``tp.sweep`` call.
"""

from __future__ import annotations

import dataclasses

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .. import plot
from ..models import SoftmaxAttention
from ..diagnostics import cluster_count
from ..solvers import solve
from ..models import Sphere, uniform_sphere
from ..sweeps import LabeledArray, first_time, heatmap, sweep
from ._base import Experiment, register


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError as e:
        raise ValueError(f"dims must be comma-separated integers, got {text!r}") from e
    return values


@dataclasses.dataclass(frozen=True)
class SweepPhaseConfig:
    n: int = 32
    dims: str = "2,3,4,8"
    """comma-separated dimensions d (one compiled sweep each)."""
    beta_min: float = 0.5
    beta_max: float = 12.0
    num_beta: int = 16
    seeds: int = 4
    t1: float = 60.0
    dt: float = 0.1
    num_saves: int = 241
    threshold: float = 0.999
    chunk_size: int = 0
    """points per vmapped chunk (0: all points of a dimension in one chunk)."""

    def __post_init__(self):
        dims = _int_list(self.dims)
        if not dims or min(dims) < 2:
            raise ValueError(f"dims must list dimensions >= 2, got {self.dims!r}")
        if self.n < 2 or self.num_beta < 1 or self.seeds < 1:
            raise ValueError(f"need n >= 2, num_beta >= 1, seeds >= 1; got n={self.n}, "
                             f"num_beta={self.num_beta}, seeds={self.seeds}")
        if not 0 <= self.beta_min <= self.beta_max:
            raise ValueError(f"need 0 <= beta_min <= beta_max, got {self.beta_min}, {self.beta_max}")
        if not self.t1 > 0 or not self.dt > 0 or self.num_saves < 2:
            raise ValueError(f"need t1 > 0, dt > 0, num_saves >= 2; got t1={self.t1}, dt={self.dt}, "
                             f"num_saves={self.num_saves}")
        if self.chunk_size < 0:
            raise ValueError(f"chunk_size must be >= 0, got {self.chunk_size}")


def compute(cfg: SweepPhaseConfig, progress: bool = False) -> dict:
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)

    def run(beta, seed, d):
        x0 = uniform_sphere(jax.random.key(seed), cfg.n, d)
        dyn = Sphere(SoftmaxAttention.identity(d, beta))
        # float counts: diffrax pre-fills unsaved slots with inf
        sol = solve(dyn, x0, t1=cfg.t1, dt0=cfg.dt, saveat=diffrax.SaveAt(
            ts=ts, fn=lambda t, x, args: cluster_count(x, cfg.threshold).astype(ts.dtype)))
        return {"clusters": sol.stats, "t_one": first_time(ts, sol.stats == 1)}

    betas = np.linspace(cfg.beta_min, cfg.beta_max, cfg.num_beta)
    out = sweep(run, {"beta": betas, "seed": np.arange(cfg.seeds)}, static={"d": _int_list(cfg.dims)},
                chunk_size=cfg.chunk_size or None, progress=print if progress else None)
    t_one = out["t_one"]
    return {
        "betas": betas, "dims": np.asarray(_int_list(cfg.dims)), "ts": np.asarray(ts),
        "t_one": t_one.values,                      # (d, beta, seed), inf when censored
        "clusters": out["clusters"].values,         # (d, beta, seed, time)
        "median_t_one": t_one.reduce(np.median, "seed").values,
        "fraction_one": (np.isfinite(t_one.values)).mean(axis=-1),
        "final_clusters": out["clusters"].values[..., -1],
    }


def figures(res: dict, cfg: SweepPhaseConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    coords = {"d": res["dims"], "beta": res["betas"]}
    med = np.where(np.isfinite(res["median_t_one"]), res["median_t_one"], np.nan)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), layout="constrained")
    heatmap(LabeledArray(med, ("d", "beta"), coords, "median time to one cluster"), "beta", "d",
            ax=axes[0], log_color=True)
    axes[0].set_title(f"median time to one cluster (blank: > t1 = {cfg.t1:g})")
    heatmap(LabeledArray(res["fraction_one"], ("d", "beta"), coords, "fraction in one cluster by t1"),
            "beta", "d", ax=axes[1], cmap="magma", vmin=0, vmax=1)
    axes[1].set_title(f"fraction of {cfg.seeds} seeds in one cluster by t1")
    mean_final = res["final_clusters"].mean(axis=-1)
    heatmap(LabeledArray(mean_final, ("d", "beta"), coords, "clusters at t1 (mean)"), "beta", "d",
            ax=axes[2], cmap="cividis", annotate=True, fmt="{:.1f}")
    axes[2].set_title("clusters at t1 (seed mean)")
    for ax in axes:
        ax.set_yticks(res["dims"])
        ax.set_xlabel("β")
    fig.suptitle(f"SA on S^(d-1), n = {cfg.n}: (β, d) phase diagram, {cfg.num_beta}×{cfg.seeds} "
                 "points per vmapped sweep")
    return [plot.save_figure(fig, out_dir / "sweep-phase.png")]


register(Experiment(
    name="sweep-phase",
    summary="(beta, d) phase diagram of the time to one cluster on the sphere (vmapped sweep)",
    config=SweepPhaseConfig,
    compute=compute,
    figures=figures,
    tiny={"n": 12, "dims": "2,3", "num_beta": 16, "seeds": 4, "beta_max": 9.0, "t1": 12.0, "dt": 0.25,
          "num_saves": 25},
))
