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

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.programs import compile_program
from ..runs.result import Result, grid
from ._common import import_end_modules_meanwhile
from .configs.krause import KrauseConfig


def final_positions(cfg: KrauseConfig, x0):
    """The tokens at t1 from ``x0`` for each radius of ``cfg.radii`` (one solve per radius, a
    ``lax.map``) and each run's ``nonfinite_time`` (inf where it stayed finite): one program, which
    :func:`compute` keeps between processes (a second run imports neither diffrax nor equinox).
    Its inputs are checked before it (the radii by the config, x0 an even grid): it holds no
    runtime check, so a NaN or inf is reported as a value, raised after the program."""
    import diffrax
    import equinox as eqx

    tp.runs.finite_by_construction([x0])
    attention = tp.KrauseAttention.identity(1, sigma=cfg.sigma, radius=cfg.radii[0])

    def one(r):
        attn = eqx.tree_at(lambda a: a.radius, attention, r)  # r > 0: KrauseConfig.validate
        sol = tp.solve(attn, x0, t1=cfg.t1, dt0=cfg.dt, solver=diffrax.Euler(),
                       saveat=diffrax.SaveAt(t1=True), throw=False)
        return sol.xs[-1, :, 0], sol.nonfinite_time

    return jax.lax.map(one, jnp.asarray(cfg.radii, dtype=attention.radius.dtype))


def compute(cfg: KrauseConfig, progress: bool = False) -> Result:
    x0 = jnp.linspace(0.0, 1.0, cfg.n)[:, None]
    program = compile_program(final_positions, (cfg,), (x0,))
    import_end_modules_meanwhile()  # while the program runs, which does not hold the GIL
    finals, nonfinite = (np.asarray(a) for a in program(x0))
    tp.runs.raise_if_nonfinite("krause", nonfinite, {"radius": np.asarray(cfg.radii, dtype=float)},
                               "the step dt is too large")
    counts = [tp.diagnostics.gap_clusters(x, cfg.threshold) for x in finals]  # O(n log n): no n × n adjacency
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
    # fixed margins, not layout="constrained": its passes over the tick labels were most of the
    # figure's time (as in phase-diagram)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.86, wspace=0.22)
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
    tp.plot.plain_log_labels(ax2.yaxis)
    ax2.legend()
    fig.suptitle(f"Krause attention on [0, 1], n = {cfg.n}, σ = {cfg.sigma:g}, t1 = {cfg.t1:g}")
    return [tp.plot.save_figure(fig, out_dir / "krause.png", trim=False)]  # margins fixed: drawn once
