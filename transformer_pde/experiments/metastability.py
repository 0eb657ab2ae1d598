r"""Dynamic metastability (GKPR; docs: math/sphere.md#metastability).

Two measurements:

1. **Caps are left only after times growing like e^{cβ}.** Tokens start in k caps
   S_q(ε) = {x : ⟨x, w_q⟩ >= 1 − ε} on S^1 whose centers are θ0 apart. Under SA each cap
   collapses to a point cluster within O(1) time; the clusters then attract each other with
   a force ∝ e^{−β(1 − cos θ0)}, so the first time a token leaves its cap S_q(2ε) grows
   like e^{(1 − cos θ0)β}. The theorem (docs: math/sphere.md#metastability) guarantees at least
   T₂ = (ε/n) e^{(1 − α)β} with α = max{⟨x, y⟩ : x ∈ S_p(2ε), y ∈ S_q(2ε), p ≠ q}.
   Each cap's tokens sit symmetrically about its center, so the collapsed clusters are
   θ0 apart.

2. **The energy staircase** (n = 5 on the circle, the authors' set-up, docs: math/sphere.md#published-runs).
   USA with GKPR's weights e^{β(cos(θ_j − θ_i) − 1)}/n, followed with normalized-gradient
   steps θ ← θ + h log β · g/|g| (the time change dτ = |g| dt/log β of GKPR §6, i.e. arc
   length over log β), and merging of tokens closer than ``merge_angle`` (the authors' code:
   10⁻³; the modified USA of the theorem merges at 1/sqrt(β log β), ``merge_angle = 0``). The normalized energy φ = (1/n²) Σ e^{β(cos(θ_i − θ_j) − 1)} (with the
   erratum's normalization) then shows plateaus at Σ_k (m_k/n)² for the cluster masses m_k:
   0.28, 0.44, 0.52 for sizes (2,1,1,1), (3,1,1), (3,2), then 1; in rescaled time the
   collapse comes near 0.12 (β = 500), 0.10 (β = 2000), 0.092 (β = 4000).

   The staircase works in angles: in ambient coordinates the tangential force between
   clusters, e^{−β(1 − cos Δ)} ~ e^{−80} here, lies far below the rounding error of the
   projection P⊥ applied to the self-interaction term, so it would be lost.
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._common import pid
from .configs.metastability import MetastabilityConfig

# the authors' code rerun (docs: math/sphere.md#published-runs): plateau values and collapse times in rescaled time.
PUBLISHED_PLATEAUS = np.array([0.28, 0.44, 0.52, 1.0])
PUBLISHED_COLLAPSE = {500.0: 0.12, 2000.0: 0.10, 4000.0: 0.092}


def _circle(theta):
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)


# ----------------------------------------------------------------------------- part 1
def cap_start(cfg: MetastabilityConfig):
    """Tokens symmetric about each cap center, spread over the whole ε-cap; their caps."""
    r1 = np.arccos(1 - cfg.eps)
    offsets = np.linspace(-r1, r1, cfg.per_cap) if cfg.per_cap > 1 else np.zeros(1)
    centers = np.arange(cfg.num_caps) * cfg.cap_angle
    theta = (centers[:, None] + offsets[None, :]).ravel()
    return _circle(jnp.asarray(theta)), _circle(jnp.asarray(centers)), np.repeat(
        np.arange(cfg.num_caps), cfg.per_cap)


def exit_times(cfg: MetastabilityConfig):
    """First save time at which some token has left its cap S_q(2ε), for each β."""
    x0, W, q = cap_start(cfg)
    Wq = W[jnp.asarray(q)]
    fractions = jnp.concatenate([jnp.zeros(1), jnp.geomspace(1e-3, 1.0, 400)])  # of the horizon
    out, t1s = [], []
    for beta in np.asarray(cfg.cap_betas):
        # the exit is expected near e^{(1 - cos θ0) β}; look 50x beyond
        t1 = 50.0 * np.exp(beta * (1 - np.cos(cfg.cap_angle))) + 10.0
        sol = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(2, beta)), x0, t1=t1, dt0=1e-2,
                    stepsize_controller=pid(cfg.rtol, x0.dtype), max_steps=2_000_000,
                    saveat=diffrax.SaveAt(ts=fractions * t1,
                                          fn=lambda t, x, args: jnp.min(jnp.sum(x * Wq, axis=1))))
        inner = np.asarray(sol.stats)
        left = np.nonzero(inner < 1 - 2 * cfg.eps)[0]
        out.append(float(fractions[left[0]] * t1) if left.size else np.inf)
        t1s.append(t1)
    return np.asarray(out), np.asarray(t1s)


# ----------------------------------------------------------------------------- part 2
def staircase_start(cfg: MetastabilityConfig):
    b0 = cfg.theta_beta
    return 0.5 * np.asarray(cfg.theta0) * np.log(b0) / np.sqrt(b0)


def _staircase(theta0, beta, h, merge_angle, num_chunks, every):
    """Normalized-gradient USA on the circle, with merging of tokens closer than ``merge_angle``
    (0: the theorem's 1/sqrt(β log β)); φ and masses every ``every`` steps."""
    log_beta = jnp.log(beta)
    merge = jnp.cos(jnp.where(merge_angle > 0, merge_angle, 1.0 / jnp.sqrt(beta * log_beta)))

    def step(theta, _):
        diff = theta[None, :] - theta[:, None]  # θ_j − θ_i
        # exponent β(cos Δ − 1) = −2β sin²(Δ/2) (no cancellation at small Δ), shifted by its
        # largest value over distinct pairs: only the direction of g is used, and the shift
        # keeps the inter-cluster terms (~e^{−60} and below) from underflowing in float32
        a = -2 * beta * jnp.sin(diff / 2) ** 2
        distinct = jnp.sin(diff) != 0
        c = jnp.max(jnp.where(distinct, a, -jnp.inf))
        c = jnp.where(jnp.isfinite(c), c, 0.0)
        g = jnp.sum(jnp.where(distinct, jnp.exp(a - c) * jnp.sin(diff), 0.0), axis=1)
        norm = jnp.linalg.norm(g)
        theta = theta + h * log_beta * jnp.where(norm > 0, g / jnp.where(norm > 0, norm, 1.0), 0.0)
        x = _circle(theta)
        labels = tp.diagnostics.cluster_labels(x, merge)
        s = jnp.zeros_like(x).at[labels].add(x)  # merged clusters sit at their mean direction
        return jnp.arctan2(s[labels, 1], s[labels, 0]), None

    def chunk(theta, _):
        theta, _ = jax.lax.scan(step, theta, None, length=every)
        x = _circle(theta)
        return theta, (tp.diagnostics.normalized_energy(x, beta), tp.diagnostics.cluster_masses(x, 1 - 1e-6), theta)

    _, out = jax.lax.scan(chunk, theta0, None, length=num_chunks)
    return out


def staircase(cfg: MetastabilityConfig):
    theta0 = jnp.asarray(staircase_start(cfg))
    betas = jnp.asarray(np.asarray(cfg.stair_betas), dtype=theta0.dtype)
    num_chunks = int(round(cfg.tau_max / (cfg.step * cfg.save_every)))
    run = jax.jit(jax.vmap(_staircase, in_axes=(None, 0, None, None, None, None)), static_argnums=(4, 5))
    phi, masses, theta = run(theta0, betas, cfg.step, cfg.merge_angle, num_chunks, cfg.save_every)
    taus = cfg.step * cfg.save_every * np.arange(1, num_chunks + 1)
    return taus, np.asarray(phi), np.asarray(masses), np.asarray(theta)


def plateau_values(n: int, masses) -> np.ndarray:
    """Σ_k (m_k)² for mass vectors (rows), the predicted plateau heights."""
    return np.sum(np.asarray(masses) ** 2, axis=-1)


def collapse_times(taus, phi, level=0.999):
    """First rescaled time with φ >= level, per β (inf if never)."""
    hit = phi >= level
    return np.where(hit.any(axis=1), taus[np.argmax(hit, axis=1)], np.inf)


def predicted_exit_time(betas, cfg: MetastabilityConfig):
    """The closed form of the exit time for two caps (:func:`transformer_pde.theory.metastability.predicted_exit_time`);
    NaN for more than two caps."""
    b = np.asarray(betas, dtype=float)
    if cfg.num_caps != 2:
        return np.full(b.shape, np.nan)
    return tp.theory.metastability.predicted_exit_time(b, cfg.cap_angle)


def compute(cfg: MetastabilityConfig, progress: bool = False) -> Result:
    exits, t1s = exit_times(cfg)
    betas = np.asarray(cfg.cap_betas)
    n_cap = cfg.num_caps * cfg.per_cap
    alpha = tp.theory.metastability.cap_alpha(cfg.eps, cfg.cap_angle)
    ok = np.isfinite(exits)
    # log(β T) is linear in β with slope 1 − cos θ0 (see predicted_exit_time)
    slope = np.polyfit(betas[ok], np.log(betas[ok] * exits[ok]), 1)[0] if ok.sum() >= 2 else np.nan
    taus, phi, masses, theta = staircase(cfg)
    arrays = {
        "cap_betas": betas, "exit_times": exits, "cap_horizons": t1s,
        "theorem_T2": cfg.eps / n_cap * np.exp((1 - alpha) * betas),
        "alpha": np.asarray(alpha), "predicted_exit": predicted_exit_time(betas, cfg),
        "exit_slope": np.asarray(slope),
        "predicted_slope": np.asarray(1 - np.cos(cfg.cap_angle)),
        "stair_betas": np.asarray(cfg.stair_betas), "taus": taus, "phi": phi,
        "masses": masses, "thetas": theta, "theta_start": staircase_start(cfg),
        "plateau_prediction": plateau_values(len(cfg.theta0), masses),
        "collapse_times": collapse_times(taus, phi),
        "published_plateaus": PUBLISHED_PLATEAUS,
    }
    staircase_grid = grid({"beta": arrays["stair_betas"], "tau": taus},
                          phi=(("beta", "tau"), phi), masses=(("beta", "tau", "token"), masses),
                          theta=(("beta", "tau", "token"), theta),
                          collapse_time=(("beta",), arrays["collapse_times"]),
                          describe={
                              "beta": ("inverse temperature β of the USA staircase", ""),
                              "tau": ("rescaled time τ (arc length over log β) of the normalized-gradient steps", ""),
                              "phi": ("normalized energy φ = (1/n²) Σ_ij e^{β(cos(θ_i − θ_j) − 1)}", ""),
                              "masses": ("cluster masses m_k, decreasing, padded with zeros", ""),
                              "theta": ("angle θ_i of each token on the circle", "rad"),
                              "collapse_time": ("first rescaled time with φ >= 0.999 (inf if never)", "")})
    caps_grid = grid({"beta": betas}, exit_time=(("beta",), exits), horizon=(("beta",), t1s),
                     theorem_T2=(("beta",), arrays["theorem_T2"]),
                     predicted_exit=(("beta",), arrays["predicted_exit"]),
                     describe={
                         "beta": ("inverse temperature β of the SA on the circle", ""),
                         "exit_time": ("first save time at which some token has left its cap S_q(2ε) "
                                       "(inf if none by the horizon)", ""),
                         "horizon": ("end time t1 of the run", ""),
                         "theorem_T2": ("the theorem's lower bound T₂ = (ε/n) e^{(1 − α)β} on the exit time", ""),
                         "predicted_exit": ("closed-form exit time for two caps (NaN for more caps)", "")})
    return Result(arrays, {"caps": caps_grid, "staircase": staircase_grid})


def figures(res: Result, cfg: MetastabilityConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(16, 4.4), layout="constrained",
                            gridspec_kw={"width_ratios": [1, 1.6, 1]})
    ax = axs[0]
    b = res["cap_betas"]
    ax.semilogy(b, res["exit_times"], "o-", label=f"first exit from a 2ε-cap (d log(βT)/dβ = "
                f"{float(res['exit_slope']):.3f})")
    ax.semilogy(b, res["theorem_T2"], "k:", label=f"theorem: (ε/n)e^{{(1−α)β}}, α={float(res['alpha']):.3f}")
    ax.semilogy(b, res["predicted_exit"], "--", color="0.5",
                label=f"e^{{(1−cos θ0)β}}/(2β sin²θ0); fitted d log(βT)/dβ vs 1−cos θ0 = "
                      f"{float(res['predicted_slope']):.3f}")
    ax.set_xlabel("β")
    ax.set_ylabel("time")
    ax.set_title(f"SA on S^1: {cfg.num_caps} caps × {cfg.per_cap} tokens, ε = {cfg.eps}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axs[1]
    taus = res["taus"]
    for k, beta in enumerate(res["stair_betas"]):
        ax.plot(taus, res["phi"][k], label=f"β = {beta:g}", lw=1.2)
    for v in PUBLISHED_PLATEAUS:
        ax.axhline(v, color="0.6", ls=":", lw=0.8)
    for tc in PUBLISHED_COLLAPSE.values():
        ax.axvline(tc, color="0.8", lw=0.8)
    ax.set_xlabel("rescaled time τ (arc length / log β)")
    ax.set_ylabel("normalized energy φ")
    ax.set_title("energy staircase, n = 5 (dotted: Σ(m_k/n)² = 0.28, 0.44, 0.52, 1; "
                 "grey: published collapse)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.2)
    ax = axs[2]
    k = int(np.argmin(np.abs(res["stair_betas"] - 2000.0)))
    th = res["thetas"][k]
    for i in range(th.shape[1]):
        ax.plot(taus, th[:, i], lw=1)
    ax.set_xlabel("rescaled time τ")
    ax.set_ylabel("θ_i")
    ax.set_title(f"angles, β = {res['stair_betas'][k]:g}: sequential merging", fontsize=9)
    ax.grid(alpha=0.3)
    return [tp.plot.save_figure(fig, out_dir / "metastability.png")]
