r"""Growth rates of the modes of a perturbed uniform law on S¹ against Funk–Hecke
(docs: math/noise.md#linear-stability-of-the-uniform-law).

ρ0 = 1 + ε cos kθ, k = 1..6, under SA or USA with value matrix K·I and independent noise σ:
the linearization gives λ_k = k²(K g_k − σ²/2), g_k = I_k(β)/β (USA) or I_k(β)/(β I_0(β)) (SA)
(:mod:`transformer_pde.theory.noisy_sphere`; noiseless USA: k²I_k(β)/β). Measured two
ways: the spectral Fokker–Planck solver (``tp.CircleDensity``; noiseless and noisy), and, without
noise, weighted deterministic particles θ_j = 2πj/n with weights ∝ 1 + ε cos kθ_j (a trapezoid
rule for ρ0, spectrally accurate, docs: math/mean_field.md#quadrature-references) through
``tp.solve(dyn, tp.Particles(x, w))``. The rate is the least-squares slope of log|ρ̂_k(t)| on [0, t1], where ε
e^{λt} stays linear.

How long i.i.d. particles follow the mean field (noiseless): n tokens drawn uniformly stay near
the uniform law, which the mean field keeps forever, but their Fourier modes start at
|ρ̂_k| ~ n^{−1/2} and grow as e^{λ_k t}, so the largest mode M(t) = max_{k<=k_max} |ρ̂_k(t)|
leaves the O(n^{−1/2}) band, reaching a fixed δ, at T_n ≈ log(δ√n)/λ_max: T_n against log n has
slope 1/(2λ_max), λ_max = max_k λ_k (averaged over seeds; the arrays ``follow_*``).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import ATTENTIONS, finish_panel
from .configs.instability import InstabilityConfig


def _theory(cfg, sigma):
    ns = tp.theory.noisy_sphere
    cls = {"SA": ns.NoisySA, "USA": ns.NoisyUSA}[cfg.model]
    return cls(beta=cfg.beta, sigma=sigma)


def _slope(ts, amp):
    return float(np.polyfit(ts, np.log(amp), 1)[0])


def _first_crossing(ts, m, delta):
    """First time m(t) reaches delta (log-linear between saves); inf if it never does."""
    above = np.nonzero(m >= delta)[0]
    if len(above) == 0:
        return np.inf
    i = above[0]
    if i == 0:
        return float(ts[0])
    a, b = np.log(max(m[i - 1], 1e-300)), np.log(m[i])
    return float(ts[i - 1] + (ts[i] - ts[i - 1]) * (np.log(delta) - a) / (b - a))


def _follow(cfg, dyn, lam_max):
    """T_n for i.i.d. uniform tokens: (ns, times (len(ns), seeds))."""
    ns = 2 ** np.arange(int(np.log2(cfg.follow_n_min)), int(np.log2(cfg.follow_n_max)) + 1)
    t_max = (0.5 * np.log(ns[-1]) + np.log(cfg.follow_delta) + 6.0) / lam_max
    steps = int(np.ceil(t_max / cfg.follow_dt))
    ts = cfg.follow_dt * np.arange(steps + 1)
    kk = jnp.arange(1, cfg.k_max + 1)

    def stat(t, x, args):
        theta = jnp.arctan2(x[:, 1], x[:, 0])
        return jnp.max(jnp.abs(jnp.mean(jnp.exp(1j * kk[:, None] * theta[None, :]), axis=1)))

    times = np.zeros((len(ns), cfg.follow_seeds))
    for a, n in enumerate(ns):
        keys = jax.random.split(jax.random.key(int(n)), cfg.follow_seeds)
        run = lambda key, n=n: tp.solve(  # noqa: E731
            dyn, tp.uniform_sphere(key, int(n), 2), t1=float(ts[-1]), dt0=cfg.follow_dt, event=None,
            saveat=diffrax.SaveAt(ts=jnp.asarray(ts), fn=stat)).stats
        m = np.asarray(jax.vmap(run)(keys))
        times[a] = [_first_crossing(ts, m[s], cfg.follow_delta) for s in range(cfg.follow_seeds)]
    return ns, times


def compute(cfg: InstabilityConfig, progress: bool = False) -> Result:
    with jax.enable_x64(True):  # the solvers and Newton tolerances are float64 ones
        eye = jnp.eye(2)
        dyn = tp.Sphere(ATTENTIONS[cfg.model]()(eye, eye, cfg.K * eye, cfg.beta))
        ks = np.arange(1, cfg.k_max + 1)
        sigmas = np.array([0.0, cfg.sigma])
        ts = np.linspace(0.0, cfg.t1, cfg.num_saves)
        controller = diffrax.PIDController(rtol=cfg.rtol, atol=cfg.rtol / 100)
        theory = np.array([_theory(cfg, s).growth_rate(ks, cfg.K) for s in sigmas])
        pde = np.zeros((len(sigmas), len(ks)))
        for a, s in enumerate(sigmas):
            for b, k in enumerate(ks):
                rho0 = tp.CircleDensity(lambda th, k=k: 1 + cfg.eps * np.cos(k * th), s, modes=cfg.modes)
                sol = tp.solve(dyn, rho0, t1=cfg.t1, saveat=jnp.asarray(ts), stepsize_controller=controller)
                amp = np.abs(np.asarray(tp.solvers.circle.fourier_coefficients(sol.xs))[:, k])
                pde[a, b] = _slope(ts, amp)
        theta = 2 * np.pi * np.arange(cfg.n) / cfg.n
        x = np.stack([np.cos(theta), np.sin(theta)], 1)
        particles = np.zeros(len(ks))
        for b, k in enumerate(ks):
            w = 1 + cfg.eps * np.cos(k * theta)
            sol = tp.solve(dyn, tp.Particles(jnp.asarray(x), jnp.asarray(w / w.sum())), t1=cfg.t1,
                           saveat=jnp.asarray(ts), stepsize_controller=controller)
            X = np.asarray(sol.xs)
            amp = np.abs(np.sum(w / w.sum() * np.exp(-1j * k * np.arctan2(X[..., 1], X[..., 0])), -1))
            particles[b] = _slope(ts, amp)
        lam_max = float(theory[0].max())
        if lam_max <= 0:
            raise ValueError(f"the uniform law is stable (max_k λ_k = {lam_max:.4g} <= 0 for σ = 0): "
                             "no mode grows, i.i.d. particles follow the mean field for ever")
        follow_n, follow_times = _follow(cfg, dyn, lam_max)
        follow_mean = follow_times.mean(axis=1)
        follow_slope = float(np.polyfit(np.log(follow_n), follow_mean, 1)[0]) if np.all(
            np.isfinite(follow_mean)) else np.nan
        rel = lambda m, t: np.abs(m - t) / np.maximum(np.abs(t), 1e-12)  # noqa: E731
        arrays = {"k": ks, "sigma": sigmas, "ts": ts, "theory": theory, "pde": pde, "particles": particles,
                  "pde_rel_error": rel(pde, theory), "particles_rel_error": rel(particles, theory[0]),
                  "max_rel_error": np.asarray(max(rel(pde, theory).max(), rel(particles, theory[0]).max())),
                  "lambda_max": np.asarray(lam_max), "follow_n": follow_n, "follow_times": follow_times,
                  "follow_mean": follow_mean, "follow_slope": np.asarray(follow_slope),
                  "follow_slope_theory": np.asarray(1 / (2 * lam_max))}
        grids = {"rates": grid({"sigma": sigmas, "k": ks}, theory=(("sigma", "k"), theory), pde=(("sigma", "k"), pde),
                               describe={
                                   "sigma": ("noise level σ", ""),
                                   "k": ("Fourier mode k of the perturbation 1 + ε cos kθ", ""),
                                   "theory": ("growth rate λ_k of the linearization (Funk–Hecke)", ""),
                                   "pde": ("growth rate measured with the spectral Fokker–Planck solver "
                                           "(slope of log|ρ̂_k(t)| on [0, t1])", "")})}
        return Result(arrays, grids)


def figures(res: Result, cfg: InstabilityConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    ks = res["k"]
    ax = axes[0]
    for a, s in enumerate(res["sigma"]):
        # modes are integers (Funk–Hecke is defined there only): theory as dots joined by a line
        ax.plot(ks, res["theory"][a], ".-", color=f"C{a}", label=f"theory σ = {s:g}")
        ax.plot(ks, res["pde"][a], "o", color=f"C{a}", mfc="none", ms=8, label=f"PDE σ = {s:g}")
    ax.plot(ks, res["particles"], "x", color="C0", ms=8, label=f"weighted particles n = {cfg.n} (σ = 0)")
    ax.axhline(0, color="k", lw=0.5)
    finish_panel(ax, xlabel="mode k", ylabel="growth rate λ_k",
                 title=f"{cfg.model}, β = {cfg.beta:g}, K = {cfg.K:g}: λ_k = k²(K g_k − σ²/2)")
    ax = axes[1]
    for a, s in enumerate(res["sigma"]):
        ax.semilogy(ks, np.maximum(res["pde_rel_error"][a], 1e-16), "o-", label=f"PDE σ = {s:g}")
    ax.semilogy(ks, np.maximum(res["particles_rel_error"], 1e-16), "x--", label="particles σ = 0")
    ax.axhline(1e-2, color="k", ls=":", label="1 %")
    finish_panel(ax, grid="both", xlabel="mode k", title="relative error against the formula")
    ax = axes[2]
    lam = float(res["lambda_max"])
    x = np.log(res["follow_n"]) / (2 * lam)
    times = res["follow_times"]
    ax.plot(np.repeat(x, times.shape[1]), times.ravel(), ".", color="C7", alpha=0.5, label="seeds")
    ax.plot(x, res["follow_mean"], "o-", color="C3", label=f"mean, slope {float(res['follow_slope']) * 2 * lam:.3g}")
    c = np.mean(res["follow_mean"] - x)
    ax.plot(x, x + c, "k--", lw=1, label="slope 1: log(δ√n)/λ_max")
    finish_panel(ax, xlabel="log n / (2 λ_max)", ylabel=f"T_n: max_k |ρ̂_k| reaches δ = {cfg.follow_delta:g}",
                 title="how long i.i.d. particles follow the mean field (σ = 0)")
    return [tp.plot.save_figure(fig, out_dir / "instability.png")]
