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

import dataclasses
import io
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt, Interval

import transformer_pde as tp

from .._lazy import jax, jnp
from ..runs.result import Result, grid
from ._base import Experiment, register
from ._common import EUCLIDEAN_ATTENTIONS, kernel_backend
from ._options import Options, require_at_least, sizes
from ._progress import progress_bar

_LABELS = {
    "mean": "|mean − α|",
    "cov": "‖cov − Σ‖_F",
    "bw": "Bures–Wasserstein",
    "coupling": "coupling (dynamics-added)",
    "flow_bw": "BW of tracers (sampling)",
    "w1": "W₁ (exact, 1-D)",
    "w2": "W₂ (exact on R, else Sinkhorn)",
}


@dataclasses.dataclass(frozen=True)
class ConvergenceConfig(Options):
    model: Literal["gaussian", "sphere", "circle", "cap"] = "gaussian"
    """'gaussian' (Gaussian data on R^d, Gaussian closure reference), 'sphere' (uniform data on
    S^{d-1}, stationary), 'circle' (1 + perturbation·cos(mode·θ) on S¹, moves) or 'cap' (a von
    Mises–Fisher cap of concentration kappa on S², moves); the last two use the quadrature
    reference."""
    attention: Literal["softmax", "l2", "multihead", "sinkhorn", "sigmoid"] = "softmax"
    """The attention (on R^d: random Q, K = −Q, V = G Gᵀ/2; on spheres: Q = K = V = I); multihead
    splits into 2 heads (1 when d is odd)."""
    d: int = 3
    """Dimension of the tokens (model='circle': 2, 'cap': 3)."""
    beta: float = 1.0
    log2_n_min: Annotated[int, Ge(1)] = 6
    """Smallest particle number, n = 2^log2_n_min."""
    log2_n_max: int = 16
    """Largest particle number, n = 2^log2_n_max (above log2_n_min)."""
    log2_n_step: Annotated[int, Ge(1)] = 1
    """Step of log2 n between the particle numbers of the study."""
    seeds: Annotated[int, Ge(2)] = 4  # >= 2: confidence bands
    t1: Annotated[float, Gt(0)] = 1.0
    dt: Annotated[float, Gt(0)] = 0.05
    num_times: Annotated[int, Ge(2)] = 3
    """Times at which the errors are measured, evenly spaced from 0 to t1."""
    reference: Literal["exact", "uniform", "particles", "quadrature"] = "exact"
    """'exact': the Gaussian closure (gaussian), the stationary uniform law (sphere; 'uniform' is
    the same), the quadrature rule (circle, cap); 'particles': a 2^log2_n_ref-particle system;
    'quadrature': a quadrature rule evolved as weighted tokens (any attention; R^d for d <= 3)."""
    log2_n_ref: int = 14
    """reference size for reference='particles'."""
    order: Annotated[int, Ge(0)] = 0
    """order of the quadrature reference (0: the law's default: 256 nodes on S¹, 24 on S², 24/12/8
    nodes per axis on R^1/R^2/R^3); its error is estimated against the coarser rule."""
    perturbation: float = 0.2
    """model='circle': ε of the density 1 + ε cos(mode·θ), |ε| < 1."""
    mode: Annotated[int, Ge(1)] = 2
    """model='circle': the frequency k of the perturbation."""
    kappa: Annotated[float, Gt(0)] = 3.0
    """model='cap': the von Mises–Fisher concentration."""
    w2_epsilon: Annotated[float, Ge(0)] = 0.0
    """ε of the Sinkhorn W₂ relative to the data's scale (ε = w2_epsilon · tr Cov of the reference
    at each time); 0: 0.05 (at 0.01 ℓ² attention on Gaussian data in R² does not converge in 2000
    iterations, issue 22). Not used on S¹ and R, where the distances are exact."""
    w2_max_iterations: Annotated[int, Ge(1)] = 2000
    """Sinkhorn iteration budget; an unconverged distance is NaN, counted in the report."""
    log2_w2_max: int = 12
    """compute the Sinkhorn W_2 only up to n = 2^this (O(n²) per Sinkhorn iteration)."""
    leave_distance: Annotated[float, Gt(0)] = 0.1
    """n leaves the mean field at the first time its error (the primary distance, geometric mean
    over seeds) exceeds this (reported per n; NaN: not by t1)."""
    seed: int = 0
    """seed of the random attention matrices."""
    backend: Literal["exact", "fast", "auto"] = "exact"
    """kernel of the particle and reference runs (spheres only, softmax: the fast kernel plans
    for bounded tokens): 'fast' takes n = 2^22 on a workstation (issue 13)."""
    tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-8
    """planned error of the fast kernel, relative to the total mass."""

    @property
    def w2_scale(self) -> float:
        """The relative ε in use (``w2_epsilon``, or 0.05 when 0)."""
        return self.w2_epsilon or 0.05

    @property
    def on_sphere(self) -> bool:
        return self.model != "gaussian"

    def validate(self):
        if self.backend != "exact" and not (self.on_sphere and self.attention == "softmax"):
            raise ValueError(f"backend={self.backend!r} needs bounded tokens and softmax attention: use "
                             "model='sphere', 'circle' or 'cap' with attention='softmax'")
        require_at_least(self, d=2 if self.on_sphere else 1)
        fixed = {"circle": 2, "cap": 3}.get(self.model)
        if fixed is not None and self.d != fixed:
            raise ValueError(f"model={self.model!r} lives in R^{fixed}: pass d={fixed}, got d={self.d}")
        if self.model == "circle" and not abs(self.perturbation) < 1:
            raise ValueError(f"perturbation must satisfy |ε| < 1 (a positive density), got {self.perturbation}")
        if self.reference == "uniform" and self.model != "sphere":
            raise ValueError("reference='uniform' is the stationary law of model='sphere'")
        if self.reference == "quadrature" and self.model == "sphere":
            raise ValueError("model='sphere' is stationary: its exact reference is reference='exact'")
        if self.reference == "quadrature" and self.model == "gaussian" and self.d > 3:
            raise ValueError(f"the quadrature reference on R^d needs d <= 3, got d={self.d}")
        if not self.log2_n_min < self.log2_n_max:
            raise ValueError(f"need log2_n_min < log2_n_max, got {self.log2_n_min}, {self.log2_n_max}")

    def footprint(self):
        # the largest study runs 2^log2_n_max tokens per seed; Sinkhorn holds n x n costs up to 2^log2_w2_max
        def two_to(name):
            return (f"2^{name}", 2 ** min(max(getattr(self, name), 0), 62))  # 2^62: over any budget

        w2 = ("2^min(log2_w2_max, log2_n_max)", 2 ** min(max(min(self.log2_w2_max, self.log2_n_max), 0), 62))
        return {"tokens of the largest runs": sizes(self, "seeds", two_to("log2_n_max"), "d"),
                "reference tokens": sizes(self, two_to("log2_n_ref"), "d"),
                "Sinkhorn costs": sizes(self, w2, w2)}


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


