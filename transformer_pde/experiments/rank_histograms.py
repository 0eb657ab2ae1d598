r"""Ranks of limit covariances of the Gaussian closure for d = 3, 4, 5 (euclidean.md §5.1–5.2, §6).

Q ∈ R^{⌊d/2⌋×d} standard normal, K = −Q (so A = −QᵀQ/√d ⪯ 0), Σ0 = GGᵀ, and V = I or
V = GᵀG, for softmax and ℓ² attention (the authors' ``histograms.py`` set-up). Theory:

* V = I (softmax): Σ(t) = (Σ0⁻¹ − t(A + Aᵀ))⁻¹ → Π(ΠᵀΣ0⁻¹Π)⁻¹Πᵀ, of rank
  dim ker(A + Aᵀ) = d − rank Q = ⌈d/2⌉ exactly.
* V symmetric positive definite: stationary points need QΣ = 0, so every limit has rank
  ≤ d − rank Q = ⌈d/2⌉.

The moment ODEs are integrated to ``t_long`` with an implicit solver (Kvaerno5, adaptive):
with V ≠ I the approach to a low-rank limit is stiff, and explicit Runge–Kutta needs
10⁵ steps for some draws. Vanishing eigenvalues decay
like 1/t while the others converge, so the rank counts the eigenvalues λ_k with
λ_k(t_long) / λ_k(t_long/10) > ``keep_ratio`` (about 0.1 for a vanishing one, about 1 for a
persisting one): no absolute threshold, which would miscount limits with a small eigenvalue.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import diffrax
import jax
import numpy as np

from .. import plot
from ..measures import Gaussian
from ..models import L2Attention, SoftmaxAttention
from ..solvers import solve
from ._base import Experiment, register
from ._options import Options, require_above, require_at_least, require_between
from ._progress import progress_bar
from ._result import Result

VARIANTS = ("softmax", "l2")
VALUES = ("identity", "spd")


@dataclasses.dataclass(frozen=True)
class RankConfig(Options):
    dims: tuple[int, ...] = (3, 4, 5)
    runs: int = 100
    """Initial covariances (and parameter draws) per dimension."""
    t_long: float = 1e5
    keep_ratio: float = 0.5
    rtol: float = 1e-7
    max_steps: int = 50_000
    """Step budget per run; runs that exhaust it are reported with rank -1 ('unfinished')."""
    seed: int = 40
    variants: tuple[Literal["softmax", "l2"], ...] = VARIANTS

    def validate(self):
        require_at_least(self, dims=2, runs=1)
        require_above(self, t_long=0, rtol=0)
        require_between(self, "keep_ratio", 0, 1, closed="()")


def draw(d: int, runs: int, seed: int):
    """Per run: Q (⌊d/2⌋, d), Σ0 = GGᵀ and the SPD value matrix GᵀG (independent G's)."""
    rng = np.random.default_rng([seed, d])
    Q = rng.standard_normal((runs, d // 2, d))
    G0 = rng.standard_normal((runs, d, d))
    Gv = rng.standard_normal((runs, d, d))
    return Q, G0 @ np.swapaxes(G0, 1, 2), np.swapaxes(Gv, 1, 2) @ Gv


def _attention(variant, Q, V, d):
    cls = SoftmaxAttention if variant == "softmax" else L2Attention
    return cls(Q, -Q, V, 1 / np.sqrt(d))


def limit_ranks(mid_covs, final_covs, keep_ratio):
    """Number of eigenvalues that persist between t_long/10 and t_long (and are not at the
    rounding level of the largest one, where the ratio is noise)."""
    lam_mid, lam_end = np.linalg.eigvalsh(mid_covs), np.linalg.eigvalsh(final_covs)
    floor = 1e-9 * lam_end[..., -1:]
    return np.sum((lam_end > keep_ratio * lam_mid) & (lam_end > floor), axis=-1)


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
                # compiled solve is reused (same shapes), so there is one compilation.
                Vs = np.concatenate([np.broadcast_to(np.eye(d), Vspd.shape), Vspd])
                mid, final, tblow, done = [], [], [], []
                for q, v, cov0 in zip(np.concatenate([Q, Q]), Vs, np.concatenate([S0, S0])):
                    sol = solve(_attention(variant, q, v, d),
                                         Gaussian(np.zeros(d), cov0), t1=cfg.t_long, dt0=1e-3,
                                         solver=diffrax.Kvaerno5(), stepsize_controller=pid,
                                         max_steps=cfg.max_steps, throw=False,
                                         saveat=np.asarray([0.1 * cfg.t_long, cfg.t_long]))
                    done.append(bool(sol.succeeded) and not bool(sol.blew_up))
                    mid.append(np.asarray(sol.covs[0]))
                    final.append(np.asarray(sol.final_cov))
                    tblow.append(float(sol.blowup_time))
                mid, final, tblow = np.asarray(mid), np.asarray(final), np.asarray(tblow)
                # runs that ran out of steps (or blew up) get rank -1, like the authors'
                # dropped runs; they are counted, not hidden
                with np.errstate(invalid="ignore"):
                    ranks = np.where(done, limit_ranks(mid, final, cfg.keep_ratio), -1)
                for k, vname in enumerate(VALUES):
                    sl = slice(k * cfg.runs, (k + 1) * cfg.runs)
                    key = f"d{d}__{variant}__{vname}"
                    out[f"{key}__ranks"] = ranks[sl]
                    out[f"{key}__final_cov"] = final[sl]
                    out[f"{key}__blowup_time"] = tblow[sl]
                    hist = np.bincount(ranks[sl][ranks[sl] >= 0], minlength=d + 1)
                    bar.note(f"d={d} {variant:>7} V={vname:<8}: rank counts {hist.tolist()} "
                             f"(bound ⌈d/2⌉ = {(d + 1) // 2}), unfinished {int(np.sum(ranks[sl] < 0))}")
                bar.update()
    return Result(out)


def figures(res: Result, cfg: RankConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    dims = list(cfg.dims)
    variants = list(cfg.variants)
    fig, axes = plt.subplots(len(VALUES), len(variants), figsize=(4.2 * len(variants), 6.0),
                             squeeze=False)
    width = 0.8 / len(dims)
    for i, vname in enumerate(VALUES):
        for j, variant in enumerate(variants):
            ax = axes[i, j]
            for k, d in enumerate(dims):
                ranks = res[f"d{d}__{variant}__{vname}__ranks"]
                counts = np.bincount(ranks[ranks >= 0], minlength=max(dims) + 1)
                ax.bar(np.arange(max(dims) + 1) + (k - (len(dims) - 1) / 2) * width, counts,
                       width=width, label=f"d = {d} (⌈d/2⌉ = {(d + 1) // 2}), "
                                          f"unfinished {int(np.sum(ranks < 0))}")
            ax.set_title(f"{variant}, V = {'I' if vname == 'identity' else 'GᵀG'}")
            ax.set_xlabel("rank of the limit covariance")
            ax.set_ylabel("runs")
            ax.set_xticks(range(max(dims) + 1))
            ax.legend(fontsize=8)
    fig.suptitle("Q ∈ R^{⌊d/2⌋×d}, K = −Q: limit ranks ≤ ⌈d/2⌉")
    fig.tight_layout()
    return [plot.save_figure(fig, out_dir / "rank_histograms.png")]


register(Experiment(
    name="rank-histograms",
    summary="ranks of limit covariances for d=3,4,5 with K=-Q (softmax, L2): always <= ceil(d/2)",
    config=RankConfig,
    compute=compute,
    figures=figures,
    tiny={"dims": (3, 4), "runs": 4, "t_long": 1e4, "rtol": 1e-6, "variants": ("softmax",)},
))
