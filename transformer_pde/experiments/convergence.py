"""Mean-field convergence rate of the particle system (docs: math/mean_field.md#mean-field-convergence).

Softmax attention on R^d with Gaussian data: the mean field is the Gaussian closure
(docs: math/gaussian.md#moment-equations), so the distance of μ^n_t to μ_t is known without a reference run. For n
from 2^6 to 2^16 (several seeds each) the errors at the chosen times are fitted on a log-log
scale and compared with the Monte Carlo rate n^{-1/2} and the empirical-W_2 rate n^{-1/d}.
Tracers moved by the closure's affine field from the same initial samples split the error into
the sampling error carried by the exact flow and the error the interaction adds (coupling).
With ``model="sphere"`` the dynamics is SA on S^{d-1} (Q = K = V = I, uniform data): the uniform
law is stationary with a vanishing field, so the reference is exact (``reference="uniform"``,
the default: moments 0 and I/d, tracers at rest) or, for comparison, a large particle system
(``reference="particles"``, floored by its own n_ref^{-1/2}). With the fast kernel
(``backend="fast"``) this takes the study to n = 2²² (issue 13).

Any attention of the library (``attention``: softmax, ℓ², multi-head, Sinkhorn, sigmoid), and
laws that move (issue 22): ``model="circle"`` (1 + ε cos kθ on S¹; at every β > 0 the uniform law
is unstable under SA and the perturbation grows into clusters) and ``model="cap"`` (a von
Mises–Fisher cap on S²), against the deterministic reference (a quadrature rule evolved as
weighted tokens, docs: math/mean_field.md; ``reference="quadrature"`` also on R^d, d <= 3, for any
attention). Distances: exact W₁ on S¹ and W₁, W₂ on R (no ε); Sinkhorn W₂ elsewhere with ε
relative to tr Cov of the reference (stated in ``report.txt``), unconverged values NaN and
counted. Every error comes with the estimated error of the reference in that measurement. The
growth in t at fixed n is fitted (log error linear in t) and the time each n leaves the mean
field (its error first exceeds ``leave_distance``) is reported. The threshold is absolute: in the
linear regime the error is n^{-1/2} g(t) with g independent of n, so a threshold relative to the
error at t = 0 is crossed at one time for every n or never (measured on S¹ at β = 9 from
1 + 0.2 cos 2θ, n = 2⁶…2¹⁰: W₁ grows 2x–3x by t = 3, so x10 never fired), while an absolute one is
crossed later the larger n (W₁ > 0.1: n = 2⁶ at t = 0, 2⁸ at t ≈ 1.1, 2¹⁰ at t ≈ 2.5).
"""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import EUCLIDEAN_ATTENTIONS, kernel_backend
from ._progress import progress_bar
from .configs.convergence import ConvergenceConfig

_LABELS = {
    "mean": "|mean − α|",
    "cov": "‖cov − Σ‖_F",
    "bw": "Bures–Wasserstein",
    "coupling": "coupling (dynamics-added)",
    "flow_bw": "BW of tracers (sampling)",
    "w1": "W₁ (exact, 1-D)",
    "w2": "W₂ (exact on R, else Sinkhorn)",
}


def setup(cfg: ConvergenceConfig):
    """The dynamics and the initial law of the study."""
    d = cfg.d
    make = EUCLIDEAN_ATTENTIONS[cfg.attention]
    if cfg.on_sphere:
        kwargs = {"backend": kernel_backend(cfg.backend, cfg.tol)} if cfg.backend != "exact" else {}
        eye = jnp.eye(d)
        dyn = tp.Sphere(make(eye, eye, eye, cfg.beta, **kwargs))
        if cfg.model == "circle":
            return dyn, tp.convergence.perturbed_circle_law(cfg.perturbation, cfg.mode, order=cfg.order or 256)
        if cfg.model == "cap":
            return dyn, tp.convergence.vmf_cap_law([0.0, 0.0, 1.0], cfg.kappa, order=cfg.order or 24)
        if cfg.reference in ("exact", "uniform"):
            return dyn, tp.convergence.uniform_sphere_law(d)
        return dyn, lambda key, n: tp.uniform_sphere(key, n, d)
    kq, kg = jax.random.split(jax.random.key(cfg.seed))
    # (docs: math/gaussian.md#the-authors-experiments) K = −Q and V = G Gᵀ make the covariance contract (no blow-up)
    Q = jax.random.uniform(kq, (d, d)) / np.sqrt(d)
    G = jax.random.normal(kg, (d, d)) / np.sqrt(d)
    dyn = make(Q, -Q, 0.5 * G @ G.T, cfg.beta)
    mean = jnp.linspace(0.5, -0.5, d)
    cov = 0.5 * jnp.eye(d) + 0.1 * jnp.ones((d, d))
    law = tp.Gaussian(mean, cov)
    if cfg.reference == "quadrature":
        return dyn, tp.convergence.gaussian_quadrature_law(law, order=cfg.order or {1: 24, 2: 12, 3: 8}[d])
    if cfg.reference == "particles":
        return dyn, law.sample
    return dyn, law


