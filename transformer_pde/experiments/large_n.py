r"""A million tokens on S² to one cluster (issue 13; docs: math/sphere.md#clustering-theorems).

SA on the sphere, Q = K = V = I, β = 1, n = 10⁶ uniform tokens: the theorem for d ≥ 3 says the
tokens collapse to one cluster. Pair interactions at this n (10¹² per velocity) are out of reach
of the exact kernel on a workstation (~280 s per velocity on 2 cores); the fast NUFFT kernel
(``tp.kernels.Fast``: scores in R³, a Gaussian sum through jax-finufft) makes one velocity a few
seconds, and the residual Transformer (Euler with step ``dt``, one layer per step) reaches t = 30
in minutes. Every save keeps O(n) statistics only:

* the mean overlap |x̄|² = n⁻²Σ_ij⟨x_i, x_j⟩ (→ 1 exactly when all tokens meet),
* the spread 1 − |x̄| and the largest angle of a token from the mean direction,
* a fixed random subsample of ``num_plotted`` tokens (for the figure and a cluster count).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import kernel_backend
from ._progress import solver_meter
from .configs.large_n import LargeNConfig


def compute(cfg: LargeNConfig, progress: bool = False) -> Result:
    key_x, key_s = jax.random.split(jax.random.key(cfg.seed))
    x0 = tp.uniform_sphere(key_x, cfg.n, 3)
    sample = jax.random.choice(key_s, cfg.n, (min(cfg.num_plotted, cfg.n),), replace=False)
    attn = tp.SoftmaxAttention.identity(3, cfg.beta, backend=kernel_backend(cfg.backend, cfg.tol, radius=1.0))
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)

    def stats(t, x, args):
        mean = jnp.mean(x, axis=0)
        direction = mean / jnp.linalg.norm(mean)
        return {"overlap": jnp.sum(mean**2), "max_angle": jnp.arccos(jnp.clip(jnp.min(x @ direction), -1, 1)),
                "sample": x[sample]}

    sol = tp.solve(tp.Sphere(attn), x0, t1=cfg.t1, dt0=cfg.dt, solver=diffrax.Euler(),
                saveat=diffrax.SaveAt(ts=ts, fn=stats), progress_meter=solver_meter(progress))
    samples = np.asarray(sol.stats["sample"])
    arrays = {
        "ts": np.asarray(ts), "overlap": np.asarray(sol.stats["overlap"]),
        "max_angle": np.asarray(sol.stats["max_angle"]), "sample": samples,
        # one kept program (its checks reported as values), not an eager vmap recompiled every run;
        # a map, not a vmap: checkify cannot report checks across a vmapped while loop
        "sample_clusters": np.asarray(tp.runs.kept(lambda xs, threshold=cfg.threshold: jax.lax.map(
            lambda x: tp.diagnostics.cluster_count(x, threshold), xs))(jnp.asarray(samples))),
        "fast_kernel": np.asarray(attn.kernel_choice(cfg.n, cfg.n, x0.dtype).fast),
    }
    labelled = grid({"t": arrays["ts"]}, overlap=(("t",), arrays["overlap"]),
                    max_angle=(("t",), arrays["max_angle"]),
                    sample_clusters=(("t",), arrays["sample_clusters"]),
                    describe={
                        "t": ("time t of the dynamics (depth of the residual Transformer)", ""),
                        "overlap": ("mean overlap |x̄|² = n⁻² Σ_ij <x_i, x_j> (1 when all tokens meet)", ""),
                        "max_angle": ("largest angle of a token from the mean direction", "rad"),
                        "sample_clusters": ("clusters of the plotted subsample (cluster_count at the threshold)", "")})
    return Result(arrays, {"trajectory": labelled})


def figures(res: Result, cfg: LargeNConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts, xs = res["ts"], res["sample"]
    picks = np.unique(np.linspace(0, len(ts) - 1, 4).round().astype(int))
    fig = plt.figure(figsize=(4.2 * (len(picks) + 1), 4.2), layout="constrained")
    for i, k in enumerate(picks):
        ax = fig.add_subplot(1, len(picks) + 1, i + 1, projection="3d")
        tp.plot.sphere_points(ax, xs[k], size=2, title=f"t = {ts[k]:.3g}")
    ax = fig.add_subplot(1, len(picks) + 1, len(picks) + 1)
    ax.semilogy(ts, np.maximum(1 - res["overlap"], 1e-16), label="1 − |x̄|²")
    ax.semilogy(ts, np.maximum(res["max_angle"], 1e-16), label="largest angle to the mean (rad)")
    ax.set_xlabel("t (depth)")
    ax.legend()
    ax.set_title("one cluster: both go to 0")
    fig.suptitle(f"SA on S², n = {cfg.n:,} tokens (β = {cfg.beta:g}, {cfg.backend} kernel, "
                 f"{len(xs[0])} plotted)")
    return [tp.plot.save_figure(fig, out_dir / "large-n.png")]