register(Experiment(
    "convergence", "mean-field convergence: n-particle error vs n and t (closure, stationary or quadrature reference)",
    ConvergenceConfig, compute, figures,
    tiny=dict(log2_n_min=4, log2_n_max=10, log2_n_step=3, seeds=12, t1=0.5, dt=0.1, num_times=2, log2_w2_max=0)))


@dataclasses.dataclass(frozen=True)
class MovingConvergenceConfig(ConvergenceConfig):
    """The study of a law that moves, at its own default size: 1 + 0.2 cos 2θ on S¹ under SA at
    β = 9 (the uniform law is unstable: the perturbation grows) against the quadrature reference
    (exact W₁), n = 2⁸ … 2¹⁶, until t = 3. n = 2²⁰ is ``--log2-n-max 20`` (fast kernel above the
    crossover; about 16x the cost of the n = 2¹⁶ share, estimated in benchmarks/README.md)."""
    model: Literal["gaussian", "sphere", "circle", "cap"] = "circle"
    d: int = 2
    beta: float = 9.0
    log2_n_min: Annotated[int, Ge(1)] = 8
    log2_n_max: int = 16
    log2_n_step: Annotated[int, Ge(1)] = 2
    t1: Annotated[float, Gt(0)] = 3.0
    dt: Annotated[float, Gt(0)] = 0.1
    num_times: Annotated[int, Ge(2)] = 7
    backend: Literal["exact", "fast", "auto"] = "auto"


register(Experiment(
    "convergence-moving", "mean-field convergence of a law that moves (S¹, β = 9): distance vs n and t, and when "
    "each n leaves the mean field", MovingConvergenceConfig, compute, figures,
    tiny=dict(log2_n_min=4, log2_n_max=8, log2_n_step=4, seeds=2, t1=0.4, dt=0.1, num_times=2, order=64,
              log2_n_ref=4)))  # n_ref is the particle reference's only: n > n_ref is fine here
