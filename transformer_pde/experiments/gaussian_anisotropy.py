r"""Covariance trajectories of the Gaussian closure in the PSD cone, d = 2
(docs: math/gaussian.md#long-time-behaviour).

A 2×2 covariance (a c; c b) is drawn at (u, w, v) = (a − b, 2c, a + b): the PSD cone is
{v ≥ √(u² + w²)} and rank-one matrices lie on its boundary. Initial covariances have trace 1
on a grid of (u, w). Five regimes, each for softmax, ℓ², multi-head (H = 2) and Sinkhorn
attention, with the parameters of the authors' figure script (docs: math/gaussian.md#the-authors-experiments;
NumPy's legacy generator with their seeds, A = KᵀQ/√d for softmax and ℓ², A_h = K_hᵀQ_h/√k for multi-head,
ε = 1 and no √d for Sinkhorn):

* ``zero``: Q ~ U[0,1)^{2×2}, K = −Q, V = GGᵀ: Σ → 0 (tr(V⁻¹Σ) decreases).
* ``line``: Q = q (unit row), K = −q, V = I: Σ → Π(ΠᵀΣ0⁻¹Π)⁻¹Πᵀ on the line q⊥.
* ``two-lines``: A + Aᵀ indefinite, random V: rank-one limits lie on the two isotropic lines
  {u : uᵀ(A + Aᵀ)u = 0} (a rank-one stationary point s uuᵀ needs uᵀAu = 0).
* ``blowup``: A + Aᵀ ≻ 0, V = I: softmax and multi-head blow up in finite time (softmax at
  t*), ℓ² and Sinkhorn grow without bound but only exponentially.
* ``mixed``: A + Aᵀ indefinite, another V: convergence or blow-up depending on Σ0.

Diverging runs are drawn after normalization Σ/tr Σ in the disk (u/v, w/v). Unlike the
authors' projected Euler scheme, the moment ODEs are integrated with adaptive Tsit5 and the
solve stops when tr Σ exceeds ``tol_high`` (a diffrax event).

The runs are saved labelled too (``results.nc``, one group per regime: dims variant × start ×
save × row × col, with the save times per variant and the outcome codes).
"""
from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._progress import progress_bar
from .configs.gaussian_anisotropy import AnisotropyConfig

RICCATI = ("softmax", "multihead")  # quadratic closures: finite-time blow-up possible
OUTCOMES = ("to zero", "rank one", "full rank", "blow-up", "unbounded", "unfinished")
"""Outcome codes: index into this tuple."""


def to_cone(covs):
    """(u, w, v) = (a − b, 2c, a + b) for covariances (..., 2, 2)."""
    covs = np.asarray(covs)
    a, b, c = covs[..., 0, 0], covs[..., 1, 1], covs[..., 0, 1]
    return np.stack([a - b, 2 * c, a + b], axis=-1)


def initial_grid(n: int, limit: float) -> np.ndarray:
    """Trace-one covariances with (u, w) on an n×n grid of [−limit, limit]², inside the cone."""
    us = np.linspace(-limit, limit, n)
    out = [[[(1 + u) / 2, w / 2], [w / 2, (1 - u) / 2]] for u in us for w in us if u * u + w * w < 1]
    return np.asarray(out)


def regime_parameters(regime: str):
    """(Q, K, V, grid multiplier, grid limit) of the authors' figure script
    (docs: math/gaussian.md#the-authors-experiments)."""
    if regime == "zero":
        rs = np.random.RandomState(35)
        Q = rs.rand(2, 2)
        G = rs.randn(2, 2)
        return Q, -Q, G @ G.T, 1, 0.5
    if regime == "line":
        rs = np.random.RandomState(36)
        q = rs.randn(1, 2)
        q = q / np.linalg.norm(q)
        # a zero second row: same A = −qᵀq, and for multi-head an empty second head as in [C]
        Q = np.concatenate([q, np.zeros((1, 2))])
        return Q, -Q, np.eye(2), 1, 0.5
    if regime in ("two-lines", "mixed", "blowup"):
        rs = np.random.RandomState(33 if regime == "blowup" else 36)
        for _ in range(1000):
            Q, K = rs.randn(2, 2), rs.randn(2, 2)
            lam = np.linalg.eigvalsh(K.T @ Q + Q.T @ K)
            if (lam[0] > 0) if regime == "blowup" else (lam[0] * lam[1] < 0):
                break
        if regime == "blowup":
            return Q, K, np.eye(2), 4, 1.0
        if regime == "two-lines":
            return Q, K, np.random.RandomState(32).randn(2, 2), 2, 1.0
        rs = np.random.RandomState(35)
        rs.randn(8, 7)  # the authors' dummy draw
        return Q, K, rs.randn(2, 2), 3, 1.0
    raise ValueError(regime)


