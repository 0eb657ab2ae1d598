r"""The phase transition of noisy attention on S¹: stationary branches, folds, a phase diagram
(docs: math/noise.md#phase-transition).

Noisy USA (Mun–Rosenzweig, arXiv 2606.05140, 2604.16288): dX = K P⊥Γ dt + σ dB^S. The uniform law
is linearly stable iff K < K_#(β) = σ²β/(2I_1(β)); the transition is continuous for β < β_* (root of
I_2/I_1 = 1/2, β_* = 2.447) and discontinuous beyond: the clustered branch leaves K_# backwards and
turns at a fold K_c < K_#, so on [K_c, K_#] the uniform and the clustered state are both stable.
Here the branches are computed, not guessed: Newton continuation of the stationary Fokker–Planck
equation (:mod:`transformer_pde.stationary.circle`), each point with the spectrum of its
linearization. Left: the order parameter m = |∫x dρ| against K for each β, stable solid, unstable
dashed, K_# of the theory and the folds marked. Right: the phase diagram over (β, K): K_#(β) and
the computed fold K_c(β).

Particle curves (``particles``, on by default): n noisy particles on S¹ (d = 2) and S² (d = 3)
under the same K-scaled noisy USA/SA, ``tp.solve(tp.Sphere(attn with V = K·I), x, noise=tp.Noise(σ))``
with Euler (the noisy residual layer; the retraction adds the Itô drift), K swept up over
[K_lo, K_factor]·K_#^{(d)}(β) and then down again, each K started from the previous K's final
state, so a discontinuous transition shows its hysteresis loop (uniform kept up to ≈K_#, the
clustered state kept down to ≈K_c). Each point is |(1/n)Σ X_i| averaged over the second half of
its run and over independent seeds (one ``lax.scan`` over K, ``vmap`` over seeds and β). Finite n
puts a floor O(n^{−1/2}) under the uniform branch (n·E m² = 1/(1 − K/K_#) below K_#), finite run
times round the jumps (critical slowing down near K_#). Default run (n = 256, 2 seeds, t = 20 per K,
h = 0.02; 3 min on a shared 2-core CPU): S¹, β = 1.5: m = 0.81 (up), 0.78 (down) at 1.3 K_# against the
branch's 0.78, 0.88 against 0.88 at 1.6 K_#; β = 4 on S¹ (fold K_c = 0.944 K_#): clustered from
1.0–1.1 K_# going up (0.45 at K_#: n = 256 fluctuations nucleate early), kept down to 0.9 K_#
(0.57), uniform at 0.8; β = 4 on S² (β_*^{(3)} = 1.816): up jumps between 0.9 and 1.0 K_#^{(3)},
down kept to 0.8 (0.79), a loop of width ~0.2 K_#; β = 1.5 on S²: no loop beyond finite-time lag.

On S² the particles are drawn over the zonal PDE branch (:func:`sphere_branches`,
``tp.stationary.zonal_branch`` at ``degree``): the stationary ⟨cos ϑ⟩ = |∫x dρ| against K/K_#^{(3)},
stable solid and unstable dashed (zonal spectrum), the fold K_c marked (β = 4: K_c = 0.7916 K_#^{(3)},
⟨cos ϑ⟩ = 0.730 there; the table over β and d = 3, 4, 8: docs/math/fold_table.md, ``benchmarks/fold_table.py``).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import ATTENTIONS
from .configs.noisy_transition import NoisyTransitionConfig


def _dynamics(cfg, beta):
    return tp.Sphere(ATTENTIONS[cfg.model]().identity(2, float(beta), dtype=jnp.float64))


def _theory(cfg, beta):
    ns = tp.theory.noisy_sphere
    return {"SA": ns.NoisySA, "USA": ns.NoisyUSA}[cfg.model](beta=float(beta), sigma=cfg.sigma)


def _theory_d(cfg, beta, d):
    ns = tp.theory.noisy_sphere
    return {"SA": ns.NoisySA, "USA": ns.NoisyUSA}[cfg.model](beta=float(beta), d=d, sigma=cfg.sigma)


def particle_sweeps(cfg, d, betas, Ks, key):
    """Order parameters of noisy particle systems on S^{d−1}, K swept along ``Ks`` ``(B, P)`` for
    each β: returns ``(B, seeds, P)``, |(1/n)Σ X_i| averaged over the second half of each run."""
    steps = max(4, round(cfg.run_time / cfg.dt))
    h = cfg.run_time / steps
    ts = h * np.arange(steps - steps // 2, steps + 1)  # the second half, on the step grid
    attention = ATTENTIONS[cfg.model]()
    noise = tp.Noise(cfg.sigma, path=tp.BrownianIncrements())

    def one(beta, K_path, k, x0):
        def at_K(x, Kk):
            K, kk = Kk
            eye = jnp.eye(d, dtype=x.dtype)
            dyn = tp.Sphere(attention(eye, eye, K * eye, beta))
            sol = tp.solve(dyn, x, t1=cfg.run_time, dt0=h, saveat=jnp.asarray(ts), solver=diffrax.Euler(),
                           noise=noise, key=kk, event=None)
            m = jnp.linalg.norm(jnp.mean(sol.xs, axis=1), axis=-1)
            return sol.xs[-1], jnp.mean(m)
        return jax.lax.scan(at_K, x0, (K_path, jax.random.split(k, K_path.shape[0])))[1]

    B = len(betas)
    k0, k1 = jax.random.split(key)
    x0 = jax.random.normal(k0, (B, cfg.seeds, cfg.n, d))
    x0 = x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)
    keys = jax.random.split(k1, (B, cfg.seeds))
    def run(betas, Ks, keys, x0):
        return jax.vmap(jax.vmap(one, in_axes=(None, None, 0, 0)), in_axes=(0, 0, 0, 0))(betas, Ks, keys, x0)

    return np.asarray(tp.runs.kept(run)(jnp.asarray(betas, jnp.float64), jnp.asarray(Ks), keys, x0))


def sphere_branches(cfg) -> dict:
    """The zonal stationary branches on S² (``tp.stationary.zonal_branch``) for each β, padded to one
    length: K, ⟨cos ϑ⟩ (= |∫x dρ|, the particles' order parameter), zonal stability, the fold and
    the order parameter there (NaN where the branch does not turn)."""
    branches = []
    for beta in cfg.betas:
        dyn = tp.Sphere(ATTENTIONS[cfg.model]().identity(3, float(beta), dtype=jnp.float64))
        K_max = cfg.K_factor * _theory_d(cfg, beta, 3).critical_coupling()
        branches.append(tp.stationary.zonal_branch(dyn, cfg.sigma, degree=cfg.degree, K_max=K_max,
                                                   max_points=cfg.max_points))
    P = max(len(b.K) for b in branches)
    pad = lambda v: np.concatenate([v, np.full(P - len(v), np.nan)])  # noqa: E731
    return {"s2_K": np.stack([pad(b.K) for b in branches]),
            "s2_order": np.stack([pad(b.order) for b in branches]),
            "s2_stable": np.stack([pad(b.stable.astype(float)) for b in branches]),
            "s2_fold": np.array([b.folds[0] if b.folds else np.nan for b in branches]),
            "s2_fold_order": np.array([b.fold_orders[0] if b.folds else np.nan for b in branches])}


def compute(cfg: NoisyTransitionConfig, progress: bool = False) -> Result:
    with jax.enable_x64(True):  # the solvers and Newton tolerances are float64 ones
        cb = tp.stationary.circle
        branches = []
        for beta in cfg.betas:
            Ks = _theory(cfg, beta).critical_coupling()
            branches.append(cb.branch_from_uniform(_dynamics(cfg, beta), cfg.sigma, modes=cfg.modes,
                                                   K_max=cfg.K_factor * Ks, max_points=cfg.max_points))
        P = max(len(b.K) for b in branches)
        pad = lambda v: np.concatenate([v, np.full(P - len(v), np.nan)])  # noqa: E731
        K = np.stack([pad(b.K) for b in branches])
        order = np.stack([pad(b.order) for b in branches])
        stable = np.stack([pad(b.stable.astype(float)) for b in branches])
        fold = np.array([b.folds[0] if b.folds else np.nan for b in branches])
        pb = np.asarray(cfg.phase_betas, dtype=float)
        K_sharp = np.array([_theory(cfg, b).critical_coupling() for b in pb])
        K_bif = np.zeros_like(pb)
        K_fold = np.full_like(pb, np.nan)
        for i, beta in enumerate(pb):
            b = cb.branch_from_uniform(_dynamics(cfg, beta), cfg.sigma, modes=cfg.modes,
                                       K_max=cfg.K_factor * K_sharp[i], max_points=cfg.max_points)
            K_bif[i] = b.bifurcation
            K_fold[i] = b.folds[0] if b.folds else np.nan
        try:
            beta_star = tp.theory.noisy_sphere.critical_beta(type(_theory(cfg, 1.0)), 2)
        except ValueError:
            beta_star = np.nan
        arrays = {"betas": np.asarray(cfg.betas, float), "K": K, "order": order, "stable": stable, "fold": fold,
                  "K_sharp_branches": np.array([_theory(cfg, b).critical_coupling() for b in cfg.betas]),
                  "bifurcation": np.array([b.bifurcation for b in branches]),
                  "phase_betas": pb, "K_sharp": K_sharp, "K_bifurcation": K_bif, "K_fold": K_fold,
                  "beta_star": np.asarray(beta_star)}
        if cfg.particles:
            r = np.linspace(cfg.K_lo, cfg.K_factor, cfg.K_points)
            arrays["particle_K_ratio"] = np.concatenate([r, r[::-1]])  # up, then down
            for d in cfg.dims:
                Ks = np.array([_theory_d(cfg, b, d).critical_coupling() for b in cfg.betas])
                m = particle_sweeps(cfg, d, cfg.betas, Ks[:, None] * arrays["particle_K_ratio"],
                                    jax.random.key(d))
                arrays[f"particle_order_d{d}"] = m.mean(axis=1)
                arrays[f"particle_order_d{d}_seeds"] = m
                arrays[f"K_sharp_d{d}"] = Ks
            try:
                arrays["beta_star_d3"] = np.asarray(tp.theory.noisy_sphere.critical_beta(type(_theory(cfg, 1.0)), 3))
            except ValueError:
                arrays["beta_star_d3"] = np.asarray(np.nan)
            if 3 in cfg.dims:
                arrays.update(sphere_branches(cfg))
        grids = {"phase": grid({"beta": pb}, K_sharp=(("beta",), K_sharp), K_bifurcation=(("beta",), K_bif),
                               K_fold=(("beta",), K_fold),
                               describe={
                                   "beta": ("inverse temperature β of the noisy attention", ""),
                                   "K_sharp": ("critical coupling K_# of the linear theory (the uniform law is stable "
                                               "below it)", ""),
                                   "K_bifurcation": ("coupling K where the computed branch leaves the uniform law", ""),
                                   "K_fold": ("coupling K_c of the first fold of the computed branch "
                                              "(NaN if none)", "")})}
        return Result(arrays, grids)


def figures(res: Result, cfg: NoisyTransitionConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    s2 = "particle_order_d3" in res
    fig, axes = plt.subplots(1, 3 if s2 else 2, figsize=(18 if s2 else 12, 4.5))
    ax = axes[0]
    for i, beta in enumerate(res["betas"]):
        K, m, st = res["K"][i], res["order"][i], res["stable"][i]
        ok = np.isfinite(K)
        K, m, st = K[ok], m[ok], st[ok] > 0.5
        Ks = float(res["K_sharp_branches"][i])
        x = K / Ks
        for j in range(len(x) - 1):
            ax.plot(x[j:j + 2], m[j:j + 2], "-" if st[j + 1] else "--", color=f"C{i}")
        ax.plot([0.5, 1.0], [0, 0], "-", color=f"C{i}")
        ax.plot([1.0, x.max()], [0, 0], "--", color=f"C{i}")
        ax.plot([], [], "-", color=f"C{i}", label=f"β = {beta:g}")
        if np.isfinite(res["fold"][i]):
            ax.plot(res["fold"][i] / Ks, m[np.argmin(K)], "v", color=f"C{i}", ms=8,
                    label=f"fold K_c = {res['fold'][i] / Ks:.3f} K_#")
    ax.axvline(1.0, color="k", lw=0.8, ls=":", label="K_# (theory)")
    ax.set_xlabel("K / K_#(β)")
    ax.set_ylabel("order parameter m = |∫x dρ|")
    ax.set_title(f"{cfg.model} on S¹, σ = {cfg.sigma:g}: stationary branches (solid stable)"
                 + (",\nparticles swept K up (▲) then down (▼)" if "particle_order_d2" in res else ""), fontsize=10)
    if "particle_order_d2" in res:
        _particle_markers(ax, res, cfg, 2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if s2:
        ax = axes[1]
        _particle_markers(ax, res, cfg, 3, lines="s2_K" not in res, label=True)
        if "s2_K" in res:
            _branch_lines(ax, res["s2_K"], res["s2_order"], res["s2_stable"], res["s2_fold"], res["s2_fold_order"],
                          res["K_sharp_d3"])
        ax.axvline(1.0, color="k", lw=0.8, ls=":", label="K_#^{(3)} (theory)")
        ax.set_xlabel("K / K_#^{(3)}(β)")
        ax.set_ylabel("order parameter |(1/n)Σ X_i|")
        bs = float(res["beta_star_d3"])
        ax.set_title(f"{cfg.model} on S², σ = {cfg.sigma:g} (β_*^(3) = {bs:.3f}): particles and the zonal\n"
                     "PDE branch (solid stable, dashed unstable),\n▼ fold K_c; hysteresis on [K_c, K_#]", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    ax = axes[-1]
    pb = res["phase_betas"]
    ax.plot(pb, res["K_sharp"], "k-", label="K_#(β): uniform law loses stability")
    ax.plot(pb, res["K_bifurcation"], "k+", ms=8, label="bifurcation found by continuation")
    f = np.isfinite(res["K_fold"])
    if f.any():
        ax.plot(pb[f], res["K_fold"][f], "o-", color="C3", label="fold K_c(β)")
        ax.fill_between(pb[f], res["K_fold"][f], res["K_sharp"][f], color="C3", alpha=0.2, label="bistable")
    if np.isfinite(res["beta_star"]):
        ax.axvline(float(res["beta_star"]), color="C2", ls=":", label=f"β_* = {float(res['beta_star']):.3f}")
    ax.set_yscale("log")
    ax.set_xlabel("β")
    ax.set_ylabel("K")
    ax.set_title("phase diagram: uniform below, clustered above", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return [tp.plot.save_figure(fig, out_dir / "noisy_transition.png")]


def _branch_lines(ax, K, order, stable, fold, fold_order, K_sharp):
    """Stationary branches against K/K_# (solid stable, dashed unstable), the uniform law (stable
    below K_#), and the folds."""
    for i in range(K.shape[0]):
        ok = np.isfinite(K[i])
        x, m, st = K[i][ok] / K_sharp[i], order[i][ok], stable[i][ok] > 0.5
        for j in range(len(x) - 1):
            ax.plot(x[j:j + 2], m[j:j + 2], "-" if st[j + 1] else "--", color=f"C{i}", lw=1.5)
        ax.plot([min(0.5, x.min()), 1.0], [0, 0], "-", color=f"C{i}", lw=1.5)
        ax.plot([1.0, x.max()], [0, 0], "--", color=f"C{i}", lw=1.5)
        if np.isfinite(fold[i]):
            ax.plot(fold[i] / K_sharp[i], fold_order[i], "v", color=f"C{i}", ms=9,
                    label=f"fold K_c = {fold[i] / K_sharp[i]:.3f} K_#")


def _particle_markers(ax, res, cfg, d, lines=False, label=False):
    r = res["particle_K_ratio"]
    P = len(r) // 2
    m = res[f"particle_order_d{d}"]
    for i, beta in enumerate(res["betas"]):
        kw = dict(color=f"C{i}", ms=6, ls="-" if lines else "none", lw=0.8)
        ax.plot(r[:P], m[i, :P], marker="^", label=f"β = {beta:g}, n = {cfg.n}, K up" if label else None, **kw)
        ax.plot(r[P:], m[i, P:], marker="v", mfc="none", label=f"β = {beta:g}, K down" if label else None, **kw)