def leave_times(ts, errors, threshold: float) -> np.ndarray:
    """The first time the geometric mean over seeds of ``errors (N, S, T)`` exceeds
    ``threshold``, per n (NaN: never within ``ts``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        gm = np.exp(np.nanmean(np.log(errors), axis=1))
    out = np.full(errors.shape[0], np.nan)
    for i, g in enumerate(gm):
        above = np.nonzero(g > threshold)[0]
        if above.size:
            out[i] = ts[above[0]]
    return out


def growth_rates(ts, errors) -> np.ndarray:
    """Slope of log(error) against t per n (geometric mean over seeds; the exponential growth
    of the distance to the mean field at fixed n), NaN where fewer than two finite positive
    times."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.nanmean(np.log(errors), axis=1)
    out = np.full(errors.shape[0], np.nan)
    for i, row in enumerate(lg):
        keep = np.isfinite(row)
        if keep.sum() >= 2:
            out[i] = np.polyfit(ts[keep], row[keep], 1)[0]
    return out


def primary_metric(cfg: ConvergenceConfig) -> str:
    """The distance the figures lead with: exact W₁ on S¹ and R, W₂ otherwise where computed
    (bw when Sinkhorn is skipped)."""
    if cfg.model == "circle" or (cfg.model == "sphere" and cfg.d == 2) or (cfg.model == "gaussian" and cfg.d == 1):
        return "w1"
    return "bw"


def compute(cfg: ConvergenceConfig, progress: bool = False) -> Result:
    # the quadrature reference resolves the mean field to ~1e-6 and the fast kernel plans for
    # 1e-8: in float32 its rounding alone is ~1e-3 of the field, so these studies run in float64
    with jax.enable_x64(_uses_quadrature(cfg)):
        return _compute(cfg, progress)


def _uses_quadrature(cfg: ConvergenceConfig) -> bool:
    return cfg.model in ("circle", "cap") or cfg.reference == "quadrature"


