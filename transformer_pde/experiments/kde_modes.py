"""Modes of a Gaussian KDE (docs: math/attention.md#mean-shift-and-kde-modes) against √(β log β) and the clusters of
1-D attention.

For n i.i.d. N(0, 1) samples and bandwidth β^{-1/2}, E #modes = Θ(√(β log β)) when
n^c ≲ β ≲ n^{2−c}. We count modes (sign changes + → − of P̂'; the authors' code counts minima,
one fewer), fit the scaling, and compare with the number of metastable clusters of the
blurring mean shift (self-attention on R with a Gaussian kernel) started from the samples.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.programs import compile_program
from ..runs.result import Result, grid
from ._common import finish_panel, import_end_modules_meanwhile
from .configs.kde_modes import KDEModesConfig


def kde_mode_fit(betas, counts):
    r"""Least-squares fits of log E#modes against log β and against log(β log β).

    Returns ``{"slope_beta", "slope_beta_log_beta", "const"}``: for the √(β log β) law the
    second slope is 1/2 and the first 1/2 + 1/(2 log β) (≈ 0.6 for β ~ 100); ``const`` is
    C in E#modes ≈ C(β log β)^{1/2} (geometric mean of the ratios).
    """
    b = np.asarray(betas, dtype=float)
    c = np.asarray(counts, dtype=float)
    s1 = np.polyfit(np.log(b), np.log(c), 1)[0]
    s2 = np.polyfit(np.log(b * np.log(b)), np.log(c), 1)[0]
    const = float(np.exp(np.mean(np.log(c) - 0.5 * np.log(b * np.log(b)))))
    return {"slope_beta": float(s1), "slope_beta_log_beta": float(s2), "const": const}


def save_times(cfg: KDEModesConfig):
    """The mean shift's saved times 0, t/2, t, 2t (t = ``cfg.t_dynamics``), in JAX's default float
    (a NumPy array: concrete, so checked when traced, inside the program too)."""
    dtype = jax.dtypes.canonicalize_dtype(np.float64)
    return np.asarray([0.0, 0.5 * cfg.t_dynamics, cfg.t_dynamics, 2 * cfg.t_dynamics], dtype=dtype)


def mean_shift_states(cfg: KDEModesConfig, x0):
    """The blurring mean shift (``tp.MeanShift``) from the tokens ``x0``, saved at :func:`save_times`,
    for each β of ``cfg.betas_dynamics`` (a ``lax.map``), and each run's ``nonfinite_time`` (inf
    where it stayed finite): one program, which :func:`compute` keeps between processes (a second
    run does not import diffrax). Its inputs are checked before it (the β by the config, x0 drawn
    from N(0, 1)): it holds no runtime check, so a NaN or inf is reported as a value."""
    import diffrax
    import equinox as eqx

    tp.runs.finite_by_construction([x0])
    ts = save_times(cfg)
    t1 = float(ts[-1])
    model = tp.MeanShift(cfg.betas_dynamics[0])

    def one(beta):
        sol = tp.solve(eqx.tree_at(lambda m: m.beta, model, beta), x0, t1=t1,  # β > 1: the config
                       dt0=cfg.dt, solver=diffrax.Euler(), saveat=ts, throw=False)
        return sol.xs, sol.nonfinite_time

    return jax.lax.map(one, jnp.asarray(cfg.betas_dynamics, dtype=model.beta.dtype))


def compute(cfg: KDEModesConfig, progress: bool = False) -> Result:
    rng = np.random.default_rng(cfg.seed)
    betas = np.asarray(cfg.betas)
    modes = np.zeros((len(betas), cfg.runs), dtype=int)
    minima = np.zeros_like(modes)
    for r in range(cfg.runs):
        X = rng.standard_normal(cfg.n)
        for a, b in enumerate(betas):
            modes[a, r], minima[a, r] = tp.diagnostics.kde_critical_points(X, b)
    fit = kde_mode_fit(betas, modes.mean(1))
    # metastable clusters of the 1-D attention dynamics, against the modes of the same samples
    bd = np.asarray(cfg.betas_dynamics)
    X = rng.standard_normal(cfg.n_dynamics)
    ts = save_times(cfg)
    x0 = jnp.asarray(X)[:, None]
    program = compile_program(mean_shift_states, (cfg,), (x0,))
    import_end_modules_meanwhile()  # while the program runs, which does not hold the GIL
    states, nonfinite = (np.asarray(a) for a in program(x0))
    tp.runs.raise_if_nonfinite("kde-modes", nonfinite, {"beta": bd}, "the step dt is too large")
    modes_dyn = np.asarray([tp.diagnostics.kde_modes(X, b) for b in bd], dtype=int)
    clusters = np.asarray([[tp.diagnostics.gap_clusters(x, cfg.cluster_gap / np.sqrt(b)) for x in xs]
                           for b, xs in zip(bd, states)], dtype=int)
    fit_clusters = kde_mode_fit(bd, clusters[:, 2])
    arrays = {
        "betas": betas, "modes": modes, "minima": minima, "mean_modes": modes.mean(1),
        "slope_beta": np.asarray(fit["slope_beta"]),
        "slope_beta_log_beta": np.asarray(fit["slope_beta_log_beta"]),
        "const": np.asarray(fit["const"]),
        "betas_dynamics": bd, "ts_dynamics": np.asarray(ts), "clusters": clusters,
        "modes_dynamics": modes_dyn,
        "cluster_slope_beta_log_beta": np.asarray(fit_clusters["slope_beta_log_beta"]),
    }
    grids = {"modes": grid({"beta": betas, "run": np.arange(cfg.runs)}, modes=(("beta", "run"), modes),
                           minima=(("beta", "run"), minima),
                           describe={
                               "beta": ("β of the Gaussian KDE (bandwidth β^{-1/2})", ""),
                               "run": ("index of the draw of n N(0, 1) samples", ""),
                               "modes": ("modes of the Gaussian KDE (sign changes + → − of its derivative)", ""),
                               "minima": ("local minima of the Gaussian KDE", "")}),
             "dynamics": grid({"beta": bd, "t": arrays["ts_dynamics"]}, clusters=(("beta", "t"), clusters),
                              modes=(("beta",), modes_dyn),
                              describe={
                                  "beta": ("inverse temperature β of the mean shift (KDE bandwidth β^{-1/2})", ""),
                                  "t": ("time t of the blurring mean shift", ""),
                                  "clusters": ("clusters of the tokens (split where consecutive gaps exceed "
                                               "cluster_gap β^{-1/2})", ""),
                                  "modes": ("modes of the Gaussian KDE of the starting samples", "")})}
    return Result(arrays, grids)


def figures(res: Result, cfg: KDEModesConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    ax = axes[0]
    b = res["betas"]
    ax.errorbar(b, res["mean_modes"], yerr=res["modes"].std(1), fmt="o", capsize=3,
                label=f"E #modes (n={cfg.n}, {cfg.runs} runs)")
    ax.plot(b, res["minima"].mean(1), "x", color="C3", label="#minima (authors' sign slip)")
    bb = np.geomspace(b.min(), b.max(), 60)
    ax.plot(bb, float(res["const"]) * np.sqrt(bb * np.log(bb)), "k--",
            label=f"{float(res['const']):.2f}·√(β log β)")
    finish_panel(ax, grid="both", xscale="log", yscale="log", xlabel="β",
                 title=f"KDE modes: slope vs β log β = {float(res['slope_beta_log_beta']):.2f}, "
                       f"vs β = {float(res['slope_beta']):.2f}")
    ax = axes[1]
    bd = res["betas_dynamics"]
    ax.plot(bd, res["modes_dynamics"], "o-", label="modes of the initial KDE")
    for k in range(1, len(res["ts_dynamics"])):
        ax.plot(bd, res["clusters"][:, k], "s--", ms=4,
                label=f"mean-shift clusters, t={float(res['ts_dynamics'][k]):g}")
    finish_panel(ax, grid="both", xscale="log", yscale="log", xlabel="β",
                 title=f"1-D self-attention (mean shift), n={cfg.n_dynamics}")
    return [tp.plot.save_figure(fig, out_dir / "kde_modes.png", trim=False)]  # laid out: drawn once
