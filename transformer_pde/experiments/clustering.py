"""Clustering on the sphere (GLPR; docs: math/sphere.md#clustering-theorems): the main job.

Tokens i.i.d. uniform on S^{d-1}, Q = K = V = I, for the two models of GLPR:

* SA:  dx_i/dt = P⊥_{x_i}(Σ_j softmax_j(β⟨x_i,x_j⟩) x_j);
* USA: dx_i/dt = P⊥_{x_i}((1/n) Σ_j e^{β⟨x_i,x_j⟩} x_j).

For d >= 3 almost every start ends in one cluster, for every β and both models
(docs: math/sphere.md#clustering-theorems, `thm: boumal`); at larger β the tokens first gather in several metastable
clusters (docs: math/sphere.md#metastability), so reaching one cluster can take very long. Outputs: tokens at chosen
times, the cluster count (single linkage, ⟨x_i,x_j⟩ > threshold) and the normalized energy
over time, and an animated GIF of the tokens.

**Layer scheme and solver.** ``scheme`` names the layer normalization, mapped once to a
dynamics (:data:`._common.SCHEMES`): ``projected`` is ``tp.Sphere`` (GLPR's projected flow, whose Euler
step is x ← N(x + hP⊥_xΓ(x))), ``post-ln`` is ``tp.PostLN``, the authors' post-LN layer
x ← N(x + hΓ(x)) (docs: math/sphere.md#differences-from-the-papers; GLPR ``sphere.py``, GKPR ``kinetic.py``).
``solver = "tsit5"`` (default) integrates the flow, where the two schemes agree to the solver's order;
``solver = "euler"`` runs the discrete layers with step ``dt`` (a residual Transformer), where
they differ at O(h²) per layer (docs: math/sphere.md#normalization-schemes: post-LN is the
projected layer with the per-token step h/(1 + h⟨x, Γ⟩)). The published runs are layers of the authors' scheme:

* the five-token circle movie (GKPR ``kinetic.py``): ``start = "kinetic"`` (their fixed z0,
  normalized), n = 5, d = 2, β = 4, ``models = SA``, ``scheme = post-ln``, ``solver = euler``,
  dt = 0.1, t1 = 400 (4000 layers): final angle 105.52°, last merge at t = 364.1 (the projected
  layer: 105.44°, 329.8);
* 64 tokens on S², USA, β = 4, dt = 0.1, t1 = 15 (150 layers), ``usa_step = raw``: the authors'
  post-LN leaves 1–2 clusters, the projected layer 7–24 (docs: math/sphere.md#normalization-schemes).

Both are reproduced to round-off against a plain NumPy loop in
``tests/experiments/test_normalization_experiments.py``.
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._common import STAGE_RADIUS, kernel_backend, model_dynamics
from .configs.clustering import ClusteringConfig

# GKPR kinetic.py's fixed start of the five-token circle movie (unit to 1e-8; normalized on use)
KINETIC_Z0 = np.array([
    [0.99806638, 0.06215705],
    [0.97712061, 0.21268594],
    [-0.24578194, 0.96932515],
    [-0.97354734, 0.2284854],
    [-0.99892629, -0.04632772],
])


def initial_tokens(cfg: "ClusteringConfig"):
    """The start: uniform on S^{d-1} from ``key(seed)``, or kinetic.py's z0 (normalized)."""
    if cfg.start == "kinetic":
        return tp.normalize(jnp.asarray(KINETIC_Z0, dtype=jnp.asarray(1.0).dtype))
    return tp.uniform_sphere(jax.random.key(cfg.seed), cfg.n, cfg.d)


def compute(cfg: ClusteringConfig, progress: bool = False, checkpoint=None) -> Result:
    """Resumable: integrated in fixed chunks of save intervals (``checkpoint.every``), each
    checkpointed when the runner passes a :class:`~transformer_pde.runs.Checkpoint`."""
    x0 = initial_tokens(cfg)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
    out = {"ts": np.asarray(ts)}
    saveat, over_saves = ts, jax.vmap
    if cfg.n > cfg.max_tokens_saved:
        # one save at a time: the pair statistics of all saves at once would not fit
        over_saves = lambda f: lambda xs: jax.lax.map(f, xs)  # noqa: E731
        sub = jnp.sort(jax.random.choice(jax.random.key(cfg.seed + 1), cfg.n, (cfg.max_tokens_saved,),
                                         replace=False))
        saveat = diffrax.SaveAt(ts=ts, fn=lambda t, x, args: x[sub])
        out["saved_tokens"] = np.asarray(sub)
    # the options, mapped once to objects: the solver, the kernel backend (Euler layers evaluate on
    # the sphere; Tsit5's stages leave it by O(h²)) and each model's dynamics
    solver = diffrax.Euler() if cfg.solver == "euler" else None  # None: solve's Tsit5
    backend = kernel_backend(cfg.backend, cfg.tol, radius=1.0 if cfg.solver == "euler" else STAGE_RADIUS)
    dynamics = {model: model_dynamics(model, cfg.d, cfg.beta, cfg.scheme, backend) for model in cfg.models}
    for model, dyn in dynamics.items():
        sol = tp.runs.solve_checkpointed(
            dyn, x0, t1=cfg.t1, dt0=cfg.step_of(model), saveat=saveat, solver=solver,
            progress_meter=diffrax.TqdmProgressMeter() if progress else None,
            checkpoint=None if checkpoint is None else checkpoint.stage(f"trajectory_{model}"))
        xs = sol.xs if sol.xs is not None else sol.stats
        out[f"xs_{model}"] = np.asarray(xs)
        out[f"clusters_{model}"] = np.asarray(over_saves(lambda x: tp.diagnostics.cluster_count(x, cfg.threshold))(xs))
        out[f"energy_{model}"] = np.asarray(over_saves(lambda x: tp.diagnostics.normalized_energy(x, cfg.beta))(xs))
    return Result(out)