def _compute(cfg: ConvergenceConfig, progress: bool) -> Result:
    dyn, law = setup(cfg)
    ns = tp.convergence.geometric_ns(cfg.log2_n_min, cfg.log2_n_max, cfg.log2_n_step)
    ts = np.linspace(0.0, cfg.t1, cfg.num_times)
    with progress_bar(progress, total=len(ns), desc="convergence (n)") as bar:
        def report(line):
            bar.update()
            bar.note(line)

        res = tp.convergence.convergence_study(dyn, law, ns, t1=cfg.t1, dt0=cfg.dt, ts=ts, seeds=range(cfg.seeds),
                                n_ref=2**cfg.log2_n_ref if cfg.reference == "particles" else None,
                                w2_epsilon=cfg.w2_scale,
                                w2_max_n=2**cfg.log2_w2_max, w2_max_iterations=cfg.w2_max_iterations,
                                progress=report)
    out = {"ns": res.ns, "ts": res.ts, "seeds": res.seeds}
    for k in tp.convergence.METRICS:
        out[f"ref_{k}"] = res.reference_error[k]
    out["unconverged"] = res.unconverged
    out["reference"] = np.asarray(str(res.reference))
    out["distance"] = np.asarray(str(res.distance))
    main = primary_metric(cfg)
    out["primary"] = np.asarray(main)
    out["leave_time"] = leave_times(res.ts, res.errors[main], cfg.leave_distance)
    out["growth_rate"] = growth_rates(res.ts, res.errors[main])
    slopes = np.full((len(tp.convergence.METRICS), ts.size, 3), np.nan)  # (metric, time, [slope, low, high])
    for m_i, k in enumerate(tp.convergence.METRICS):
        out[f"err_{k}"] = res.errors[k]
        for t_i in range(ts.size):
            e = res.errors[k][:, :, t_i]
            keep = np.all(np.isfinite(e) & (e > 0), axis=1)
            if keep.sum() >= 2:
                f = tp.statistics.fit_rate(res.ns[keep], e[keep])
                slopes[m_i, t_i] = (f.slope, *f.slope_ci)
    out["slopes"] = slopes
    out["metrics"] = np.asarray(tp.convergence.METRICS)
    rr = tp.convergence.reference_rates(res.dim)
    out["rate_monte_carlo"] = np.asarray(rr["monte_carlo"])
    out["rate_empirical_w2"] = np.asarray(rr["empirical_w2"])
    errors = grid({"metric": out["metrics"], "n": out["ns"], "seed": out["seeds"], "t": out["ts"]},
                  error=(("metric", "n", "seed", "t"), np.stack([out[f"err_{k}"] for k in tp.convergence.METRICS])),
                  reference_error=(("metric", "n", "seed", "t"),
                                   np.stack([out[f"ref_{k}"] for k in tp.convergence.METRICS])),
                  slope=(("metric", "t"), slopes[..., 0]), slope_low=(("metric", "t"), slopes[..., 1]),
                  slope_high=(("metric", "t"), slopes[..., 2]),
                  describe={
                      "metric": ("measure of the error of μ^n_t against the mean field μ_t "
                                 "(tp.convergence.METRICS)", ""),
                      "n": ("number of particles n", ""),
                      "seed": ("seed of the initial samples", ""),
                      "t": ("time t of the dynamics", ""),
                      "error": ("error of the n-particle system against the mean-field reference in the metric "
                                "(NaN where not computed)", ""),
                      "reference_error": ("estimated error of the reference in each error (0: exact up to "
                                          "the time stepping; NaN: not estimated)", ""),
                      "slope": ("fitted exponent of error ∝ n^slope (geometric mean over seeds)", ""),
                      "slope_low": ("lower end of the 95% bootstrap interval of the slope", ""),
                      "slope_high": ("upper end of the 95% bootstrap interval of the slope", "")})
    return Result(out, {"errors": errors})


def rate_rows(res: Result) -> list[dict]:
    rows = []
    for m_i, k in enumerate(res["metrics"]):
        for t_i, t in enumerate(res["ts"]):
            s, lo, hi = res["slopes"][m_i, t_i]
            if np.isfinite(s):
                rows.append({"metric": str(k), "t": float(t), "slope": s, "low": lo, "high": hi})
    return rows


