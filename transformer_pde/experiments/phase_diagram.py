"""Phase diagram of clustering on the circle (GKPR/GLPR; docs: math/sphere.md#metastability).

SA with Q = K = V = I on S^1 (d = 2), n = 32 tokens, a batch of uniform starts, over a grid
of β (vmapped: one compiled program for the whole grid and batch) and times t. For each
(β, t) we record the mean over the batch of

* the fraction of ordered pairs i ≠ j with ⟨x_i, x_j⟩ > 0.999 (the authors' "density"),
* the number of clusters (single linkage at the same threshold).

Small β: one cluster by t ≈ 10; large β: long-lived metastable clusters, so the fraction at
t = 30 falls with β. The default size matches the authors' run (docs: math/sphere.md#published-runs)
(batch 256, step 0.1, their post-LN layer x ← N(x + h Γ(x)), ``scheme = "post-ln"``; the
projected layer x ← N(x + h P⊥Γ(x)) is ``scheme = "projected"``); the published fractions are
saved alongside ours (``published_*``) and drawn on the figure. The (β, t) grids are saved
labelled (``results.nc``: group ``grid`` with dims beta × t, group ``histograms`` with the token
angles of the first start at the grid β nearest each published β, dims beta × t × token).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.programs import compile_program
from ..runs.result import Result, grid
from ._common import circle_angles, clustered_pairs_described, import_end_modules_meanwhile, model_dynamics
from .configs.phase_diagram import PhaseDiagramConfig

# the published runs (docs: math/sphere.md#published-runs): fraction of clustered pairs, rows β,
# columns t = 7.5 and 30.
PUBLISHED_BETAS = np.array([1.0, 11 / 3, 19 / 3, 9.0])
PUBLISHED_TIMES = np.array([7.5, 30.0])
PUBLISHED_FRACTION = np.array([[0.50, 1.00], [0.39, 0.53], [0.31, 0.41], [0.28, 0.34]])


def _dynamics(cfg, beta):
    return model_dynamics("SA", cfg.d, beta, cfg.scheme)


def run_grid(cfg: PhaseDiagramConfig, betas, keys):
    """``(fraction, clusters, nonfinite_time)`` of the run from every start key at every β: the
    statistics at every save, leading axes (β, start, save), and when a run's tokens became NaN or
    inf (inf: never), axes (β, start) (traced inside ``_summaries``'s jit).

    The authors' layer map itself (``tp.layers``, explicit Euler of step dt with their post-LN),
    the statistics taken at the saves inside the loop (no state is kept). Through ``tp.solve``'s
    diffrax Euler the grid's program traced for 0.96 s and compiled for 0.83 s at the peers'
    settings, as scans about 0.45 and 0.75 s (the histograms' run included); float64 outputs are
    the same bits, float32 ones moved by round-off (diffrax's step is t_{k+1} − t_k, the layer's dt).
    The (β, start) pairs are one batch, so one vmap: a vmap over β of a vmap over starts batches the
    loops twice.

    The program holds no runtime check (a host callback, which keeps a program out of JAX's
    persistent compilation cache): β is a linspace of endpoints checked finite in float32 (``Options``), the
    starts are normalizations (``tp.uniform_sphere``), and the layers report a NaN as a value
    (``throw=False``) that ``compute`` raises on."""

    def stats(t, x, args):
        # float counts: one dtype for the means
        return (tp.diagnostics.clustered_pair_fraction(x, cfg.threshold),
                tp.diagnostics.cluster_count(x, cfg.threshold).astype(x.dtype))

    from ..runs import finite_by_construction as cover_finiteness

    def one(beta, key):
        cover_finiteness([beta])  # a linspace of the config's endpoints, checked finite in float32 (Options)
        x0 = tp.uniform_sphere(key, cfg.n, cfg.d)
        sol = tp.layers(_dynamics(cfg, beta), x0, cfg.num_layers, cfg.dt,
                        save_every=cfg.num_layers // (cfg.num_saves - 1), fn=stats, throw=False)
        return (*sol.stats, sol.nonfinite_time)

    frac, count, nonfinite = jax.vmap(one)(jnp.repeat(betas, len(keys)), jnp.tile(keys, len(betas)))
    return (*(a.reshape(len(betas), len(keys), -1) for a in (frac, count)),
            nonfinite.reshape(len(betas), len(keys)))


def histogram_betas(betas) -> np.ndarray:
    """Indices of the grid β nearest to the published β (the histograms' rows), ascending."""
    return np.unique([int(np.argmin(np.abs(betas - b))) for b in PUBLISHED_BETAS])


def histogram_layers(cfg: PhaseDiagramConfig) -> np.ndarray:
    """The layers of the angle histograms: the start, the layer nearest t = 7.5 (a published
    time; t1 if earlier) and the last."""
    return np.array([0, int(round(min(7.5, cfg.t1) / cfg.dt)), cfg.num_layers])


def histogram_times(cfg: PhaseDiagramConfig) -> np.ndarray:
    """The times of :func:`histogram_layers`: 0, min(7.5, t1) and t1 where those are layers, else
    the layer's time l·dt."""
    nominal = np.array([0.0, min(7.5, cfg.t1), cfg.t1])
    exact = histogram_layers(cfg) * cfg.dt
    return np.where(np.isclose(exact, nominal, rtol=1e-9, atol=0), nominal, exact)


def _summaries(cfg: PhaseDiagramConfig, hist_rows):
    """Everything ``compute`` reports as arrays: the axes, the runs and their means over the
    batch. One compiled program: done eagerly, the axes, the keys and the reductions were a
    dozen small programs compiled one by one (about 0.8 s of a run at the peers' settings)."""
    betas = jnp.linspace(cfg.beta_min, cfg.beta_max, cfg.num_betas)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)  # the saved layers' times k·dt
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.batch)
    frac, count, nonfinite = run_grid(cfg, betas, keys)
    out = {"betas": betas, "ts": ts, "fraction": frac.mean(axis=1),
           "fraction_sem": frac.std(axis=1) / np.sqrt(cfg.batch), "clusters": count.mean(axis=1),
           "nonfinite_time": nonfinite, "hist_nonfinite_time": jnp.zeros(0), "hist_ts": jnp.zeros(0),
           "hist_angles": jnp.zeros(0)}
    if cfg.d == 2:  # the first start again at the histograms' β, kept at the histograms' layers
        layers = histogram_layers(cfg)
        every = int(np.gcd.reduce(layers))

        from ..runs import finite_by_construction as cover_finiteness

        def hist_run(beta):
            cover_finiteness([beta])  # a grid β (run_grid)
            sol = tp.layers(_dynamics(cfg, beta), tp.uniform_sphere(keys[0], cfg.n, cfg.d), cfg.num_layers,
                            cfg.dt, save_every=every, throw=False)
            return sol.xs, sol.nonfinite_time

        states, out["hist_nonfinite_time"] = jax.vmap(hist_run)(betas[np.asarray(hist_rows)])
        out["hist_ts"] = jnp.asarray(histogram_times(cfg), ts.dtype)
        out["hist_angles"] = circle_angles(states[:, layers // every])
    return out


def raise_if_nonfinite(nonfinite_time, betas, hist_nonfinite_time) -> None:
    """:class:`~transformer_pde.NonFiniteStateError` naming the first (β, start) whose tokens
    became NaN or inf, or the histograms' run's (the program reports them as values)."""
    tp.runs.raise_if_nonfinite("phase-diagram", nonfinite_time,
                               {"beta": betas, "start": np.arange(nonfinite_time.shape[1])},
                               "the step dt or beta is too large")
    if np.isfinite(hist_nonfinite_time).any():
        raise tp.NonFiniteStateError("phase-diagram: the histograms' run became non-finite (NaN or inf) by "
                                  f"t = {np.min(hist_nonfinite_time):.6g}; the step dt or beta is too large")


CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
"""On a CPU the grid's program is compiled with LLVM at optimization level 1, not XLA's default 3:
its systems are tiny (n = 32 tokens in d = 2), and at the peers' settings (4 β, 256 starts)
compiling took 1.89 → 1.57 s and running 1.15 → 0.89 s on this project's 2-core CPU
(``benchmarks/compiler_options.py``); as the layer map (``tp.layers``, on a faster host) 1.01 → 0.84 s
and 0.46 → 0.44 s. The float32 outputs are bitwise the same there and at the
default size; in float64 the states move by round-off (1.4e-15 at t = 6; tested). At n = 128
running is 4% slower, compiling still 0.4 s faster. Other platforms keep their defaults
(unmeasured there)."""


def _compiler_options() -> dict:
    return CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else {}


def compute(cfg: PhaseDiagramConfig, progress: bool = False) -> Result:
    # the histogram rows index the grid, so they are chosen before it is built (from the same
    # linspace in float64: a nearest point is the same unless a published β falls on a midpoint)
    hist_rows = histogram_betas(np.linspace(cfg.beta_min, cfg.beta_max, cfg.num_betas))
    # traced once per config and kept beside the compile cache (runs/programs.py): a second
    # process neither traces nor compiles
    program = compile_program(_summaries, (cfg, tuple(int(r) for r in hist_rows)),
                              compiler_options=_compiler_options())
    import_end_modules_meanwhile()  # while the program runs, which does not hold the GIL
    arrays = {k: np.asarray(v) for k, v in program().items()}
    raise_if_nonfinite(arrays.pop("nonfinite_time"), arrays["betas"], arrays.pop("hist_nonfinite_time"))
    arrays.update({
        "hist_betas": arrays["betas"][hist_rows],
        "published_betas": PUBLISHED_BETAS, "published_ts": PUBLISHED_TIMES,
        "published_fraction": PUBLISHED_FRACTION,
        "measured_at_published": published_comparison(arrays["betas"], arrays["ts"], arrays["fraction"]),
    })
    grids = {"grid": grid({"beta": arrays["betas"], "t": arrays["ts"]},
                          fraction=(("beta", "t"), arrays["fraction"]),
                          fraction_sem=(("beta", "t"), arrays["fraction_sem"]),
                          clusters=(("beta", "t"), arrays["clusters"]),
                          describe={
                              "beta": ("inverse temperature β of the attention", ""),
                              "t": ("depth (time) t of the layer dynamics", ""),
                              **clustered_pairs_described("starts"),
                              "clusters": ("number of clusters (single linkage at the threshold), mean over "
                                           "the starts", "")})}
    if cfg.d == 2:
        grids["histograms"] = grid({"beta": arrays["hist_betas"], "t": arrays["hist_ts"]},
                                   angle=(("beta", "t", "token"), arrays["hist_angles"]),
                                   describe={
                                       "beta": ("grid β nearest a published β", ""),
                                       "t": ("depth (time) t of the layer dynamics", ""),
                                       "angle": ("angle in (−π, π] of each token of the first start", "rad")})
    return Result(arrays, grids)


def published_comparison(betas, ts, fraction):
    """Our fraction at the published (β, t) (docs: math/sphere.md#published-runs; nearest grid point), shape
    (4, 2)."""
    out = np.full(PUBLISHED_FRACTION.shape, np.nan)
    for a, b in enumerate(PUBLISHED_BETAS):
        i = int(np.argmin(np.abs(betas - b)))
        if abs(betas[i] - b) > 1e-6 * max(1.0, b):
            continue
        for c, t in enumerate(PUBLISHED_TIMES):
            j = int(np.argmin(np.abs(ts - t)))
            if abs(ts[j] - t) < 1e-6 * max(1.0, t):
                out[a, c] = fraction[i, j]
    return out


def figures(res: Result, cfg: PhaseDiagramConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    betas, ts = res["betas"], res["ts"]
    # fixed margins, not layout="constrained": its passes over every tick label were half the
    # figure's time (0.35 of 0.7 s at the default size)
    fig, axs = plt.subplots(1, 3, figsize=(16, 4.4))
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.12, top=0.92, wspace=0.3)
    ext = [ts[0], ts[-1], betas[0], betas[-1]]
    # titles at y = 1.0 (where matplotlib puts them here anyway): no search for top tick labels
    # over every panel's tight box at each draw (the same pixels, 0.05 s less)
    for ax, key, label in ((axs[0], "fraction", "fraction of clustered pairs"),
                           (axs[1], "clusters", "mean number of clusters")):
        im = ax.imshow(res[key], origin="lower", aspect="auto", extent=ext,
                       cmap="viridis" if key == "fraction" else "magma_r",
                       norm=None if key == "fraction" else plt.matplotlib.colors.LogNorm())
        bar = fig.colorbar(im, ax=ax, label=label, fraction=0.06, pad=0.02)
        if key == "clusters":
            tp.plot.plain_log_labels(bar.ax.yaxis)
        ax.set_xlabel("t (depth)")
        ax.set_ylabel("β")
        ax.set_title(f"SA on S^{cfg.d - 1}: {label}", y=1.0)
    ax = axs[2]
    meas = res["measured_at_published"]
    for a, b in enumerate(PUBLISHED_BETAS):
        i = int(np.argmin(np.abs(betas - b)))
        (line,) = ax.plot(ts, res["fraction"][i], label=f"β = {betas[i]:.3g}")
        ax.plot(PUBLISHED_TIMES, PUBLISHED_FRACTION[a], "o", color=line.get_color(), mfc="none")
        if np.isfinite(meas[a]).all():
            ax.plot(PUBLISHED_TIMES, meas[a], "x", color=line.get_color())
    ax.set_xlabel("t (depth)")
    ax.set_ylabel("fraction of clustered pairs")
    ax.set_title(f"batch {cfg.batch}: ours (lines, ×), published run (○)", y=1.0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    paths = [tp.plot.save_figure(fig, out_dir / "phase_diagram.png", trim=False)]

    if cfg.d == 2 and res["hist_angles"].size:
        hb, ht, ang = res["hist_betas"], res["hist_ts"], res["hist_angles"]
        fig, axs = plt.subplots(len(hb), len(ht), figsize=(3.2 * len(ht), 1.9 * len(hb)),
                                sharex=True, squeeze=False)
        bins = np.linspace(-np.pi, np.pi, 91)
        for a in range(len(hb)):
            for c in range(len(ht)):
                ax = axs[a, c]
                # the histogram as one filled outline, not 90 bar patches (the same picture, 1/10 the time)
                ax.stairs(np.histogram(ang[a, c], bins=bins)[0], bins, fill=True, color="C0")
                ax.set_title(f"β = {hb[a]:.3g}, t = {ht[c]:g}", fontsize=9, y=1.0)
                ax.set_yticks([])
        for ax in axs[-1]:
            ax.set_xlabel("angle θ_i on S^1")
        fig.suptitle(f"token angles, one uniform start, n = {cfg.n}")
        # fixed margins in inches (tight_layout measured every tick label: 0.15 s)
        w, h = fig.get_size_inches()
        fig.subplots_adjust(left=0.15 / w, right=1 - 0.15 / w, bottom=0.5 / h, top=1 - 0.55 / h,
                            hspace=0.45, wspace=0.08)
        paths.append(tp.plot.save_figure(fig, out_dir / "angle_histograms.png", trim=False))
    return paths