def _draw_tokens(ax, x, d, title):
    if d == 3:
        tp.plot.sphere_points(ax, x, size=5, title=title)
    else:
        ax.plot(np.cos(np.linspace(0, 2 * np.pi, 200)), np.sin(np.linspace(0, 2 * np.pi, 200)),
                color="0.8", lw=0.8)
        ax.scatter(x[:, 0], x[:, 1], s=6)
        ax.set_aspect("equal")
        ax.set_axis_off()
        ax.set_title(title)


def figures(res: Result, cfg: ClusteringConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts = res["ts"]
    models = cfg.models
    T = len(ts)
    picks = sorted({0, T // 8, T // 4, T - 1})
    draw = cfg.d in (2, 3)
    ncol = len(picks) + 2 if draw else 2
    fig = plt.figure(figsize=(3.0 * ncol, 3.1 * len(models)))
    gs = fig.add_gridspec(len(models), ncol, hspace=0.35, wspace=0.45)
    for r, model in enumerate(models):
        xs = res[f"xs_{model}"]
        if draw:
            for k, i in enumerate(picks):
                ax = fig.add_subplot(gs[r, k], projection="3d" if cfg.d == 3 else None)
                _draw_tokens(ax, xs[i], cfg.d, f"{model}, t = {ts[i]:.3g}")
        ax = fig.add_subplot(gs[r, ncol - 2])
        ax.step(ts, res[f"clusters_{model}"], where="post")
        ax.set_yscale("log")
        ax.set_xlabel("t (depth)")
        ax.set_ylabel(f"clusters (⟨x_i,x_j⟩>{cfg.threshold})", fontsize=8)
        ax.set_title(f"{model}: {int(res[f'clusters_{model}'][-1])} cluster(s) at t={ts[-1]:g}", fontsize=9)
        ax.grid(alpha=0.3)
        ax = fig.add_subplot(gs[r, ncol - 1])
        ax.plot(ts, res[f"energy_{model}"])
        ax.set_xlabel("t (depth)")
        ax.set_ylabel("normalized energy φ")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    shown = "" if cfg.n <= cfg.max_tokens_saved else f" ({cfg.max_tokens_saved} random tokens shown and counted)"
    fig.suptitle(f"n={cfg.n}, d={cfg.d}, β={cfg.beta:g}, uniform start (seed {cfg.seed}){shown}")
    paths = [tp.plot.save_figure(fig, out_dir / "clustering.png")]
    if cfg.animate and draw:
        paths.append(animation(res, cfg, out_dir / "clustering.gif"))
    return paths


def animation(res: Result, cfg: ClusteringConfig, path):
    """Tokens over time, one panel per model, as a GIF (small frames: a few seconds to write)."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    ts, models = res["ts"], cfg.models
    idx = np.unique(np.linspace(0, len(ts) - 1, min(cfg.frames, len(ts))).round().astype(int))
    fig = plt.figure(figsize=(2.6 * len(models), 2.8))
    arts = []
    for k, model in enumerate(models):
        x = res[f"xs_{model}"]
        if cfg.d == 3:
            ax = fig.add_subplot(1, len(models), k + 1, projection="3d")
            tp.plot.sphere_points(ax, x[0], size=4)
            sc = ax.collections[-1]
        else:
            ax = fig.add_subplot(1, len(models), k + 1)
            _draw_tokens(ax, x[0], 2, "")
            sc = ax.collections[-1]
        arts.append((ax, sc, x, model))

    def update(f):
        i = idx[f]
        for ax, sc, x, model in arts:
            if cfg.d == 3:
                sc._offsets3d = (x[i, :, 0], x[i, :, 1], x[i, :, 2])
            else:
                sc.set_offsets(x[i])
            ax.set_title(f"{model}, t = {ts[i]:.3g}", fontsize=9)
        return [a[1] for a in arts]

    anim = FuncAnimation(fig, update, frames=len(idx), blit=False)
    fig.set_dpi(60)
    try:
        return tp.plot.save_animation(anim, path, fps=8)
    finally:
        plt.close(fig)