ATTENTIONS = {
    "softmax": lambda Q, K, V: tp.SoftmaxAttention(Q, K, V, 1 / np.sqrt(2)),
    "l2": lambda Q, K, V: tp.L2Attention(Q, K, V, 1 / np.sqrt(2)),
    "multihead": lambda Q, K, V: tp.MultiHeadAttention.split(Q, K, V, 2, 1.0),  # heads of width k = 1
    "sinkhorn": lambda Q, K, V: tp.SinkhornAttention(Q, K, V, 1.0, epsilon=1.0),
}
"""The attention each ``variants`` name builds (d = 2, scores over √d, the authors' convention)."""


def make_attention(variant: str, Q, K, V):
    return ATTENTIONS[variant](Q, K, V)


def isotropic_directions(B):
    """The two unit vectors u with uᵀBu = 0 for an indefinite symmetric 2×2 matrix B."""
    lam, E = np.linalg.eigh(B)
    if not lam[0] < 0 < lam[1]:
        raise ValueError(f"B must be indefinite, got eigenvalues {lam}")
    us = [np.sqrt(lam[1]) * E[:, 0] + s * np.sqrt(-lam[0]) * E[:, 1] for s in (1.0, -1.0)]
    return [u / np.linalg.norm(u) for u in us]


def classify(cov0, final_cov, blew_up, variant, finished=True):
    """Outcome code (index into OUTCOMES) of one run."""
    if not finished:
        return 5
    if blew_up:
        return 3 if variant in RICCATI else 4
    lam = np.linalg.eigvalsh(final_cov)
    if lam[-1] + lam[0] < 0.1 * np.trace(cov0):
        return 0
    return 1 if lam[0] < 0.05 * lam[-1] else 2


def _horizon(regime, variant, attn, covs0, cfg):
    if regime in ("zero", "line"):
        return cfg.t_long
    if regime == "two-lines":
        return cfg.t_two_lines
    if regime == "mixed":
        return cfg.t_mixed
    if variant == "softmax":  # V = I: t* in closed form; run past the latest one
        from ..theory.gaussian import identity_value_blowup_time

        A = attn.score_matrix()
        return 1.5 * float(max(identity_value_blowup_time(c, A) for c in covs0))
    return 50.0


def _solve_batch(attns, covs0, t1s, tss, cfg):
    """One vmapped solve over runs that differ in parameters, Σ0, horizon and save times:
    a single compilation per attention variant."""
    pid = diffrax.PIDController(rtol=cfg.rtol, atol=1e-3 * cfg.rtol)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *attns)

    def one(attn, cov0, t1, ts):
        sol = tp.solve(attn, tp.Gaussian(jnp.zeros(2, cov0.dtype), cov0), t1=t1, dt0=1e-3,
                             saveat=ts, stepsize_controller=pid, max_steps=cfg.max_steps,
                             event=tp.BlowUp(cfg.tol_high), throw=False)
        return sol.covs, sol.final_cov, sol.final_time, sol.blowup_time, sol.succeeded

    def batch(stacked, covs0, t1s, tss):
        return jax.vmap(one)(stacked, covs0, t1s, tss)

    out = tp.runs.kept(batch)(stacked, jnp.asarray(covs0), jnp.asarray(t1s), jnp.asarray(tss))
    return [np.asarray(o) for o in out]


