r"""Gaussian reachability: A. Alcalde, Z. Ji, E. Zuazua, *Reachability and asymptotics of
Gaussian Transformer dynamics*, arXiv 2606.07600 (docs: math/gaussian.md#control-of-gaussians).

Softmax attention with an affine feed-forward, ẋ = Γ_μ(x) + Wx + b (``tp.AffineFeedForward``),
keeps Gaussians Gaussian, and the moments follow a bilinear control system in (Q, K, V, W, b).
Here the controls are piecewise constant over L layers of [0, T] (``tp.PiecewiseConstant``,
one set per layer) and are fitted by gradient through ``tp.solve`` of the moment ODEs (Tsit5,
steps of at most ``max_step``; diffrax's checkpointed reverse mode) so that N(m₀, Σ₀) reaches
N(m*, Σ*). The ODEs are solved in factor form (``tp.GaussianFactorFlow``: Σ = FFᵀ), so every
iterate's covariance is PSD (in the moment form an iterate's fixed-step Σ went indefinite in
d = 4). The loss is the moment mismatch |m − m*|² + ‖Σ − Σ*‖²_F (a polynomial of the state:
zero exactly at the target, no square root to differentiate), minimized by optax's L-BFGS with
its zoom line search from a small random start; a trial whose moments overflow gives a NaN loss,
which the line search rejects, and a step without decrease restarts the L-BFGS memory (5
restarts without progress end a fit: a rank bound). The reported distance is the
Bures–Wasserstein W₂ (``tp.diagnostics.bures_wasserstein``, computed without cancellation),
recorded at every iteration.

* **Same rank**: start N(0, I) and ``targets`` random targets per dimension (means N(0, I),
  covariances BBᵀ/d + 0.3 I); every fit should end with W₂ < ``w2_goal`` (1e-8) at every depth.
* **Rank change**: a start of rank ``start_rank`` < d (``tp.GaussianFactorFlow``: the moment
  ODEs in factor form, Σ = FFᵀ) and a full-rank target. The flow keeps the rank, so no control
  comes closer than ``tp.theory.gaussian.low_rank_distance(Σ*, r)`` = (Σ_{i>r} λ_i(Σ*))^{1/2};
  the fit stalls at that bound (which the same-rank result says is attained: the projection of
  the target onto its top r principal axes is a rank-r Gaussian).
* **On particles**: the fitted controls push Gauss–Hermite particles (``tp.Gaussian.gauss_hermite``,
  weighted) and Monte Carlo samples with ``tp.solve``; their moments are compared with the
  closure's (the differences: quadrature error, and sampling error ~ n^{-1/2}, with its scale),
  at the deepest L for each d (each check compiles its own solves).

Measured here (seed 0, float64, default size: d = 2, 4, L = 4, 32, 3 targets each; 12 minutes
on 2 cores shared with other jobs, 4.6 CPU minutes, mostly compilation: one fit per (d, L)):
every fit reached W₂ < 1e-8 — d = 2: 6e-14 to 6e-12 after 13–32 iterations; d = 4: 6e-12 to
1e-11 after 48–150 iterations. The adaptive (rtol = 1e-12) solve of the fitted controls gives
W₂ ≤ 5e-11 in d = 2, and 1e-11 to 4e-9 in d = 4 except one fit (L = 32) at 3.1e-7: there the
fit has used the fixed steps' error (max_step 1/64); a finer max_step fits the ODE itself
(``--dims 4 --depths 32 --max-step 0.00390625``, i.e. 1/256: W₂ 7.9e-12, 3.9e-12, 8.3e-12 after
83, 35, 76 iterations, and the adaptive solve 7.9e-12, 3.9e-12, 8.2e-12; 4.5 CPU minutes).
Gauss–Hermite particles (8^d) follow the closure to 4e-4 (d = 2) and 2e-3 (d = 4) in the mean at
L = 32 (the fitted controls are large), Monte Carlo (n = 1024) within twice its scale. The rank
1 → 2 fit ends at 0.5577287797 (L = 4) and 0.5577287803 (L = 32) against the bound
0.5577287816 (2e-9 below it: W₂'s accuracy at a singular covariance).
"""
from __future__ import annotations

