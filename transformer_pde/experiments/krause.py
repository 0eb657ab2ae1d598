r"""Consensus against fragmentation in Krause attention (issue 38 item 2; docs:
math/attention.md#krause-attention): the Hegselmann–Krause picture.

n tokens evenly spaced on [0, 1] (d = 1, Q = K = V = I), moved by ``tp.KrauseAttention`` with
confidence radius r for each r of a grid until t1; the clusters at the end (Euclidean single
linkage at ``threshold``) against r. For bounded-confidence dynamics on an interval the clusters
form about 2r apart, so their number is close to 1/(2r) for small r, and one cluster (consensus)
once r is a sizeable fraction of the interval. The figure draws the final positions against r
(the bifurcation diagram) and the count against 1/(2r).

Large n (``--n 16384`` and up) runs on the layout that ``tp.KrauseAttention`` picks above 512²
pairs: tiles of 128 x 128 over the tokens sorted along the line, each query tile computing only
the key tiles within r of it (no n x n array, time O(n · neighbours);
benchmarks/README.md#krause-attention-at-large-n).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from annotated_types import Ge, Gt, Interval

import transformer_pde as tp

from .._lazy import diffrax, jnp
from ..runs.result import Result, grid
from ._base import Experiment, register
from ._options import Options, sizes

# tp.KrauseAttention's default layout (KRAUSE_LAYOUT): dense up to 512² pairs, then spatially
# sorted tiles of 128 queries x 128 keys. Restated here so that `list` and `--help` import no JAX
# (tests/experiments/test_krause.py checks it against the layout itself).
DENSE_PAIRS, TILE = 512 * 512, (128, 128)


@dataclasses.dataclass(frozen=True)
class KrauseConfig(Options):
    n: Annotated[int, Ge(2)] = 200
    radii: tuple[float, ...] = (0.04, 0.06, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4)
    """confidence radii r (> 0), one run each."""
    sigma: Annotated[float, Gt(0)] = 10.0
    """Gaussian width σ of the scores (σ much above 1: the plain HK mean over the neighbours)."""
    t1: Annotated[float, Gt(0)] = 60.0
    dt: Annotated[float, Gt(0)] = 0.1
    threshold: Annotated[float, Interval(gt=0, lt=1)] = 1e-3
    """tokens closer than this at t1 are in one cluster."""

    def validate(self):
        if any(not r > 0 for r in self.radii):
            raise ValueError(f"radii must all be > 0, got {self.radii}")

    def footprint(self):
        # the default layout streams tiles above 512² pairs: the n x n distances exist only below
        dense = self.n * self.n <= DENSE_PAIRS
        pairs = sizes(self, "n", "n") if dense else (("query block", TILE[0]), ("key block", TILE[1]))
        return {"pair distances": pairs, "final positions": sizes(self, ("len(radii)", len(self.radii)), "n")}


def line_clusters(x, threshold) -> int:
    """Single-linkage clusters of points on a line (tokens closer than ``threshold`` joined): one
    more than the gaps >= threshold between sorted neighbours; O(n log n), where the pairwise
    ``tp.diagnostics.cluster_count`` holds an n x n adjacency (17 GB at n = 2¹⁶)."""
    return 1 + int(np.sum(np.diff(np.sort(x)) >= threshold))


def compute(cfg: KrauseConfig, progress: bool = False) -> Result:
    x0 = jnp.linspace(0.0, 1.0, cfg.n)[:, None]
    finals, counts = [], []
    for r in cfg.radii:
        attn = tp.KrauseAttention.identity(1, sigma=cfg.sigma, radius=r)
        x = tp.solve(attn, x0, t1=cfg.t1, dt0=cfg.dt, solver=diffrax.Euler(),
                     saveat=diffrax.SaveAt(t1=True)).xs[-1]
        finals.append(np.asarray(x[:, 0]))
        counts.append(line_clusters(np.asarray(x[:, 0]), cfg.threshold))
    radii = np.asarray(cfg.radii, dtype=float)
    arrays = {"radii": radii, "final": np.stack(finals), "clusters": np.asarray(counts)}
    labelled = grid({"r": radii, "token": np.arange(cfg.n)},
                    final=(("r", "token"), arrays["final"]), clusters=(("r",), arrays["clusters"]),
                    describe={"r": ("confidence radius", ""), "token": ("token index (start position i/(n − 1))", ""),
                              "final": ("token positions at t1 (started evenly on [0, 1])", ""),
                              "clusters": ("clusters at t1 (Euclidean single linkage at the threshold)", "")})
    return Result(arrays, {"clusters": labelled})


def figures(res: Result, cfg: KrauseConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    radii, final, counts = res["radii"], res["final"], res["clusters"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for r, xs in zip(radii, final):
        ax1.plot(np.full_like(xs, r), xs, "k.", ms=3)
    ax1.set_xlabel("confidence radius r")
    ax1.set_ylabel("token positions at t1")
    ax1.set_title("fragmentation → consensus")
    rr = np.linspace(radii.min(), radii.max(), 200)
    ax2.plot(radii, counts, "o-", label="clusters at t1")
    ax2.plot(rr, 1 / (2 * rr), "--", label="1/(2r)")
    ax2.set_xlabel("r")
    ax2.set_yscale("log")
    ax2.legend()
    fig.suptitle(f"Krause attention on [0, 1], n = {cfg.n}, σ = {cfg.sigma:g}, t1 = {cfg.t1:g}")
    return [tp.plot.save_figure(fig, out_dir / "krause.png")]


register(Experiment(
    "krause", "Krause (bounded-confidence) attention: clusters at the end against the radius, 1/(2r) to consensus",
    KrauseConfig, compute, figures, tiny=dict(n=40, radii=(0.08, 0.15, 0.5), t1=40.0, dt=0.2)))