def compute(cfg: AnisotropyConfig, progress: bool = False) -> Result:
    out = {"outcome_names": np.asarray(OUTCOMES)}
    regimes, variants = list(cfg.regimes), list(cfg.variants)
    bar = progress_bar(progress, total=len(variants), desc="gaussian-anisotropy (variants)")
    with jax.enable_x64(True), bar:
        setups = {}
        for regime in regimes:
            Q, K, V, mult, limit = regime_parameters(regime)
            covs0 = initial_grid(cfg.grid * mult, limit)
            setups[regime] = (Q, K, V, covs0)
            out[f"{regime}__Q"], out[f"{regime}__K"], out[f"{regime}__V"] = Q, K, V
            out[f"{regime}__covs0"] = covs0
        for variant in variants:
            attns, c0s, t1s, tss, slices = [], [], [], [], {}
            for regime in regimes:
                Q, K, V, covs0 = setups[regime]
                attn = make_attention(variant, Q, K, V)
                t1 = _horizon(regime, variant, attn, covs0, cfg)
                if regime == "blowup":
                    ts = np.linspace(0.0, t1, cfg.num_saves)
                else:  # O(1/t) convergence: logarithmic times
                    ts = np.concatenate([[0.0], np.geomspace(1e-3 * t1, t1, cfg.num_saves - 1)])
                slices[regime] = slice(len(c0s), len(c0s) + len(covs0))
                attns += [attn] * len(covs0)
                c0s += list(covs0)
                t1s += [t1] * len(covs0)
                tss += [ts] * len(covs0)
            covs, final, tfinal, tblow, done = _solve_batch(attns, c0s, t1s, tss, cfg)
            for regime in regimes:
                sl, key = slices[regime], f"{regime}__{variant}"
                covs0 = setups[regime][3]
                out[f"{key}__ts"] = tss[sl.start]
                out[f"{key}__covs"] = covs[sl]
                out[f"{key}__final_cov"] = final[sl]
                out[f"{key}__final_time"] = tfinal[sl]
                out[f"{key}__blowup_time"] = tblow[sl]
                out[f"{key}__outcome"] = np.asarray(
                    [classify(c0, f, np.isfinite(tb), variant, ok)
                     for c0, f, tb, ok in zip(covs0, final[sl], tblow[sl], done[sl])])
                counts = np.bincount(out[f"{key}__outcome"], minlength=len(OUTCOMES))
                summary = ", ".join(f"{OUTCOMES[i]}: {c}" for i, c in enumerate(counts) if c)
                bar.note(f"{regime:>9} {variant:>9}: {summary}")
            bar.update()
    return Result(out, {_group(regime): regime_grid(out, regime, variants) for regime in regimes})


def _group(regime: str) -> str:
    return regime.replace("-", "_")


def regime_grid(res, regime: str, variants):
    """The runs of one regime, labelled: variant × start × save (× row × col)."""
    keys = [f"{regime}__{v}" for v in variants]
    stack = lambda name: np.stack([res[f"{k}__{name}"] for k in keys])  # noqa: E731
    covs0 = res[f"{regime}__covs0"]
    ds = grid({"variant": np.asarray(variants), "start": np.arange(len(covs0))},
              covs0=(("start", "row", "col"), covs0),
              ts=(("variant", "save"), stack("ts")),
              covs=(("variant", "start", "save", "row", "col"), stack("covs")),
              final_cov=(("variant", "start", "row", "col"), stack("final_cov")),
              final_time=(("variant", "start"), stack("final_time")),
              blowup_time=(("variant", "start"), stack("blowup_time")),
              outcome=(("variant", "start"), stack("outcome")),
              Q=(("row", "col"), res[f"{regime}__Q"]), K=(("row", "col"), res[f"{regime}__K"]),
              V=(("row", "col"), res[f"{regime}__V"]),
              describe={
                  "variant": ("attention of the run (softmax, ℓ², multi-head, Sinkhorn)", ""),
                  "start": ("index of the trace-one initial covariance on the (u, w) grid", ""),
                  "covs0": ("initial covariance Σ0 (2×2)", ""),
                  "ts": ("save times of the variant", ""),
                  "covs": ("covariance Σ(t) of the Gaussian closure at the save times (inf after a blow-up)", ""),
                  "final_cov": ("covariance where the integration stopped", ""),
                  "final_time": ("time where the integration stopped (the horizon, or the blow-up)", ""),
                  "blowup_time": ("first time tr Σ exceeded tol_high (inf if it did not)", ""),
                  "outcome": ("outcome code: index into the flag_meanings", ""),
                  "Q": ("query matrix Q of the regime", ""), "K": ("key matrix K of the regime", ""),
                  "V": ("value matrix V of the regime", "")})
    ds["outcome"].attrs["flag_meanings"] = " ".join(o.replace(" ", "_") for o in OUTCOMES)
    ds["outcome"].attrs["flag_values"] = np.arange(len(OUTCOMES))
    return ds


