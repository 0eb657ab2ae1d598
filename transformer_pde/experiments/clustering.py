"""Clustering on the sphere (GLPR; sphere.md §1 and §10.1): the main job.

Tokens i.i.d. uniform on S^{d-1}, Q = K = V = I, dx_i/dt = P⊥_{x_i}(Σ_j softmax_j(β⟨x_i,x_j⟩) x_j).
For d >= 3 almost every start ends in one cluster, for every β (sphere.md §1, `thm: boumal`);
at larger β the tokens first gather in several metastable clusters (sphere.md §2).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .. import plot
from ..attention import SoftmaxAttention, UnnormalizedAttention
from ..checkpoint import solve_checkpointed
from ..diagnostics import cluster_count
from ..spaces import Sphere, uniform_sphere
from ._base import Experiment, register


@dataclasses.dataclass(frozen=True)
class ClusteringConfig:
    n: int = 256
    d: int = 3
    beta: float = 1.0
    t1: float = 30.0
    dt: float = 0.1
    seed: int = 0
    model: str = "SA"
    """'SA' (softmax) or 'USA' (unnormalized, GLPR's 1/n normalization)."""
    num_saves: int = 61
    threshold: float = 0.999

    def __post_init__(self):
        if self.n < 1 or self.d < 2:
            raise ValueError(f"clustering needs n >= 1 and d >= 2, got n={self.n}, d={self.d}")
        if self.model not in ("SA", "USA"):
            raise ValueError(f"model must be 'SA' or 'USA', got {self.model!r}")
        if not self.t1 > 0 or not self.dt > 0 or self.num_saves < 2:
            raise ValueError(f"need t1 > 0, dt > 0, num_saves >= 2; got t1={self.t1}, dt={self.dt}, "
                             f"num_saves={self.num_saves}")


def compute(cfg: ClusteringConfig, progress: bool = False, checkpoint=None) -> dict:
    """Resumable: integrated in fixed chunks of save intervals (``checkpoint.every``), each
    checkpointed when the runner passes a :class:`~transformer_pde.checkpoint.Checkpoint`."""
    x0 = uniform_sphere(jax.random.key(cfg.seed), cfg.n, cfg.d)
    attn_cls = SoftmaxAttention if cfg.model == "SA" else UnnormalizedAttention
    dyn = Sphere(attn_cls.identity(cfg.d, cfg.beta))
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
    sol = solve_checkpointed(dyn, x0, t1=cfg.t1, dt0=cfg.dt, saveat=ts, checkpoint=checkpoint,
                             name="trajectory", progress=progress)
    counts = jax.vmap(lambda x: cluster_count(x, cfg.threshold))(sol.xs)
    return {"ts": np.asarray(sol.ts), "xs": np.asarray(sol.xs), "clusters": np.asarray(counts)}


def figures(res: dict, cfg: ClusteringConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts, xs, clusters = res["ts"], res["xs"], res["clusters"]
    T = len(ts)
    picks = sorted({0, T // 8, T // 4, T - 1})
    paths = []
    if cfg.d == 3:
        fig = plt.figure(figsize=(3.1 * (len(picks) + 1.4), 3.3))
        gs = fig.add_gridspec(1, len(picks) + 2)
        for k, i in enumerate(picks):
            ax = fig.add_subplot(gs[0, k], projection="3d")
            plot.sphere_points(ax, xs[i], size=5, title=f"t = {ts[i]:.3g}")
        ax = fig.add_subplot(gs[0, len(picks):])
    else:
        fig, ax = plt.subplots(figsize=(5, 3.3))
    ax.step(ts, clusters, where="post")
    ax.set_yscale("log")
    ax.set_xlabel("t (depth)")
    ax.set_ylabel(f"clusters (⟨x_i,x_j⟩ > {cfg.threshold})")
    ax.set_title(f"{cfg.model}, n={cfg.n}, d={cfg.d}, β={cfg.beta:g}: {int(clusters[-1])} cluster(s)")
    ax.grid(alpha=0.3)
    paths.append(plot.save_figure(fig, out_dir / "clustering.png"))
    return paths


register(Experiment(
    name="clustering",
    summary="tokens uniform on S^2, Q=K=V=I: collapse to one cluster (GLPR)",
    config=ClusteringConfig,
    compute=compute,
    figures=figures,
    tiny={"n": 32, "t1": 6.0, "dt": 0.2, "num_saves": 7},
))