import math

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import transformer_pde as tp

from ..runs.result import Result
from ._options import format_value
from ._progress import progress_bar
from .configs.gaussian_control import GaussianControlConfig

CONTROLS = ("Q", "K", "V", "W", "b")


# ----------------------------------------------------------------------------- the control problem

def _model(controls, cfg, L):
    """The attention + affine feed-forward with per-layer controls (one PiecewiseConstant each)."""
    pc = {k: tp.PiecewiseConstant(v, 0.0, cfg.t1 / L) for k, v in controls.items()}
    attn = tp.SoftmaxAttention(pc["Q"], pc["K"], pc["V"], cfg.beta)
    return tp.AffineFeedForward(attn, pc["W"], pc["b"])


def _initial_controls(key, d, L, scale):
    keys = jax.random.split(key, len(CONTROLS))
    shapes = {"Q": (d, d), "K": (d, d), "V": (d, d), "W": (d, d), "b": (d,)}
    return {k: scale * jax.random.normal(kk, (L, *shapes[k]), jnp.float64) for k, kk in zip(CONTROLS, keys)}


def _solve_kwargs(cfg, L, saveat=None):
    substeps = math.ceil(cfg.t1 / (L * cfg.max_step) - 1e-9)
    # a layer boundary may add a step (the solve steps to just below it and on from just above)
    return dict(t1=cfg.t1, dt0=cfg.t1 / (L * substeps), solver=diffrax.Tsit5(),
                max_steps=2 * L * (substeps + 1) + 16, **({} if saveat is None else {"saveat": saveat}))


def adaptive_end(controls, cfg, L, mean0, cov0):
    """(m, Σ) at T with the same controls by an adaptive solve (rtol = 1e-12; it steps to each
    layer boundary): the ODE, not the fits' fixed steps."""
    sol = tp.solve(_model(controls, cfg, L), tp.Gaussian(mean0, cov0), t1=cfg.t1, dt0=cfg.t1 / (4 * L),
                   solver=diffrax.Tsit5(), stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-14),
                   max_steps=100_000)
    return sol.final_mean, sol.final_cov


def gaussian_end(controls, cfg, L, mean0, cov0):
    """(m, Σ) at T from N(mean0, cov0) (tp.Gaussian: the moment ODEs)."""
    sol = tp.solve(_model(controls, cfg, L), tp.Gaussian(mean0, cov0), **_solve_kwargs(cfg, L))
    return sol.final_mean, sol.final_cov


def factor_end(controls, cfg, L, mean0, factor0):
    """(m, Σ = FFᵀ) at T from N(mean0, F₀F₀ᵀ) of any rank (tp.GaussianFactorFlow). No blow-up
    watch and no throw: a line-search trial that overflows gives a NaN loss, which the zoom line
    search rejects (a smaller step), where a raised error would end the fit."""
    x0 = jnp.concatenate([mean0[None, :], factor0.T], axis=0)
    x = tp.solve(tp.GaussianFactorFlow(_model(controls, cfg, L)), x0, event=None, throw=False,
                 **_solve_kwargs(cfg, L)).xs[-1]
    return x[0], x[1:].T @ x[1:]


def moment_loss(end, target_mean, target_cov):
    m, S = end
    return jnp.sum((m - target_mean) ** 2) + jnp.sum((S - target_cov) ** 2)