def _trajectory(covs, final_cov):
    """Reached saves followed by the final state (the stopping point of a blow-up)."""
    ok = np.all(np.isfinite(covs), axis=(1, 2))
    return np.concatenate([covs[ok], final_cov[None]])


def figures(res: Result, cfg: AnisotropyConfig, out_dir) -> list:
    import matplotlib.pyplot as plt
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    paths = []
    variants = list(cfg.variants)
    for regime in cfg.regimes:
        normalized = regime in ("blowup", "mixed")
        fig = plt.figure(figsize=(3.6 * len(variants), 3.8))
        covs0 = res[f"{regime}__covs0"]
        w0 = to_cone(covs0)[:, 1]
        colors = cmap((w0 - w0.min()) / max(np.ptp(w0), 1e-12))
        for k, variant in enumerate(variants):
            key = f"{regime}__{variant}"
            counts = np.bincount(res[f"{key}__outcome"], minlength=len(OUTCOMES))
            title = f"{variant}\n" + ", ".join(f"{OUTCOMES[i]} {c}" for i, c in enumerate(counts) if c)
            if normalized:
                ax = fig.add_subplot(1, len(variants), k + 1)
                th = np.linspace(0, 2 * np.pi, 200)
                ax.plot(np.cos(th), np.sin(th), "k", lw=0.8, alpha=0.5)
                for i in range(len(covs0)):
                    p = to_cone(_trajectory(res[f"{key}__covs"][i], res[f"{key}__final_cov"][i]))
                    p = p[:, :2] / p[:, 2:]
                    ax.plot(p[:, 0], p[:, 1], color=colors[i], lw=0.8, alpha=0.7)
                    ax.plot(p[-1, 0], p[-1, 1], "o", color=colors[i], ms=2)
                ax.set_aspect("equal")
                ax.set_xlabel("(a−b)/tr Σ")
                ax.set_ylabel("2c/tr Σ")
            else:
                ax = fig.add_subplot(1, len(variants), k + 1, projection="3d")
                scale = 0.0
                for i in range(len(covs0)):
                    p = to_cone(_trajectory(res[f"{key}__covs"][i], res[f"{key}__final_cov"][i]))
                    p = p[np.abs(p[:, 2]) < 10 * max(1.0, p[0, 2])]
                    ax.plot(p[:, 0], p[:, 1], p[:, 2], color=colors[i], lw=0.8, alpha=0.7)
                    ax.scatter(p[-1, 0], p[-1, 1], p[-1, 2], color=colors[i], s=4)
                    scale = max(scale, np.max(np.abs(p[:, 2])))
                u, v = np.mgrid[0 : 2 * np.pi : 60j, 0 : 1 : 10j]
                ax.plot_surface(scale * v * np.cos(u), scale * v * np.sin(u), scale * v, color="k",
                                alpha=0.06)
                if regime == "line":  # the limit line: rank-one matrices along q⊥
                    q = res[f"{regime}__Q"][0]
                    lines = [np.array([-q[1], q[0]])]
                elif regime == "two-lines":  # rank-one matrices uuᵀ with uᵀ(A + Aᵀ)u = 0
                    A = res[f"{regime}__K"].T @ res[f"{regime}__Q"]
                    lines = isotropic_directions(A + A.T)
                else:
                    lines = []
                c = np.linspace(0, scale, 20)
                for e in lines:
                    p = to_cone(np.outer(e, e)[None])[0]
                    ax.plot(p[0] * c, p[1] * c, p[2] * c, "k", lw=1.2)
                ax.view_init(elev=20, azim=-100)
                ax.set_xlabel("a−b")
                ax.set_ylabel("2c")
                ax.set_zlabel("a+b")
            ax.set_title(title, fontsize=9)
        fig.suptitle(f"Gaussian closure, d = 2: regime '{regime}'"
                     + (" (Σ/tr Σ)" if normalized else " (PSD cone)"))
        paths.append(tp.plot.save_figure(fig, out_dir / f"anisotropy_{regime}.png"))
    return paths
