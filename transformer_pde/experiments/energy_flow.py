r"""Gradient ascent and descent of the interaction energy (Burger et al.;
docs: math/sphere.md#gradient-flows-of-the-interaction-energy).

With Qᵀ K = D and V = ±D for a symmetric D, self-attention on the sphere,

$$\dot x_i=\pm P^\perp_{x_i}\frac{\sum_j e^{\beta\langle Dx_i,x_j\rangle}Dx_j}
{\sum_j e^{\beta\langle Dx_i,x_j\rangle}},$$

is the gradient ascent (+) or descent (−) of E(μ) = (1/2β) ∬ e^{β⟨x, Dy⟩} dμ dμ in the
Z-weighted metric of GLPR §3.4 (docs: math/sphere.md#energy-and-gradient-structure; Q = D, K = I here). Its
stationary points are the Wasserstein-stationary points of E. Cases
(docs: math/sphere.md#gradient-flows-of-the-interaction-energy):

* D = I: descent → uniform (on S^1, n tokens: the regular n-gon, universally optimal);
  ascent → a Dirac mass, E = e^β/2β.
* D positive definite ≠ I (diag(1,3,4)): ascent → tokens on ± the top eigenvector (a Dirac,
  or a stalled ± split); descent → a non-uniform spread configuration.
* D negative definite (−I): ascent → an antipodal pair ½(δ_v + δ_{−v}), E = cosh β/2β;
  descent → a Dirac, E = e^{−β}/2β.
* D = diag(−1, d₂) indefinite: the candidates are δ_{±e₂} (E = e^{βd₂}/2β) and the pair
  ±e₁ (E = cosh β/2β); the larger wins (crossover e^{βd₂} = cosh β).

Finally the explicit four-particle stationary state (docs: math/sphere.md#gradient-flows-of-the-interaction-energy):
for D = diag(d₁, d₂) the configuration (±x₁, ±x₂) with d₁ tanh(βd₁x₁²) = d₂ tanh(βd₂x₂²) is stationary; the descent
from any symmetric four-particle start converges to it (along the symmetric family the
energy is 16 cosh(βd₁x₁²) cosh(βd₂x₂²)/(2β·16), convex in x₁², with that minimum).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._common import pid
from .configs.energy_flow import EnergyFlowConfig


def energy_flow(D, beta, sign: int) -> tp.Sphere:
    """Sphere(SA) with Q = D, K = I (so Kᵀ Q = D) and V = sign · D: ascent (+1) / descent (−1)."""
    D = jnp.asarray(D, dtype=jnp.result_type(float))
    return tp.Sphere(tp.SoftmaxAttention(D, jnp.eye(D.shape[0], dtype=D.dtype), sign * D, beta))


def classify(x, threshold=0.9999) -> str:
    """Name the measure of a final state: Dirac, antipodal pair, spread (all distinct), k clusters."""
    x = np.asarray(x)
    labels = np.asarray(tp.diagnostics.cluster_labels(jnp.asarray(x), threshold))
    reps = np.unique(labels)
    if len(reps) == 1:
        return "Dirac"
    if len(reps) == 2 and float(x[reps[0]] @ x[reps[1]]) < -threshold:
        return "antipodal pair"
    if len(reps) == x.shape[0]:
        return "spread"
    return f"{len(reps)} clusters"


def _run(dyn, x0, cfg, ts):
    return tp.solve(dyn, x0, t1=cfg.t1, dt0=1e-2, saveat=ts, stepsize_controller=pid(cfg.rtol, x0.dtype))


def compute(cfg: EnergyFlowConfig, progress: bool = False) -> Result:
    ts = jnp.concatenate([jnp.zeros(1), jnp.geomspace(1e-2, cfg.t1, cfg.num_saves - 1)])
    out = {"ts": np.asarray(ts)}
    for name, D in cfg.cases().items():
        d = D.shape[0]
        x0 = tp.uniform_sphere(jax.random.key(cfg.seed), cfg.n, d)
        out[f"{name}_D"] = D
        for direction, sign in (("ascent", 1), ("descent", -1)):
            sol = _run(energy_flow(D, cfg.beta, sign), x0, cfg, ts)
            key = f"{name}_{direction}"
            out[f"{key}_xs"] = np.asarray(sol.xs)
            out[f"{key}_energy"] = np.asarray(
                jax.vmap(lambda x: tp.diagnostics.interaction_energy(x, cfg.beta, D=D))(sol.xs))
            out[f"{key}_masses"] = np.asarray(tp.diagnostics.cluster_masses(sol.xs[-1], cfg.threshold))
            # D is diagonal: the coordinate axes are its eigenvectors; one-hot = on ±e_k
            out[f"{key}_axis_weight"] = np.asarray(jnp.mean(sol.xs[-1] ** 2, axis=0))
            out[f"{key}_speed"] = np.asarray(
                jnp.max(jnp.linalg.norm(energy_flow(D, cfg.beta, sign).velocity(sol.xs[-1]), axis=1)))
    # The four-particle stationary state.
    d1, d2 = cfg.four_d1, cfg.four_d2
    a0 = cfg.four_x1
    b0 = np.sqrt(1 - a0**2)
    x0 = jnp.asarray([[a0, b0], [-a0, b0], [a0, -b0], [-a0, -b0]])
    D4 = np.diag([d1, d2])
    sol = _run(energy_flow(D4, cfg.beta, -1), x0, cfg, ts)
    root = tp.theory.interaction_energy.four_particle_root(d1, d2, cfg.beta)
    out["four_xs"] = np.asarray(sol.xs)
    out["four_x1_sq"] = np.asarray(sol.xs[:, 0, 0] ** 2)
    out["four_root_x1_sq"] = np.asarray(root)
    r = np.sqrt([root, 1 - root])
    xstar = jnp.asarray([[r[0], r[1]], [-r[0], r[1]], [r[0], -r[1]], [-r[0], -r[1]]])
    out["four_root_speed"] = np.asarray(
        jnp.max(jnp.linalg.norm(energy_flow(D4, cfg.beta, -1).velocity(xstar), axis=1)))
    return Result(out)


def summary(res: Result, cfg: EnergyFlowConfig) -> dict:
    """{case_direction: (measure name, final energy)} for reports."""
    out = {}
    for name in cfg.cases():
        for direction in ("ascent", "descent"):
            key = f"{name}_{direction}"
            out[key] = (classify(res[f"{key}_xs"][-1], cfg.threshold), float(res[f"{key}_energy"][-1]))
    return out


def figures(res: Result, cfg: EnergyFlowConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    cases = cfg.cases()
    names = summary(res, cfg)
    fig, axs = plt.subplots(2, len(cases) + 1, figsize=(3.3 * (len(cases) + 1), 6.4),
                            layout="constrained")
    th = np.linspace(0, 2 * np.pi, 200)
    for c, (name, D) in enumerate(cases.items()):
        for r, direction in enumerate(("ascent", "descent")):
            key = f"{name}_{direction}"
            ax = axs[r, c]
            x0, x1 = res[f"{key}_xs"][0], res[f"{key}_xs"][-1]
            if D.shape[0] == 3:  # orthographic view onto the plane of the two top eigenvectors
                x0, x1 = x0[:, [2, 1]], x1[:, [2, 1]]
            ax.plot(np.cos(th), np.sin(th), color="0.85", lw=0.8)
            ax.scatter(x0[:, 0], x0[:, 1], s=12, facecolors="none", edgecolors="0.5", label="start")
            ax.scatter(x1[:, 0], x1[:, 1], s=30, color="C3" if direction == "ascent" else "C0",
                       label="end")
            ax.set_aspect("equal")
            ax.set_axis_off()
            diag = ",".join(f"{v:g}" for v in np.diag(D))
            ax.set_title(f"D=diag({diag}) {direction}\n→ {names[key][0]}, E={names[key][1]:.4g}",
                         fontsize=8)
    ax = axs[0, -1]
    for name in cases:
        for direction, ls in (("ascent", "-"), ("descent", "--")):
            e = res[f"{name}_{direction}_energy"]
            ax.semilogx(res["ts"][1:], e[1:] / e[0], ls, label=f"{name} {direction}")
    ax.set_xlabel("t")
    ax.set_ylabel("E(t)/E(0)")
    ax.set_title("energy: monotone in both directions", fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    ax = axs[1, -1]
    ax.semilogx(res["ts"][1:], res["four_x1_sq"][1:], label="descent from symmetric start")
    ax.axhline(float(res["four_root_x1_sq"]), color="k", ls=":",
               label="d₁tanh(βd₁x₁²)=d₂tanh(βd₂x₂²)")
    ax.set_xlabel("t")
    ax.set_ylabel("x₁²")
    ax.set_title(f"four particles, D=diag({cfg.four_d1:g},{cfg.four_d2:g}), β={cfg.beta:g}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return [tp.plot.save_figure(fig, out_dir / "energy_flow.png")]