def make_fitter(end_fn, cfg):
    """``fit(controls, (m*, Σ*)) -> (controls, W₂ history)``: L-BFGS (optax, zoom line search) on
    the moment loss through ``end_fn(controls) -> (m, Σ)``; the history holds W₂ to the target
    before each iteration and after the last. Compiled once, for every target of a depth, and
    kept between processes (``tp.runs.kept``: JAX's cache alone recompiles a program holding the
    solve's checks in every process)."""
    opt = optax.lbfgs()

    @tp.runs.kept
    def step(p, state, target_mean, target_cov):
        loss = lambda q: moment_loss(end_fn(q), target_mean, target_cov)  # noqa: E731
        value, grad = optax.value_and_grad_from_state(loss)(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(p, updates), state

    @tp.runs.kept
    def distance(p, target_mean, target_cov):
        """W₂ to the target; inf where the moments overflowed (the controls blow the flow up)."""
        m, S = end_fn(p)
        ok = jnp.all(jnp.isfinite(m)) & jnp.all(jnp.isfinite(S))
        w2 = tp.diagnostics.bures_wasserstein(jnp.where(ok, m, target_mean), jnp.where(ok, S, target_cov),
                                              target_mean, target_cov)
        return jnp.where(ok, w2, jnp.inf)

    def fit(controls, target):
        w2 = float(distance(controls, *target))
        for _ in range(10):  # a random start whose moments blow up before T: halve it towards 0
            if np.isfinite(w2):
                break
            controls = jax.tree.map(lambda c: 0.5 * c, controls)
            w2 = float(distance(controls, *target))
        state, history, restarts = opt.init(controls), [w2], 0
        for _ in range(cfg.iterations):
            new, new_state = step(controls, state, *target)
            w2 = float(distance(new, *target))
            if not w2 < history[-1] * (1 - 1e-14):
                # no decrease (a failed line search: every trial overflowed, or a stale memory)
                # or an overflow: drop the step and restart the L-BFGS memory from the last
                # iterate; after 5 restarts the fit has stalled (at a rank bound)
                restarts += 1
                if restarts > 5:
                    break
                state = opt.init(controls)
                continue
            controls, state = new, new_state
            history.append(w2)
            if w2 < cfg.w2_stop:
                break
        return controls, np.asarray(history)

    return fit


def random_target(rng, d):
    B = rng.normal(size=(d, d))
    return rng.normal(size=d), B @ B.T / d + 0.3 * np.eye(d)


def particle_check(controls, cfg, L, g0, end, key):
    """Moments of Gauss–Hermite and Monte Carlo particles pushed by the fitted controls against
    the closure's end (m, Σ): (|Δm|, ‖ΔΣ‖_F) for each, and the Monte Carlo error scale
    (tr Σ/n)^{1/2}."""
    model = _model(controls, cfg, L)
    m, S = (np.asarray(a) for a in end)
    out = {}
    x_gh, w_gh = g0.gauss_hermite(cfg.gh_order)
    w_mc = jnp.full(cfg.mc_n, 1.0 / cfg.mc_n)
    for name, (x0, w0) in (("gh", (x_gh, w_gh)), ("mc", (g0.sample(key, cfg.mc_n), w_mc))):
        x = np.asarray(tp.solve(model, tp.Particles(x0, w0), **_solve_kwargs(cfg, L)).xs[-1])
        w = np.asarray(w0)
        mp = w @ x
        Sp = (x - mp).T @ ((x - mp) * w[:, None])
        out[name] = (np.linalg.norm(mp - m), np.linalg.norm(Sp - S))
    return out["gh"], out["mc"], float(np.sqrt(np.trace(S) / cfg.mc_n))


def compute(cfg: GaussianControlConfig, progress: bool = False) -> Result:
    rng = np.random.default_rng(cfg.seed)
    key = jax.random.key(cfg.seed)
    dims, depths = np.asarray(cfg.dims), np.asarray(cfg.depths)
    D, Ln, K = len(dims), len(depths), cfg.targets
    w2, w2_ode = np.full((D, Ln, K), np.nan), np.full((D, Ln, K), np.nan)
    history = np.full((D, Ln, K, cfg.iterations + 1), np.nan)
    iters = np.zeros((D, Ln, K), int)
    gh, mc, mc_scale = np.full((D, 2), np.nan), np.full((D, 2), np.nan), np.full(D, np.nan)
    out: dict = {}
    bar = progress_bar(progress, total=D * Ln * K + Ln, desc="gaussian-control")
    with jax.enable_x64(True):
        for i, d in enumerate(dims):
            d = int(d)
            mean0, cov0 = jnp.zeros(d), jnp.eye(d)
            targets = [random_target(rng, d) for _ in range(K)]
            out[f"d{d}_target_means"] = np.stack([t[0] for t in targets])
            out[f"d{d}_target_covs"] = np.stack([t[1] for t in targets])
            for j, L in enumerate(depths):
                L = int(L)
                # fitted in factor form (Σ = FFᵀ): every iterate's covariance is PSD, where the
                # moment ODEs' fixed steps let an L-BFGS trial iterate go indefinite (seen in d = 4)
                fit = make_fitter(lambda p, L=L, d=d: factor_end(p, cfg, L, jnp.zeros(d), jnp.eye(d)), cfg)
                for k, (tm, tc) in enumerate(targets):
                    key, sub = jax.random.split(key)
                    p0 = _initial_controls(sub, d, L, cfg.init_scale)
                    p, h = fit(p0, (jnp.asarray(tm), jnp.asarray(tc)))
                    w2[i, j, k], iters[i, j, k] = h[-1], len(h) - 1
                    history[i, j, k, : len(h)] = h
                    w2_ode[i, j, k] = float(tp.diagnostics.bures_wasserstein(
                        *adaptive_end(p, cfg, L, mean0, cov0), tm, tc))
                    if k == 0 and L == depths.max():  # one particle check per d (each compiles)
                        key, sub = jax.random.split(key)
                        end = gaussian_end(p, cfg, L, mean0, cov0)
                        gh[i], mc[i], mc_scale[i] = particle_check(p, cfg, L, tp.Gaussian(mean0, cov0), end, sub)
                        if d == dims.min():  # the ellipses of the figure
                            ts = jnp.linspace(0.0, cfg.t1, L + 1)
                            sol = tp.solve(_model(p, cfg, L), tp.Gaussian(mean0, cov0),
                                           **_solve_kwargs(cfg, L, saveat=ts))
                            out["path_means"], out["path_covs"] = np.asarray(sol.means), np.asarray(sol.covs)
                            out["path_target"] = np.asarray(k)
                    bar.update(1)
                    bar.note(f"d={d} L={L} target {k}: W2 = {w2[i, j, k]:.3g} after {iters[i, j, k]} iterations")

        # the rank change: a start of rank r, the first target of the smallest d (rank d)
        d, r = int(dims.min()), cfg.start_rank
        tm, tc = (jnp.asarray(a) for a in (out[f"d{d}_target_means"][0], out[f"d{d}_target_covs"][0]))
        factor0 = jnp.eye(d)[:, :r]
        bound = float(tp.theory.gaussian.low_rank_distance(tc, r))
        rank_w2, rank_hist = np.full(Ln, np.nan), np.full((Ln, cfg.iterations + 1), np.nan)
        rank_eigs = np.full((Ln, d), np.nan)
        for j, L in enumerate(depths):
            L = int(L)
            end_fn = lambda p, L=L: factor_end(p, cfg, L, jnp.zeros(d), factor0)  # noqa: E731
            key, sub = jax.random.split(key)
            p, h = make_fitter(end_fn, cfg)(_initial_controls(sub, d, L, cfg.init_scale), (tm, tc))
            rank_w2[j], rank_hist[j, : len(h)] = h[-1], h
            rank_eigs[j] = np.linalg.eigvalsh(np.asarray(end_fn(p)[1]))
            bar.update(1)
            bar.note(f"rank {r} -> {d}, L={L}: W2 = {h[-1]:.10g}, bound {bound:.10g}")
    bar.close()
    out.update(dims=dims, depths=depths, w2=w2, w2_ode=w2_ode, history=history, iterations=iters, gh_error=gh,
               mc_error=mc, mc_scale=mc_scale, rank_bound=np.asarray(bound), rank_w2=rank_w2,
               rank_history=rank_hist, rank_eigenvalues=rank_eigs)
    return Result(out)


def report_lines(res: Result, cfg: GaussianControlConfig) -> list[str]:
    """The table of the run: W₂ reached per (d, L, target), the particle checks, the rank bound."""
    lines = [f"W2 reached (goal {cfg.w2_goal:g}), one column per target:"]
    for i, d in enumerate(res["dims"]):
        for j, L in enumerate(res["depths"]):
            w = res["w2"][i, j]
            flag = "all reached" if np.all(w < cfg.w2_goal) else "NOT all reached"
            lines.append(f"  d={d} L={L:>3}: " + "  ".join(f"{v:.2e}" for v in w) + f"  ({flag}; "
                         f"iterations {format_value(tuple(int(n) for n in res['iterations'][i, j]))}; "
                         f"adaptive rtol=1e-12 solve: " + "  ".join(f"{v:.1e}" for v in res["w2_ode"][i, j]) + ")")
    L = int(np.max(res["depths"]))
    lines.append(f"particles pushed by the fitted controls (first target, L={L}) against the moment ODEs "
                 "(tp.Gaussian), |dm|, |dS|_F:")
    for i, d in enumerate(res["dims"]):
        (gm, gs), (mm, ms) = res["gh_error"][i], res["mc_error"][i]
        lines.append(f"  d={d}: Gauss-Hermite ({cfg.gh_order}^{d}) {gm:.1e}, {gs:.1e}; "
                     f"Monte Carlo (n={cfg.mc_n}) {mm:.1e}, {ms:.1e} (scale (tr S/n)^1/2 = "
                     f"{res['mc_scale'][i]:.1e})")
    d = int(np.min(res["dims"]))
    lines.append(f"rank change {cfg.start_rank} -> {d}: lower bound (sum of the {d - cfg.start_rank} smallest "
                 f"eigenvalues of the target)^1/2 = {float(res['rank_bound']):.10g}")
    for j, L in enumerate(res["depths"]):
        lines.append(f"  L={L:>3}: W2 = {res['rank_w2'][j]:.10g}, eigenvalues of the reached covariance "
                     + ", ".join(f"{v:.3g}" for v in res["rank_eigenvalues"][j]))
    return lines


def figures(res: Result, cfg: GaussianControlConfig, out_dir) -> list:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Ellipse

    dims, depths = res["dims"], res["depths"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
    ax = axes[0]
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(depths)))
    styles = ["-", "--", ":", "-."]
    for i, d in enumerate(dims):
        for j, L in enumerate(depths):
            for k in range(res["history"].shape[2]):
                h = res["history"][i, j, k]
                ax.semilogy(np.arange(len(h)), h, styles[i % 4], color=colors[j], lw=1,
                            label=f"d={d}, L={L}" if k == 0 else None)
    ax.axhline(cfg.w2_goal, color="k", lw=0.8, ls=":")
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel("W₂ to the target")
    ax.set_title("same rank: every target, every depth", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")

    ax = axes[1]
    if "path_means" in res:
        ms, Ss = res["path_means"], res["path_covs"]
        k = int(res["path_target"])
        d = int(np.min(dims))
        tm, tc = res[f"d{d}_target_means"][k], res[f"d{d}_target_covs"][k]
        shades = plt.cm.plasma(np.linspace(0, 0.85, len(ms)))
        for m, S, c in zip(ms, Ss, shades):
            _ellipse(ax, Ellipse, m[:2], S[:2, :2], edgecolor=c, lw=0.9)
        _ellipse(ax, Ellipse, tm[:2], tc[:2, :2], edgecolor="k", lw=1.6, ls="--")
        ax.plot(ms[:, 0], ms[:, 1], "k-", lw=0.6)
        ax.set_aspect("equal")
        ax.autoscale_view()
        ax.set_title(f"d={d}, L={int(np.max(depths))}: 1-σ ellipses at the layers (dashed: target)", fontsize=10)

    ax = axes[2]
    bound = float(res["rank_bound"])
    for j, L in enumerate(depths):
        ax.semilogy(np.maximum(res["rank_history"][j] - bound, 1e-17), color=colors[j], label=f"L={L}")
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel("W₂ − bound")
    d = int(np.min(dims))
    ax.set_title(f"rank {cfg.start_rank} → {d}: W₂ stalls at the bound {bound:.4f}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle("Gaussian reachability: softmax attention + affine feed-forward, piecewise-constant controls")
    paths = [tp.plot.save_figure(fig, out_dir / "gaussian-control.png")]
    Result.write_table(out_dir, "report.txt", "\n".join(report_lines(res, cfg)) + "\n")
    return paths


def _ellipse(ax, Ellipse, m, S, **kw):
    lam, U = np.linalg.eigh(S)
    angle = np.degrees(np.arctan2(U[1, -1], U[0, -1]))
    ax.add_patch(Ellipse(m, 2 * np.sqrt(max(lam[-1], 0)), 2 * np.sqrt(max(lam[0], 0)), angle=angle,
                         fill=False, **kw))
