"""The perceptron block (docs: math/sphere.md#perceptron-block-and-interpolation): atomic critical points on the
circle (d = 2).

USA attention plus a ReLU perceptron in the gradient case, on S^1. The flow is the
Wasserstein gradient flow of E_{β,ϑ} = E_β + ½∫v_ϑ (descent: towards the unique global
minimizer; ascent: the residual Transformer). For ReLU, v_ϑ is not real-analytic and the
critical points are finitely atomic in d = 2 (Perc): started from the uniform measure, the
descent flow ends on a few atoms whose positions and masses do not depend on the number of
tokens, and the atomic measure solves the stationarity equation. The ascent flow (the
Transformer) also ends on atoms (clusters).
"""
from __future__ import annotations

import diffrax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._options import format_value
from .configs.perceptron import PerceptronConfig


def _uniform_circle(n):
    th = 2 * np.pi * (np.arange(n) + 0.5) / n
    return jnp.asarray(np.stack([np.cos(th), np.sin(th)], 1))


def compute(cfg: PerceptronConfig, progress: bool = False) -> Result:
    ang = np.asarray(cfg.angles)
    a = np.stack([np.cos(ang), np.sin(ang)], 1)
    omega = np.asarray(cfg.omegas)
    ns = np.asarray(cfg.ns)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
    ctrl = diffrax.PIDController(rtol=cfg.rtol, atol=cfg.rtol * 1e-2)
    out: dict = {"ts": np.asarray(ts), "ns": ns, "a": a, "omega": omega}
    for mode, sign in (("descent", -1), ("ascent", 1)):
        blk = tp.PerceptronBlock(cfg.beta, a, omega, sign=sign, activation=tp.ReLU())
        for n in ns:
            sol = tp.solve(blk, _uniform_circle(n), t1=cfg.t1, saveat=ts, stepsize_controller=ctrl,
                        max_steps=500_000)
            xs = np.asarray(sol.xs)
            pos, mass = tp.diagnostics.atoms(xs[-1], cfg.atom_threshold)
            key = f"{mode}_n{n}"
            out[f"{key}_theta"] = np.arctan2(xs[..., 1], xs[..., 0])
            out[f"{key}_atoms"] = np.arctan2(pos[:, 1], pos[:, 0])
            out[f"{key}_masses"] = mass
            out[f"{key}_num_atoms"] = np.asarray(len(mass))
            out[f"{key}_residual"] = np.asarray(tp.diagnostics.stationarity_residual(blk, pos, mass))
            out[f"{key}_speed"] = np.asarray(float(jnp.max(jnp.linalg.norm(
                blk.velocity(sol.xs[-1]), axis=-1))))
            out[f"{key}_energy"] = np.array([float(tp.diagnostics.perceptron_energy(blk, x)) for x in sol.xs])
    return Result(out)


def figures(res: Result, cfg: PerceptronConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    n = int(res["ns"][0])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, mode in zip(axes[:2], ("descent", "ascent")):
        th = res[f"{mode}_n{n}_theta"]
        ax.plot(res["ts"], np.mod(th, 2 * np.pi), "k-", lw=0.4)
        k = int(res[f"{mode}_n{n}_num_atoms"])
        ax.set_title(f"{mode} (n={n}): {k} atom(s), residual {float(res[f'{mode}_n{n}_residual']):.1e}",
                     fontsize=9)
        ax.set_xlabel("t")
        ax.set_ylabel("θ mod 2π")
    ax = axes[2]
    for n in res["ns"]:
        for mode, c in (("descent", "C0"), ("ascent", "C3")):
            ax.plot(res["ts"], res[f"{mode}_n{n}_energy"], color=c, ls="-" if n == res["ns"][0] else "--",
                    label=f"{mode}, n={n}")
    ax.set_xlabel("t")
    ax.set_title("E_{β,ϑ} along the flows (ReLU)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle(f"perceptron block on S^1, β={cfg.beta:g}, ω=({format_value(cfg.omegas)}), "
                 f"a at θ=({format_value(cfg.angles)})")
    return [tp.plot.save_figure(fig, out_dir / "perceptron.png")]
