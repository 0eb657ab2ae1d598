r"""Ranks of limit covariances of the Gaussian closure for d = 3, 4, 5 (docs: math/gaussian.md#long-time-behaviour).

Q ∈ R^{⌊d/2⌋×d} standard normal, K = −Q (so A = −QᵀQ/√d ⪯ 0), Σ0 = GGᵀ, and V = I or
V = GᵀG, for softmax and ℓ² attention (the authors' ``histograms.py`` set-up). Theory:

* V = I (softmax): Σ(t) = (Σ0⁻¹ − t(A + Aᵀ))⁻¹ → Π(ΠᵀΣ0⁻¹Π)⁻¹Πᵀ, of rank
  dim ker(A + Aᵀ) = d − rank Q = ⌈d/2⌉ exactly.
* V symmetric positive definite: stationary points need QΣ = 0, so every limit has rank
  ≤ d − rank Q = ⌈d/2⌉.

The moment ODEs are integrated to ``t_long`` with an implicit solver (Kvaerno5, adaptive):
with V ≠ I the approach to a low-rank limit is stiff, and explicit Runge–Kutta needs
10⁵ steps for some draws. The rank is read from the covariances at three decades t/100, t/10, t,
with no absolute threshold (which would miscount limits with a small eigenvalue):

* the candidate rank r is the number of directions that did not vanish over the last decade:
  the generalized eigenvalues μ of (Σ(t), Σ(t/10)) with μ ≥ ``keep_ratio`` (a vanishing direction
  ends up shrinking like 1/t, μ ≈ 0.1; counted by inertia, so a vanishing eigenvalue passing a
  small persisting one is not mistaken for it);
* r is the rank once the r largest eigenvalues have **settled**: each changed over the last decade
  by less than ``settle_tol`` and either by less than the solver's accuracy or in the same
  direction as over the decade before and at most half as much (a persisting eigenvalue converges
  like λ∞ + a/t, its changes shrinking tenfold per decade).

Otherwise the run is still moving. With V = GᵀG some eigenvalues decay like 1/(c + εt) with
εt ≪ c up to t ≈ 10⁵ and beyond, changes that *grow* from decade to decade (d = 3, seed 40,
run 58: λ₃ = 4e-3, 3e-3, 2e-3, 5e-4, 6e-5 at t = 10³ … 10⁷; d = 4, run 76: a plateau at 1.5e-4
from 10⁵ to 10⁶ whose field Σ̇ still drives it to zero on a scale of 10⁸), and some persisting
eigenvalues are still approaching their limit (d = 3, run 77: 0.039, 0.019, 0.017, 0.0167 at
t = 10⁴ … 10⁷). Such a run is solved again to the next decade (with ``late_rtol``), up to
``t_max``; one still moving there, or whose solver runs out of steps first, is reported
**unconverged** (rank −2) and counted apart, like runs whose first solve failed (rank −1,
"unfinished"), never as a rank. The earlier rule, λ_k(t_long) > ``keep_ratio`` · λ_k(t_long/10) on
sorted eigenvalues alone, counted the slowly vanishing ones as rank ⌈d/2⌉ + 1 and the slowly
settling ones (and a small persisting eigenvalue being passed) as ⌈d/2⌉ − 1.
"""
from __future__ import annotations

import diffrax
import jax
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._progress import progress_bar
from .configs.rank_histograms import RankConfig

VALUES = ("identity", "spd")
UNFINISHED = -1
"""Rank code of a run whose solver failed (step budget exhausted, or a blow-up)."""
UNCONVERGED = -2
"""Rank code of a run with an eigenvalue still shrinking, undecided at ``t_max``."""


