r"""Support radius and W₂ stability of the particle system against their bounds
(docs: math/attention.md#support-and-stability-bounds).

* Support radius: for softmax, ℓ², Sinkhorn and multi-head attention the field lies in
  V conv(supp μ), so R(t) ≤ R₀ exp(∫₀ᵗ‖V‖) (Σ_h‖W_hV_h‖ for multi-head).
* Stability (softmax): for two solutions supported in B(0, R(t)),
  W_p(μ_t, ν_t) ≤ exp(∫₀ᵗ L) W_p(μ_0, ν_0) with L = ‖V‖‖A‖R² + ‖V‖(1 + 2‖A‖R²)e^{2‖A‖R²}.

μ_0: n tokens uniform in the disk of radius R₀; ν_0 = μ_0 moved by δ·ξ (ξ standard normal),
for several δ. W₂ is computed exactly (optimal assignment), so the ratio
W₂(μ_t, ν_t)/W₂(μ_0, ν_0) is the measured amplification; the theory's bound is far above it
(it is a worst case over all measures in the ball).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._progress import progress_bar
from .configs.stability import VARIANTS, StabilityConfig


def make_attentions(cfg: StabilityConfig):
    rng = np.random.default_rng(cfg.seed)
    Q, K, V = (cfg.scale * rng.standard_normal((cfg.d, cfg.d)) for _ in range(3))
    make = {
        "softmax": lambda: tp.SoftmaxAttention(Q, K, V, cfg.beta),
        "l2": lambda: tp.L2Attention(Q, K, V, cfg.beta),
        "multihead": lambda: tp.MultiHeadAttention.split(Q, K, V, 2, cfg.beta),
        "sinkhorn": lambda: tp.SinkhornAttention(Q, K, V, cfg.beta, epsilon=1.0),
    }
    return {v: make[v]() for v in cfg.variants}


def initial_tokens(cfg: StabilityConfig):
    """n tokens uniform in the ball of radius R₀ (with one on its boundary: R(0) = R₀)."""
    k1, k2 = jax.random.split(jax.random.key(cfg.seed))
    z = jax.random.normal(k1, (cfg.n, cfg.d))
    u = jax.random.uniform(k2, (cfg.n, 1)) ** (1.0 / cfg.d)
    x = cfg.radius * u * z / jnp.linalg.norm(z, axis=1, keepdims=True)
    return x.at[0].set(x[0] / jnp.linalg.norm(x[0]) * cfg.radius)


def compute(cfg: StabilityConfig, progress: bool = False) -> Result:
    bar = progress_bar(progress, total=len(cfg.variants) + 1 + len(cfg.deltas), desc="stability")
    with jax.enable_x64(True), bar:
        ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
        x0 = initial_tokens(cfg)
        out = {"ts": np.asarray(ts), "x0": np.asarray(x0)}
        attns = make_attentions(cfg)
        for name, attn in attns.items():
            sol = tp.solve(attn, x0, t1=cfg.t1, dt0=cfg.dt, saveat=ts)
            out[f"{name}__radius"] = np.asarray(tp.diagnostics.support_radius(sol.xs))
            out[f"{name}__radius_bound"] = np.asarray(tp.diagnostics.support_radius_bound(attn, cfg.radius, ts))
            bar.note(f"{name:>9}: R(t1) = {out[f'{name}__radius'][-1]:.4g} <= "
                     f"{out[f'{name}__radius_bound'][-1]:.4g}")
            bar.update()
        softmax = make_attentions(dataclasses.replace(cfg, variants=("softmax",)))["softmax"]
        xs = tp.solve(softmax, x0, t1=cfg.t1, dt0=cfg.dt, saveat=ts).xs
        bar.update()
        xi = jax.random.normal(jax.random.key(cfg.seed + 1), x0.shape)
        deltas = list(cfg.deltas)
        ratios, w0 = [], []
        for delta in deltas:
            y0 = x0 + delta * xi
            ys = tp.solve(softmax, y0, t1=cfg.t1, dt0=cfg.dt, saveat=ts).xs
            ratios.append(tp.diagnostics.stability_ratio(xs, ys))
            w0.append(tp.diagnostics.exact_wasserstein(x0, y0))
            bar.note(f"delta={delta:g}: W2 ratio at t1 = {ratios[-1][-1]:.4g}")
            bar.update()
        radius = tp.diagnostics.support_radius
        R0 = float(max(radius(x0), max(radius(x0 + d * xi) for d in deltas)))
        out["deltas"] = np.asarray(deltas)
        out["w2_initial"] = np.asarray(w0)
        out["w2_ratio"] = np.asarray(ratios)
        out["stability_R0"] = np.asarray(R0)
        out["stability_bound"] = np.concatenate(
            [[1.0], np.asarray(tp.diagnostics.stability_bound(softmax, R0, ts[1:]))])
    radius = grid({"variant": np.asarray(list(attns)), "t": out["ts"]},
                  radius=(("variant", "t"), np.stack([out[f"{v}__radius"] for v in attns])),
                  radius_bound=(("variant", "t"), np.stack([out[f"{v}__radius_bound"] for v in attns])),
                  describe={
                      "variant": ("attention of the run (softmax, ℓ², multi-head, Sinkhorn)", ""),
                      "t": ("time t of the dynamics", ""),
                      "radius": ("support radius R(t) of the tokens", ""),
                      "radius_bound": ("bound R₀ exp(∫₀ᵗ‖V‖) on the support radius", "")})
    w2 = grid({"delta": out["deltas"], "t": out["ts"]}, w2_ratio=(("delta", "t"), out["w2_ratio"]),
              w2_initial=(("delta",), out["w2_initial"]), stability_bound=(("t",), out["stability_bound"]),
              describe={
                  "delta": ("size δ of the perturbation ν_0 = μ_0 moved by δξ", ""),
                  "t": ("time t of the dynamics", ""),
                  "w2_ratio": ("amplification W₂(μ_t, ν_t)/W₂(μ_0, ν_0) under softmax attention (exact W₂)", ""),
                  "w2_initial": ("W₂(μ_0, ν_0), exact", ""),
                  "stability_bound": ("the theory's bound exp(∫₀ᵗ L) on the amplification", "")})
    return Result(out, {"radius": radius, "w2": w2})


def figures(res: Result, cfg: StabilityConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts = res["ts"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, name in enumerate(v for v in VARIANTS if f"{v}__radius" in res):
        ax1.plot(ts, res[f"{name}__radius"], color=f"C{k}", label=f"{name}: R(t)")
        ax1.plot(ts, res[f"{name}__radius_bound"], color=f"C{k}", ls="--", lw=0.9)
    ax1.set_yscale("log")
    ax1.set_xlabel("t")
    ax1.set_title("support radius (solid) vs R₀ exp(∫‖V‖) (dashed)")
    ax1.legend(fontsize=8)
    for k, delta in enumerate(res["deltas"]):
        ax2.plot(ts, res["w2_ratio"][k], label=f"δ = {delta:g}")
    ax2.set_xlabel("t")
    ax2.set_ylabel("measured ratio")
    ax2.set_title("softmax: W₂(μ_t, ν_t) / W₂(μ_0, ν_0)")
    # the bound is doubly exponential (R(t) grows, L ~ e^{2‖A‖R²}): draw log10 of it on its own axis
    twin = ax2.twinx()
    with np.errstate(divide="ignore"):
        logb = np.log10(res["stability_bound"])
    finite = np.isfinite(logb)
    twin.plot(ts[finite], logb[finite], "k--", label="log10 exp(∫L) (the stability bound)")
    if not finite.all():
        twin.axvline(ts[~finite][0], color="k", lw=0.6, ls=":")
        twin.text(ts[~finite][0], np.nanmax(logb[finite]), " bound overflows", fontsize=8)
    twin.set_ylabel("log10 of the bound")
    lines = ax2.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax2.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    fig.suptitle(f"n = {cfg.n}, d = {cfg.d}, R₀ = {cfg.radius:g}")
    fig.tight_layout()
    return [tp.plot.save_figure(fig, out_dir / "stability.png")]
