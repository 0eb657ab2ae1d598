"""Lost in the middle (LitM, docs: math/causal.md#lost-in-the-middle): the U-shaped retrieval profile of causal
attention.

Tokens i.i.d. uniform on the circle follow the LitM model (causal USA with ALiBi weights,
:class:`~transformer_pde.LostInTheMiddle`). The source token sits at position σ0 and the
answer is read off the last token at depth t. The soft accuracy is
A_N = √(π/2)/M + √(2π)/(MN) S_t(σ0) + o(1/N), and the profile S_t(σ0) is computed three ways:

* Monte Carlo over particle simulations (``num_runs`` i.i.d. starts, all sources at once;
  :func:`retrieval_monte_carlo`, here: the theory room holds the closed forms only);
* the finite-N linearization (matrix exponential of the exact ALiBi weights);
* the closed form Σ_n ω_n g_{a_n}(t, 1; σ0) with the Bessel function I_1 and a_n = n² I_n(β).

Under the smallness condition t·sup a_n <= min{3 − √3, 2(1 − e^{−λ})} the closed form is
U-shaped: primacy (→ ∞ as σ0 → 0), recency (S'(1⁻) > 0) and one interior minimum.

The published particle demo (docs: math/causal.md#lost-in-the-middle) is rerun too: N = 64, β = λ = 1, four initial
clusters (centers (0.1 ... 1.9)π, jitter N(0, 0.075²) from NumPy's default_rng(17), as in the
authors' script); cluster counts (arc < 0.01) 39/29/22/14/1 at t = 0/1/2/5/10, then every token
sits at token 1's fixed angle.
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from .configs.lost_in_the_middle import LostInTheMiddleConfig


def _bin(values, bins):
    """Average consecutive entries into ``bins`` groups (sizes differ by at most one)."""
    groups = np.array_split(np.arange(len(values)), bins)
    return np.array([values[g].mean() for g in groups]), groups


def _deltas(key, dyn, n, t, dt, num_runs, chunk):
    """For num_runs i.i.d. uniform starts: θ_N(t) − θ_i(0) and θ_N(0) − θ_i(0), i = 1..N−1.

    The program holds no host callback, so JAX's compilation cache keeps it between processes:
    the starts are finite by construction (uniform draws), and each solve's failure code and
    blow-up time are returned (``throw=False``) and raised after the program, as ``tp.solve``
    would have raised them (``tp.raise_if_failed``)."""
    def one(k):
        th0 = jax.random.uniform(k, (n, 1), minval=0.0, maxval=2 * jnp.pi)
        tp.runs.finite_by_construction([th0])
        sol = tp.solve(dyn, th0, t1=t, dt0=dt, max_steps=int(np.ceil(t / dt)) + 1, throw=False)
        thN = sol.xs[0, -1, 0]
        return thN - th0[:-1, 0], th0[-1, 0] - th0[:-1, 0], sol.result, sol.nonfinite_time

    keys = jax.random.split(key, num_runs)
    out = jax.lax.map(jax.vmap(one), keys.reshape(-1, chunk))
    tp.raise_if_failed(out[2], out[3], where="lost-in-the-middle", advice="lower dt")
    return out[0].reshape(num_runs, n - 1), out[1].reshape(num_runs, n - 1)


def retrieval_monte_carlo(key, t, n: int, beta, lam, M: int = 8, n_max: int = 20, *,
                          num_runs: int = 1024, dt: float = 0.05, chunk: int = 256):
    r"""Monte Carlo estimate of S_t(σ0) at σ0 = i/N, i = 1..N−1, from particle simulations.

    S_MC = N Σ_{n>=1} ω_n E[cos n(θ_N(t) − θ_i(0)) − cos n(θ_N(0) − θ_i(0))], which equals
    (MN/√(2π))(A_N − √(π/2)/M) since the soft accuracy is
    A_N = (√(π/2)/M) Σ_n ω_n E e^{inΔ}. The subtracted t = 0 term has mean zero for i.i.d.
    tokens (a control variate that removes most of the variance).

    Returns ``(sigma0, mean, stderr)``.
    """
    if num_runs % chunk:
        raise ValueError(f"num_runs={num_runs} must be a multiple of chunk={chunk}")
    dyn = tp.LostInTheMiddle(beta, lam)
    d_t, d_0 = _deltas(key, dyn, n, float(t), float(dt), num_runs, chunk)
    om = jnp.asarray(tp.theory.lost_in_the_middle.retrieval_weights(M, n_max))
    ns = jnp.arange(1, n_max + 1)

    def stat(dt_, d0_):
        return n * jnp.sum(om[:, None] * (jnp.cos(ns[:, None] * dt_[None, :]) - jnp.cos(ns[:, None] * d0_[None, :])), 0)

    vals = np.asarray(jax.lax.map(lambda a: stat(*a), (d_t, d_0)))
    sigma0 = np.arange(1, n) / n
    return sigma0, vals.mean(0), vals.std(0, ddof=1) / np.sqrt(num_runs)


def alibi_demo(dt: float = 0.01):
    """The published particle demo (docs: math/causal.md#the-retrieval-profile): returns
    (ts, angles (T, 64), cluster counts at arc < 0.01)."""
    rng = np.random.default_rng(17)
    labels = np.repeat(np.arange(4), 16)
    centers = np.linspace(0.1, 1.9, 4) * np.pi
    th0 = np.mod(centers[labels] + rng.normal(0.0, 0.075, size=64), 2 * np.pi)
    ts = jnp.array([0.0, 1.0, 2.0, 5.0, 10.0])
    sol = tp.solve(tp.LostInTheMiddle(1.0, 1.0), th0[:, None], t1=10.0, dt0=dt, saveat=ts,
                solver=diffrax.Tsit5())
    th = np.asarray(sol.xs)[..., 0]
    counts = np.array([int(tp.diagnostics.cluster_count(jnp.asarray(np.stack([np.cos(a), np.sin(a)], 1)),
                                         float(np.cos(0.01)))) for a in th])
    return np.asarray(ts), th, counts


def compute(cfg: LostInTheMiddleConfig, progress: bool = False) -> Result:
    theory = tp.theory.lost_in_the_middle
    sigma_fine = np.linspace(0.005, 0.995, 199)
    times = np.array([0.5, 1.0, 1.5, 2.0, 2.2, cfg.t])
    closed_fine = np.stack([np.asarray(theory.retrieval_profile(s, sigma_fine, cfg.beta, cfg.lam, cfg.M, cfg.n_max))
                            for s in times])
    sigma0, mc, mc_se_pt = retrieval_monte_carlo(
        jax.random.key(cfg.seed), cfg.t, cfg.n, cfg.beta, cfg.lam, cfg.M, cfg.n_max,
        num_runs=cfg.num_runs, dt=cfg.dt, chunk=cfg.chunk)
    _, discrete = theory.retrieval_discrete(cfg.t, cfg.n, cfg.beta, cfg.lam, cfg.M, cfg.n_max)
    closed = np.asarray(theory.retrieval_profile(cfg.t, sigma0, cfg.beta, cfg.lam, cfg.M, cfg.n_max))
    mc_bin, groups = _bin(mc, cfg.bins)
    # bins average independent-ish source positions; stderr from the per-point errors (upper
    # bound: positive correlation between neighbouring sources would only shrink it less)
    se_bin = np.array([np.sqrt(np.sum(mc_se_pt[g] ** 2)) / len(g) for g in groups])
    closed_bin = np.array([closed[g].mean() for g in groups])
    discrete_bin = np.array([discrete[g].mean() for g in groups])
    sigma_bin = np.array([sigma0[g].mean() for g in groups])
    shape = theory.u_shape(closed_fine[-1])
    demo_ts, demo_theta, demo_counts = alibi_demo()
    spread = np.abs(np.angle(np.exp(1j * (demo_theta[-1] - demo_theta[0, 0])))).max()
    return Result({
        "demo_ts": demo_ts, "demo_theta": demo_theta, "demo_counts": demo_counts,
        "demo_final_spread": np.asarray(spread),
        "sigma_fine": sigma_fine, "times": times, "closed_fine": closed_fine,
        "sigma0": sigma0, "mc": mc, "mc_se": mc_se_pt, "discrete": discrete, "closed": closed,
        "sigma_bin": sigma_bin, "mc_bin": mc_bin, "mc_bin_se": se_bin, "closed_bin": closed_bin,
        "discrete_bin": discrete_bin,
        "z_closed": (mc_bin - closed_bin) / se_bin, "z_discrete": (mc_bin - discrete_bin) / se_bin,
        "smallness": np.asarray(theory.smallness_holds(cfg.t, cfg.beta, cfg.lam)),
        "primacy": np.asarray(shape["primacy"]), "recency": np.asarray(shape["recency"]),
        "unique_min": np.asarray(shape["unique_min"]),
        "argmin_sigma": np.asarray(sigma_fine[shape["argmin"]]),
    })


def figures(res: Result, cfg: LostInTheMiddleConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    ax = axes[0]
    ax.plot(res["sigma_fine"], res["closed_fine"][-1], "k-", lw=2, label="closed form $S_t(σ_0)$")
    ax.plot(res["sigma0"], res["discrete"], "C1.", ms=4, label=f"finite-N linearization (N={cfg.n})")
    ax.errorbar(res["sigma_bin"], res["mc_bin"], yerr=2 * res["mc_bin_se"], fmt="o", color="C0",
                capsize=3, label=f"Monte Carlo, {cfg.num_runs} runs (±2 s.e.)")
    ax.axvline(float(res["argmin_sigma"]), color="0.6", ls=":", lw=1)
    ax.set_xlabel("source position σ0")
    ax.set_ylabel("$S_t(σ_0)$")
    ok = "U-shaped" if (res["primacy"] and res["recency"] and res["unique_min"]) else "not U-shaped"
    ax.set_title(f"LitM retrieval profile, t={cfg.t:g}, β={cfg.beta:g}, λ={cfg.lam:g}: {ok}")
    ax.set_ylim(0, 1.6 * float(np.max(res["closed"])))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1]
    for s, prof in zip(res["times"][:-1], res["closed_fine"][:-1]):
        ax.plot(res["sigma_fine"], prof, label=f"t = {s:g}")
    ax.set_yscale("log")
    ax.set_xlabel("source position σ0")
    ax.set_title("closed form at several depths")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[2]
    th = res["demo_theta"]
    for k, (t, a) in enumerate(zip(res["demo_ts"], th)):
        ax.scatter(np.full(a.shape, t), np.mod(a, 2 * np.pi), s=6, color=f"C{k}",
                   label=f"t={t:g}: {int(res['demo_counts'][k])} clusters")
    ax.axhline(float(np.mod(th[0, 0], 2 * np.pi)), color="k", lw=0.8, ls=":", label="θ_1(0)")
    ax.set_xlabel("t")
    ax.set_ylabel("θ mod 2π")
    ax.set_title("published ALiBi demo: N=64, β=λ=1, four initial clusters", fontsize=9)
    ax.legend(fontsize=7)
    return [tp.plot.save_figure(fig, out_dir / "lost_in_the_middle.png")]
