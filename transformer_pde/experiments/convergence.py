"""Mean-field convergence rate of the particle system (euclidean.md §3–4).

Softmax attention on R^d with Gaussian data: the mean field is the Gaussian closure
(euclidean.md §4a), so the distance of μ^n_t to μ_t is known without a reference run. For n
from 2^6 to 2^16 (several seeds each) the errors at the chosen times are fitted on a log-log
scale and compared with the Monte Carlo rate n^{-1/2} and the empirical-W_2 rate n^{-1/d}.
Tracers moved by the closure's affine field from the same initial samples split the error into
the sampling error carried by the exact flow and the error the interaction adds (coupling).
With ``model="sphere"`` the dynamics is SA on S^{d-1} (Q = K = V = I, uniform data): the uniform
law is stationary with a vanishing field, so the reference is exact (``reference="uniform"``,
the default: moments 0 and I/d, tracers at rest) or, for comparison, a large particle system
(``reference="particles"``, floored by its own n_ref^{-1/2}). With the fast kernel
(``backend="fast"``) this takes the study to n = 2²² (issue 13).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt, Interval

import transformer_pde as tp

from .._io import atomic_write_bytes
from .._lazy import jax, jnp
from ..runs.result import Result, grid
from ._base import Experiment, register
from ._common import kernel_backend
from ._options import Options, require_at_least
from ._progress import progress_bar

_LABELS = {
    "mean": "|mean − α|",
    "cov": "‖cov − Σ‖_F",
    "bw": "Bures–Wasserstein",
    "coupling": "coupling (dynamics-added)",
    "flow_bw": "BW of tracers (sampling)",
    "w2": "W₂ via Sinkhorn",
}


@dataclasses.dataclass(frozen=True)
class ConvergenceConfig(Options):
    model: Literal["gaussian", "sphere"] = "gaussian"
    """'gaussian' (softmax on R^d, Gaussian closure reference) or 'sphere' (SA on S^{d-1},
    uniform data, large-n reference)."""
    d: int = 3
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
    reference: Literal["uniform", "particles"] = "uniform"
    """model='sphere': the exact stationary reference ('uniform') or a 2^log2_n_ref-particle system."""
    log2_n_ref: int = 14
    """reference size for model='sphere', reference='particles'."""
    w2_epsilon: Annotated[float, Ge(0)] = 0.0
    """ε of the Sinkhorn W₂ (squared-distance units); 0: the model's own, 0.01 for 'gaussian' and
    0.05 for 'sphere' (two 64-samples of the uniform law on S² at ε = 0.01 may need more than the
    2000 Sinkhorn iterations allowed: the run stopped there)."""
    log2_w2_max: int = 12
    """compute the Sinkhorn W_2 only up to n = 2^this (O(n²) per Sinkhorn iteration)."""
    seed: int = 0
    """seed of the random attention matrices."""
    backend: Literal["exact", "fast", "auto"] = "exact"
    """kernel of the particle and reference runs (model='sphere' only: the fast kernel plans for
    bounded tokens): 'fast' takes n = 2^22 on a workstation (issue 13)."""
    tol: Annotated[float, Interval(gt=0, lt=1)] = 1e-8
    """planned error of the fast kernel, relative to the total mass."""

    @property
    def w2_scale(self) -> float:
        """The ε in use (``w2_epsilon``, or the model's own when 0)."""
        return self.w2_epsilon or {"gaussian": 0.01, "sphere": 0.05}[self.model]

    def validate(self):
        if self.backend != "exact" and self.model != "sphere":
            raise ValueError(f"backend={self.backend!r} needs bounded tokens: use model='sphere' "
                             "(Gaussian data on R^d are unbounded)")
        require_at_least(self, d=2 if self.model == "sphere" else 1)
        if not self.log2_n_min < self.log2_n_max:
            raise ValueError(f"need log2_n_min < log2_n_max, got {self.log2_n_min}, {self.log2_n_max}")


def setup(cfg: ConvergenceConfig):
    """The dynamics and the initial law of the study."""
    d = cfg.d
    if cfg.model == "sphere":
        dyn = tp.Sphere(tp.SoftmaxAttention.identity(d, cfg.beta, backend=kernel_backend(cfg.backend, cfg.tol)))
        if cfg.reference == "uniform":
            return dyn, tp.convergence.uniform_sphere_law(d)
        return dyn, lambda key, n: tp.uniform_sphere(key, n, d)
    kq, kg = jax.random.split(jax.random.key(cfg.seed))
    # euclidean.md §8: K = −Q and V = G Gᵀ make the covariance contract (no blow-up)
    Q = jax.random.uniform(kq, (d, d)) / np.sqrt(d)
    G = jax.random.normal(kg, (d, d)) / np.sqrt(d)
    dyn = tp.SoftmaxAttention(Q, -Q, 0.5 * G @ G.T, cfg.beta)
    mean = jnp.linspace(0.5, -0.5, d)
    cov = 0.5 * jnp.eye(d) + 0.1 * jnp.ones((d, d))
    return dyn, tp.Gaussian(mean, cov)


def compute(cfg: ConvergenceConfig, progress: bool = False) -> Result:
    dyn, law = setup(cfg)
    ns = tp.convergence.geometric_ns(cfg.log2_n_min, cfg.log2_n_max, cfg.log2_n_step)
    ts = np.linspace(0.0, cfg.t1, cfg.num_times)
    with progress_bar(progress, total=len(ns), desc="convergence (n)") as bar:
        def report(line):
            bar.update()
            bar.note(line)

        res = tp.convergence.convergence_study(dyn, law, ns, t1=cfg.t1, dt0=cfg.dt, ts=ts, seeds=range(cfg.seeds),
                                n_ref=2**cfg.log2_n_ref, w2_epsilon=cfg.w2_scale,
                                w2_max_n=2**cfg.log2_w2_max, progress=report)
    out = {"ns": res.ns, "ts": res.ts, "seeds": res.seeds}
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
                  slope=(("metric", "t"), slopes[..., 0]), slope_low=(("metric", "t"), slopes[..., 1]),
                  slope_high=(("metric", "t"), slopes[..., 2]))
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
    panels = [("bw", -1), ("coupling", -1), ("flow_bw", 0), ("w2", -1)]
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
    fig.suptitle(f"{cfg.model}: distance of μ^n_t to the mean field (d={d}, β={cfg.beta:g}, "
                 f"{cfg.seeds} seeds)")
    paths = [tp.plot.save_figure(fig, out_dir / "convergence.png")]

    # the tables: every error (n, seed, t) and every fitted slope
    buf = io.StringIO()
    buf.write("metric,n,seed,t,error\n")
    for k in res["metrics"]:
        e = res[f"err_{k}"]
        for i, n in enumerate(ns):
            for s in range(e.shape[1]):
                for t_i, t in enumerate(ts):
                    buf.write(f"{k},{n},{s},{t:.6g},{e[i, s, t_i]:.6e}\n")
    atomic_write_bytes(out_dir / "errors.csv", buf.getvalue().encode())
    buf = io.StringIO()
    buf.write("metric,t,slope,low,high,monte_carlo,empirical_w2\n")
    for r in rate_rows(res):
        buf.write(f"{r['metric']},{r['t']:.6g},{r['slope']:.4f},{r['low']:.4f},{r['high']:.4f},"
                  f"{float(res['rate_monte_carlo']):.4f},{float(res['rate_empirical_w2']):.4f}\n")
    atomic_write_bytes(out_dir / "rates.csv", buf.getvalue().encode())
    return paths


register(Experiment(
    "convergence", "mean-field convergence rate: n-particle error vs n (Gaussian closure reference)",
    ConvergenceConfig, compute, figures,
    tiny=dict(log2_n_min=4, log2_n_max=10, log2_n_step=3, seeds=12, t1=0.5, dt=0.1, num_times=2, log2_w2_max=0)))