def draw(d: int, runs: int, seed: int):
    """Per run: Q (⌊d/2⌋, d), Σ0 = GGᵀ and the SPD value matrix GᵀG (independent G's)."""
    rng = np.random.default_rng([seed, d])
    Q = rng.standard_normal((runs, d // 2, d))
    G0 = rng.standard_normal((runs, d, d))
    Gv = rng.standard_normal((runs, d, d))
    return Q, G0 @ np.swapaxes(G0, 1, 2), np.swapaxes(Gv, 1, 2) @ Gv


ATTENTIONS = {"softmax": lambda: tp.SoftmaxAttention, "l2": lambda: tp.L2Attention}
"""The attention class each ``variants`` name builds (with K = −Q and scores over √d)."""


def _attention(variant, Q, V, d):
    return ATTENTIONS[variant]()(Q, -Q, V, 1 / np.sqrt(d))


def decade_ratios(earlier, later, floor: float) -> np.ndarray:
    """How the covariance changed over a decade, direction by direction: the generalized
    eigenvalues μ of (``later``, ``earlier``), i.e. of Σ_e^{-1/2} Σ_l Σ_e^{-1/2}, descending, on the
    directions where ``earlier`` is above ``floor`` (directions below it are not resolved and
    count as vanished). By Sylvester's law of inertia the number of μ ≥ c is the number of
    directions in which Σ_l ≥ cΣ_e, whatever the eigenvalues do: unlike ratios of sorted
    eigenvalues, it is not fooled when a vanishing eigenvalue passes a small persisting one."""
    s, U = np.linalg.eigh(np.asarray(earlier, dtype=np.float64))
    keep = s > floor
    W = U[:, keep] / np.sqrt(s[keep])
    return np.linalg.eigvalsh(W.T @ np.asarray(later, dtype=np.float64) @ W)[::-1]


def decided_rank(covs, keep_ratio: float, settle_tol: float, noise: float,
                 floor: float) -> tuple[int | None, np.ndarray]:
    """The rank from the covariances at three consecutive decades t/100, t/10, t (``covs`` shape
    ``(3, d, d)``), or None while undecided (module docstring), and the ratios μ of the last
    decade it was read from (:func:`decade_ratios`).

    The candidate rank r is the number of directions that did not vanish over the last decade
    (:func:`decade_ratios` μ ≥ ``keep_ratio``); it is decided when the r largest eigenvalues have
    settled: each changed over the last decade by less than ``settle_tol`` (relative), and either
    by less than the solver's accuracy (``noise``, plus ``floor``/λ for the absolute tolerance) or
    in the same direction as over the decade before and at most half as much. A persisting
    eigenvalue converges like λ∞ + a/t, its changes shrinking tenfold per decade (more slowly
    while a vanishing eigenvalue still drags it: twofold is required); a slowly
    vanishing one, 1/(c + εt), changes more every decade; one that turns back has not settled; and
    while a vanishing eigenvalue is still above a small persisting one, the r largest include it."""
    covs = np.asarray(covs, dtype=np.float64)
    floor = max(floor, 1e-9 * float(np.linalg.eigvalsh(covs[1])[-1]))
    mu = decade_ratios(covs[1], covs[2], floor)
    rank = int(np.sum(mu >= keep_ratio))
    top = np.linalg.eigvalsh(covs)[:, ::-1][:, :rank]
    with np.errstate(invalid="ignore", divide="ignore"):
        last, prev = np.log(top[2] / top[1]), np.log(top[1] / top[0])
        accuracy = noise + floor / np.abs(top[2])
    slowing = (np.sign(last) == np.sign(prev)) & (np.abs(last) <= np.abs(prev) / 2)
    settled = (np.abs(last) < settle_tol) & ((np.abs(last) < accuracy) | slowing)
    return (rank if np.all(settled) else None), mu


def limit_rank(attention, cov0, cfg: RankConfig, pid=None) -> dict:
    """One run: its ``rank`` (or UNFINISHED / UNCONVERGED), the decade it was read at (the last
    one reached when unconverged), the covariance and its eigenvalues then, and the ratios μ of
    the last decade read (:func:`decade_ratios`, padded with NaN). ``pid``: the controller of the
    first solve (default: rtol, atol = 1e-3 rtol); longer solves use ``late_rtol``."""
    d = cov0.shape[0]
    controllers = [pid if pid is not None else diffrax.PIDController(rtol=cfg.rtol, atol=1e-3 * cfg.rtol),
                   diffrax.PIDController(rtol=cfg.late_rtol, atol=1e-3 * cfg.late_rtol)]

    def run(saves, controller):
        return tp.solve(attention, tp.Gaussian(np.zeros(d), cov0), t1=saves[-1], dt0=1e-3,
                     solver=diffrax.Kvaerno5(), stepsize_controller=controller, max_steps=cfg.max_steps,
                     throw=False, saveat=saves)

    def failed(sol):
        return not bool(sol.succeeded) or bool(sol.blew_up)

    times = cfg.decades
    out = {"rank": UNCONVERGED}
    for k in range(2, len(times)):
        # read at t/100, t/10, t; a run still undecided is solved again to the next decade (the
        # same three saves: one compiled solve for every later decade)
        controller = controllers[min(k - 2, 1)]
        sol = run(times[k - 2:k + 1], controller)
        if failed(sol):
            if k == 2:
                return {"rank": UNFINISHED, "blowup_time": float(sol.blowup_time), "decided_time": float(times[2]),
                        "final_cov": np.asarray(sol.final_cov), "eigenvalues": np.full(d, np.nan),
                        "decade_ratios": np.full(d, np.nan)}
            break  # out of steps before deciding: unconverged, read at the last decade reached
        covs = np.asarray(sol.covs)
        # noise: the solver's accuracy (10 rtol); floor: 100 atol, below which a covariance
        # direction is the solver's absolute error
        noise, floor = 10 * controller.rtol, 100 * controller.atol
        rank, mu = decided_rank(covs, cfg.keep_ratio, cfg.settle_tol, noise, floor)
        out = {"rank": rank, "blowup_time": float(sol.blowup_time), "decided_time": float(times[k]),
               "final_cov": np.asarray(sol.final_cov), "eigenvalues": np.linalg.eigvalsh(covs[2]),
               "decade_ratios": np.pad(mu, (0, d - len(mu)), constant_values=np.nan)}
        if out["rank"] is not None:
            return out
    return {**out, "rank": UNCONVERGED}


def compute(cfg: RankConfig, progress: bool = False) -> Result:
    out = {}
    dims = list(cfg.dims)
    pid = diffrax.PIDController(rtol=cfg.rtol, atol=1e-3 * cfg.rtol)
    bar = progress_bar(progress, total=len(dims) * len(cfg.variants), desc="rank-histograms")
    with jax.enable_x64(True), bar:
        for d in dims:
            Q, S0, Vspd = draw(d, cfg.runs, cfg.seed)
            out[f"d{d}__cov0"] = S0
            for variant in cfg.variants:
                # a plain loop, not vmap: runs need from ~100 to a few thousand adaptive steps,
                # and a vmapped solve would step every run until the slowest is done. The
                # compiled solve is reused (same shapes), so there is one compilation (two
                # with the longer solves of undecided runs).
                Vs = np.concatenate([np.broadcast_to(np.eye(d), Vspd.shape), Vspd])
                runs = [limit_rank(_attention(variant, q, v, d), cov0, cfg, pid)
                        for q, v, cov0 in zip(np.concatenate([Q, Q]), Vs, np.concatenate([S0, S0]))]
                # runs that ran out of steps (or blew up) get rank -1, like the authors' dropped
                # runs, and runs still shrinking at t_max rank -2: counted, not hidden
                ranks = np.array([r["rank"] for r in runs])
                for k, vname in enumerate(VALUES):
                    sl = slice(k * cfg.runs, (k + 1) * cfg.runs)
                    key = f"d{d}__{variant}__{vname}"
                    out[f"{key}__ranks"] = ranks[sl]
                    for name in ("final_cov", "blowup_time", "decided_time", "eigenvalues", "decade_ratios"):
                        out[f"{key}__{name}"] = np.asarray([r[name] for r in runs[sl]])
                    out[f"{key}__unconverged"] = np.sum(ranks[sl] == UNCONVERGED)
                    out[f"{key}__unfinished"] = np.sum(ranks[sl] == UNFINISHED)
                    bar.note(f"d={d} {variant:>7} V={vname:<8}: {summary(ranks[sl], d)}")
                bar.update()
    return Result(out)


def summary(ranks, d: int) -> str:
    hist = np.bincount(ranks[ranks >= 0], minlength=d + 1)
    return (f"rank counts {hist.tolist()} (bound ⌈d/2⌉ = {(d + 1) // 2}), unconverged "
            f"{int(np.sum(ranks == UNCONVERGED))}, unfinished {int(np.sum(ranks == UNFINISHED))}")


def figures(res: Result, cfg: RankConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    dims = list(cfg.dims)
    variants = list(cfg.variants)
    top = max(dims)
    fig, axes = plt.subplots(len(VALUES), len(variants), figsize=(4.6 * len(variants), 6.0),
                             squeeze=False)
    width = 0.8 / len(dims)
    # columns: ranks 0 … max d, then the runs counted apart (not a rank)
    labels = [str(r) for r in range(top + 1)] + ["unconv.", "unfin."]
    for i, vname in enumerate(VALUES):
        for j, variant in enumerate(variants):
            ax = axes[i, j]
            for k, d in enumerate(dims):
                ranks = res[f"d{d}__{variant}__{vname}__ranks"]
                counts = np.concatenate([np.bincount(ranks[ranks >= 0], minlength=top + 1),
                                         [np.sum(ranks == UNCONVERGED), np.sum(ranks == UNFINISHED)]])
                ax.bar(np.arange(top + 3) + (k - (len(dims) - 1) / 2) * width, counts, width=width,
                       color=f"C{k}", label=f"d = {d} (⌈d/2⌉ = {(d + 1) // 2})")
            ax.axvline(top + 0.5, color="0.5", lw=0.8, ls=":")
            ax.set_title(f"{variant}, V = {'I' if vname == 'identity' else 'GᵀG'}")
            ax.set_xlabel("rank of the limit covariance (runs not settled: right)")
            ax.set_ylabel("runs")
            ax.set_xticks(range(top + 3), labels)
            ax.legend(fontsize=8)
    fig.suptitle(f"Q ∈ R^{{⌊d/2⌋×d}}, K = −Q: limit ranks ≤ ⌈d/2⌉ (decided by t ≤ {cfg.t_max:g})")
    fig.tight_layout()
    return [tp.plot.save_figure(fig, out_dir / "rank_histograms.png")]
