r"""Bipodal metastability on S¹ (Menon–Murray; docs: math/sphere.md#bipodal-metastability).

n i.i.d. uniform tokens on S¹ under SA with β = 1, Q = V = I, K = diag(a, b), a < b: the
tokens first gather in two antipodal clusters along the dominant axis of K (the bipodal
phase), which is a saddle: its one unstable mode, the defect δ of the clusters from
antipodality, grows at the rate λ = 2/(e^{2γ*} + 1), γ* = max(a, b)
(:func:`transformer_pde.theory.metastability.bipodal_escape_rate`), from the sampling noise
δ₀ ∝ n^{−1/2}; so the phase lasts C ln n + D with C = 1/(2λ)
(:func:`~transformer_pde.theory.metastability.bipodal_log_slope`), and the clusters then merge.

**Detection.** With z_j = e^{iθ_j}, R₁ = |mean z_j| and R₂ = |mean z_j²|, the state is bipodal
at a save when R₂ >= 1 − ε (every token near ±u for one axis u) and R₁ <= 1 − ε (both ends hold
tokens: not one cluster). The phase is the first run of bipodal saves: it starts at the first
bipodal save and ends at the first later save that is not; its length is 0 if no save is bipodal,
and runs still bipodal at t1 are counted (``censored``) and cut at t1. For two point clusters of
masses m, 1 − m, R₂ = (1 − 4m(1 − m) sin²δ)^{1/2}, so the phase ends near δ = (2ε)^{1/2} for
equal masses.

Measured: the phase length for each n and seed, the fit length ≈ C ln n + D over seeds with
bootstrap intervals (:func:`transformer_pde.statistics.fit_log_law`), against the predicted C;
and the growth rate of ln|δ| inside the phase (a least-squares slope per run, median over runs)
against λ.

**Kernel.** The exact O(n²) kernel up to ``fast_from`` tokens, the NUFFT Gaussian sum
(``tp.kernels.Fast(tol=fast_tol)``, the scores Kx live in R²) from there on: the default full law
n = 2⁴ … 2¹² then runs in minutes on two cores (benchmarks/README.md, "Bipodal metastability"),
and at n = 1024 and 2048 the two kernels detect the same phase to one save.
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import pid
from .configs.bipodal import BipodalConfig


def order_parameters(t, x, args=None):
    """(R₁, R₂, δ) of unit tokens x on S¹: |mean z|, |mean z²|, and the defect δ ∈ (−π, π] of
    the two half-clusters from antipodality (the tokens split by the axis of mean z²)."""
    z = (x[:, 0] + 1j * x[:, 1]) / jnp.hypot(x[:, 0], x[:, 1])
    m2 = jnp.mean(z * z)
    u = jnp.exp(0.5j * jnp.angle(m2))
    side = jnp.real(z * jnp.conj(u)) >= 0
    plus, minus = jnp.sum(jnp.where(side, z, 0)), jnp.sum(jnp.where(side, 0, z))
    delta = jnp.angle(-plus * jnp.conj(minus))  # arg(plus) − arg(minus) − π, wrapped
    return jnp.stack([jnp.abs(jnp.mean(z)), jnp.abs(m2), delta])


def phase(ts, stats, eps):
    """(start, end, censored) of the first run of bipodal saves (module docstring); start = end
    = NaN when no save is bipodal."""
    r1, r2 = stats[:, 0], stats[:, 1]
    bip = (r2 >= 1 - eps) & (r1 <= 1 - eps)
    if not bip.any():
        return np.nan, np.nan, False
    i = int(np.argmax(bip))
    after = ~bip[i:]
    if not after.any():
        return float(ts[i]), float(ts[-1]), True
    return float(ts[i]), float(ts[i + int(np.argmax(after))]), False


def growth_rate(ts, stats, start, end):
    """The least-squares slope of ln|δ| against t over the middle half of the phase [start, end]
    (the ends hold the clusters' formation and the merge); NaN for fewer than 4 saves."""
    if not end > start:
        return np.nan
    lo, hi = start + 0.25 * (end - start), start + 0.75 * (end - start)
    keep = (ts >= lo) & (ts <= hi) & (np.abs(stats[:, 2]) > 0)
    if keep.sum() < 4:
        return np.nan
    return float(np.polyfit(ts[keep], np.log(np.abs(stats[:, 2][keep])), 1)[0])


def uniform_circle(key, n: int, dtype=None):
    theta = jax.random.uniform(key, (n,), dtype=dtype, maxval=2 * np.pi)
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=1)


def backend(cfg: BipodalConfig, n: int):
    """The kernel for n tokens: exact below ``cfg.fast_from``, the NUFFT sum (error ``cfg.fast_tol``
    of the total mass) from there on. Planned for |x| <= 1: ``tp.Sphere`` shows its attention the
    normalized tokens at every Runge–Kutta stage."""
    if n >= cfg.fast_from:
        return tp.kernels.Fast(tol=cfg.fast_tol, radius=1.0)
    return tp.kernels.Exact()