def figures(res: Result, cfg: ConvergenceConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ns, ts = res["ns"], res["ts"]
    d = cfg.d
    main = str(res["primary"])
    panels = [("bw", -1), ("coupling", -1), ("flow_bw", 0), ("w1" if main == "w1" else "w2", -1)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 4.0), layout="constrained")
    for ax, (k, t_i) in zip(axes, panels):
        e = res[f"err_{k}"][:, :, t_i]
        keep = np.all(np.isfinite(e) & (e > 0), axis=1)
        ax.set_title(f"{_LABELS[k]}, t = {ts[t_i]:.3g}", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.grid(alpha=0.3, which="both")
        if keep.sum() < 2:
            ax.text(0.5, 0.5, "not computed", transform=ax.transAxes, ha="center")
            continue
        nk, ek = ns[keep], e[keep]
        ax.plot(np.repeat(nk, ek.shape[1]), ek.ravel(), ".", color="0.6", ms=3, label="seeds")
        gm = np.exp(np.log(ek).mean(axis=1))
        ax.plot(nk, gm, "o", color="C0", ms=4, label="geometric mean")
        f = tp.statistics.fit_rate(nk, ek)
        lo, hi = f.band(nk)
        ax.fill_between(nk, lo, hi, color="C0", alpha=0.2, label=f"{int(f.level * 100)}% band")
        ax.plot(nk, f.predict(nk), "-", color="C0",
                label=f"fit n^{f.slope:.2f} [{f.slope_ci[0]:.2f}, {f.slope_ci[1]:.2f}]")
        for rate, style, name in ((-0.5, "--", "n^-1/2"), (-1.0 / max(d, 2), ":", f"n^-1/{max(d, 2)}")):
            ax.plot(nk, gm[0] * (nk / nk[0]) ** rate, style, color="k", lw=1, label=name)
        ax.legend(fontsize=7)
    fig.suptitle(f"{cfg.model}, {cfg.attention}: distance of μ^n_t to the mean field (d={d}, β={cfg.beta:g}, "
                 f"{cfg.seeds} seeds; reference {res['reference']})")
    paths = [tp.plot.save_figure(fig, out_dir / "convergence.png")]

    # distance against t for every n, with the reference's own error
    e, r = res[f"err_{main}"], res[f"ref_{main}"]
    fig, ax = plt.subplots(figsize=(6.0, 4.2), layout="constrained")
    colors = plt.cm.viridis(np.linspace(0, 1, len(ns)))
    with np.errstate(divide="ignore", invalid="ignore"):
        gm, rm = np.exp(np.nanmean(np.log(e), axis=1)), np.nanmax(r, axis=1)
    for i, n in enumerate(ns):
        ax.plot(ts, gm[i], "o-", color=colors[i], ms=3, label=f"n = 2^{int(np.log2(n))}")
    if np.isfinite(rm).any() and np.nanmax(rm) > 0:
        ax.plot(ts, np.nanmax(rm, axis=0), "k--", lw=1, label="reference error (est.)")
    ax.set_yscale("log")
    ax.set_xlabel("t")
    ax.set_ylabel(_LABELS[main])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{cfg.model}, {cfg.attention}, β={cfg.beta:g}: distance to the mean field vs t", fontsize=10)
    paths.append(tp.plot.save_figure(fig, out_dir / "distance_vs_t.png"))

    lines = [f"reference: {res['reference']}", f"distance: {res['distance']}",
             f"unconverged Sinkhorn distances (NaN): {int(np.sum(res['unconverged']))} "
             f"(per n: {np.asarray(res['unconverged']).tolist()})",
             f"{main} at t = {ts[-1]:.3g}, geometric mean over seeds, with the estimated reference error:"]
    for i, n in enumerate(ns):
        lines.append(f"  n = {n:>8d}: {gm[i, -1]:.4g}  (reference error <= {np.nanmax(r[i, :, -1]):.2g}); "
                     f"growth rate in t {res['growth_rate'][i]:.3g}; leaves the mean field ({main} > {cfg.leave_distance:g}) "
                     f"at t = {res['leave_time'][i]:.3g}")
    Result.write_table(out_dir, "report.txt", "\n".join(lines) + "\n")

    # the tables: every error (n, seed, t) and every fitted slope
    buf = io.StringIO()
    buf.write("metric,n,seed,t,error,reference_error\n")
    for k in res["metrics"]:
        e, r = res[f"err_{k}"], res[f"ref_{k}"]
        for i, n in enumerate(ns):
            for s in range(e.shape[1]):
                for t_i, t in enumerate(ts):
                    buf.write(f"{k},{n},{s},{t:.6g},{e[i, s, t_i]:.6e},{r[i, s, t_i]:.3e}\n")
    Result.write_table(out_dir, "errors.csv", buf.getvalue())
    buf = io.StringIO()
    buf.write("metric,t,slope,low,high,monte_carlo,empirical_w2\n")
    for r in rate_rows(res):
        buf.write(f"{r['metric']},{r['t']:.6g},{r['slope']:.4f},{r['low']:.4f},{r['high']:.4f},"
                  f"{float(res['rate_monte_carlo']):.4f},{float(res['rate_empirical_w2']):.4f}\n")
    Result.write_table(out_dir, "rates.csv", buf.getvalue())
    return paths