def run_size(cfg: BipodalConfig, n: int):
    """(R₁, R₂, δ) at the saves for ``cfg.seeds`` uniform starts of n tokens, shape (seeds, saves, 3)."""
    attn = tp.SoftmaxAttention(jnp.eye(2), jnp.diag(jnp.asarray([cfg.a, cfg.b])), jnp.eye(2), 1.0,
                               backend=backend(cfg, n))
    ts = jnp.linspace(0.0, cfg.t1, cfg.saves)

    def one(key):
        x0 = uniform_circle(key, n)
        return tp.solve(tp.Sphere(attn), x0, t1=cfg.t1, dt0=0.05, stepsize_controller=pid(cfg.rtol, x0.dtype),
                        max_steps=200_000, saveat=diffrax.SaveAt(ts=ts, fn=order_parameters)).stats

    def seeds(keys):
        return jax.vmap(one)(keys)

    keys = jax.random.split(jax.random.key(n), cfg.seeds)
    return np.asarray(tp.runs.kept(seeds)(keys))


def compute(cfg: BipodalConfig, progress: bool = False) -> Result:
    ts = np.linspace(0.0, cfg.t1, cfg.saves)
    ns = np.asarray(cfg.ns, dtype=float)
    stats = np.stack([run_size(cfg, n) for n in cfg.ns])  # (N, S, saves, 3)
    start, end, censored, rate = (np.zeros(stats.shape[:2]) for _ in range(4))
    for i in range(len(cfg.ns)):
        for s in range(cfg.seeds):
            start[i, s], end[i, s], censored[i, s] = phase(ts, stats[i, s], cfg.eps)
            rate[i, s] = growth_rate(ts, stats[i, s], start[i, s], end[i, s])
    length = np.where(np.isnan(start), 0.0, end - start)
    fit = tp.statistics.fit_log_law(ns, length)
    lam = float(tp.theory.metastability.bipodal_escape_rate(max(cfg.a, cfg.b)))
    arrays = {
        "ns": ns, "ts": ts, "stats": stats, "start": start, "end": end, "length": length,
        "censored": censored.astype(bool), "rate": rate,
        "C": np.asarray(fit.slope), "D": np.asarray(fit.intercept),
        "C_ci": np.asarray(fit.slope_ci), "D_ci": np.asarray(fit.intercept_ci),
        "C_predicted": np.asarray(tp.theory.metastability.bipodal_log_slope(cfg.a, cfg.b)),
        "rate_measured": np.asarray(np.nanmedian(rate)), "rate_predicted": np.asarray(lam),
    }
    labelled = grid({"n": ns, "seed": np.arange(cfg.seeds)},
                    length=(("n", "seed"), length), start=(("n", "seed"), start), end=(("n", "seed"), end),
                    rate=(("n", "seed"), rate),
                    describe={"n": ("number of tokens", ""), "seed": ("uniform start", ""),
                              "length": ("bipodal phase length (0: never bipodal)", ""),
                              "start": ("first bipodal save (NaN: never)", ""),
                              "end": ("first later save that is not bipodal (t1 if censored)", ""),
                              "rate": ("least-squares slope of ln|δ| in the middle half of the phase", "")})
    return Result(arrays, {"phase": labelled})


def figures(res: Result, cfg: BipodalConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ns, length = res["ns"], res["length"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    logn = np.log(ns)
    for s in range(length.shape[1]):
        ax1.plot(logn, length[:, s], ".", color="0.6", ms=4)
    ax1.plot(logn, length.mean(1), "ko", label="mean over seeds")
    C, D, Cp = float(res["C"]), float(res["D"]), float(res["C_predicted"])
    lo, hi = res["C_ci"]
    ax1.plot(logn, D + C * logn, "b-", label=f"fit C ln n + D: C = {C:.1f} [{lo:.1f}, {hi:.1f}], D = {D:.1f}")
    ax1.plot(logn, length.mean(1).mean() + Cp * (logn - logn.mean()), "r--", label=f"predicted slope C = {Cp:.1f}")
    ax1.set_xlabel("ln n")
    ax1.set_ylabel("bipodal phase length")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    i = len(ns) - 1
    s = int(np.argmax(length[i]))  # the longest phase at the largest n
    ts, st = res["ts"], res["stats"][i, s]
    ax2.semilogy(ts, np.abs(st[:, 2]), label="|δ| (defect from antipodality)")
    ax2.semilogy(ts, 1 - st[:, 1], label="1 − R₂")
    ax2.semilogy(ts, np.maximum(1 - st[:, 0], 1e-16), label="1 − R₁")
    start, end = res["start"][i, s], res["end"][i, s]
    if np.isfinite(start):
        ax2.axvspan(start, end, color="0.9", label="bipodal phase")
        t = np.linspace(start, end, 50)
        ax2.semilogy(t, np.abs(st[np.searchsorted(ts, start), 2]) * np.exp(float(res["rate_predicted"]) * (t - start)),
                     "k:", label=f"e^{{λt}}, λ = {float(res['rate_predicted']):.3f} "
                                 f"(measured {float(res['rate_measured']):.3f})")
    ax2.set_ylim(1e-8, 4)  # below: round-off after the merge
    ax2.set_xlabel("t")
    ax2.set_title(f"n = {int(ns[i])}, seed {s}", fontsize=9)
    ax2.legend(fontsize=7)
    fig.suptitle(f"bipodal metastability on S¹: K = diag({cfg.a:g}, {cfg.b:g}), β = 1, {cfg.seeds} seeds per n")
    return [tp.plot.save_figure(fig, out_dir / "bipodal.png")]
