r"""The unnormalized R^d model and the spectrum of V (GLPR 2305.05465;
docs: math/attention.md#the-rescaled-model-and-the-spectrum-of-v).

Tokens in R^d, β absorbed: dx_i/dt = Σ_j P_ij V x_j, P_ij = softmax_j ⟨Q x_i, K x_j⟩. The
tokens grow like e^{tV}, so one follows z_i = e^{−tV} x_i, which solves

$$\dot z_i=\sum_j P_{ij}(e^{tV}z)\,V(z_j-z_i)\qquad(\text{rows of }P\text{ sum to one}).$$

Limits by the spectrum of V (Q = K = I here; docs: math/attention.md#the-rescaled-model-and-the-spectrum-of-v):

* V = I: the z_i converge to the vertices of a convex polytope (every limit point is an
  extreme point of the set of limit points: it is the unique maximizer of ⟨z_k, ·⟩ there,
  so it attends to itself). Most limit points are vertices of the convex hull of the start
  (the authors' code gives 85–100 % of tokens within 0.1 of one, n = 20). The attention matrix falls
  to low rank.
* V with a simple top eigenvalue λ₁ > 0: the coordinates ⟨φ₁, z_i⟩ converge to at most 3
  values: the z_i end on at most 3 parallel hyperplanes.
* V = −I: all x_i → 0 (one cluster at the origin), slowly: for small x the second moment
  C = (1/n) Σ x_i x_iᵀ obeys Ċ ≈ −2C², so tr C ≈ d/(2t) [derived for the library].
* d = 1, V > 0, QK > 0 ("leaders"): P(t) converges to a Boolean matrix whose rows are e_a
  or e_b, a and b the extreme tokens (rank <= 2 generically, <= 3 in general).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result
from ._common import pid
from .configs.rd_spectrum import RdSpectrumConfig


def convex_hull_vertices(p) -> np.ndarray:
    """Indices of the vertices of the convex hull of 2-D points (Andrew's monotone chain)."""
    p = np.asarray(p, dtype=float)
    order = np.lexsort((p[:, 1], p[:, 0]))

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def chain(idx):
        out = []
        for i in idx:
            while len(out) >= 2 and cross(p[out[-2]], p[out[-1]], p[i]) <= 0:
                out.pop()
            out.append(i)
        return out

    lower, upper = chain(order), chain(order[::-1])
    return np.unique(np.array(lower[:-1] + upper[:-1]))


def distinct_values(v, tol) -> int:
    """Number of groups of sorted values separated by gaps > tol."""
    v = np.sort(np.asarray(v).ravel())
    return int(1 + np.sum(np.diff(v) > tol))


def _solve(dyn, z0, t1, ts, cfg):
    return tp.solve(dyn, z0, t1=t1, dt0=1e-3, saveat=ts, stepsize_controller=pid(cfg.rtol, z0.dtype))


def compute(cfg: RdSpectrumConfig, progress: bool = False) -> Result:
    k1, k2 = jax.random.split(jax.random.key(cfg.seed))
    z0 = jax.random.uniform(k1, (cfg.n, cfg.d), minval=-cfg.box, maxval=cfg.box)
    eye = jnp.eye(cfg.d)
    ts = jnp.linspace(0.0, cfg.t1, cfg.num_saves)
    out = {"ts": np.asarray(ts), "z0": np.asarray(z0)}
    rank = jax.vmap(lambda x: tp.diagnostics.numerical_rank(tp.diagnostics.attention_matrix(x), cfg.rank_rtol))

    # V = I: polytope vertices.
    dyn = tp.RescaledSoftmax(eye, eye, eye)
    zs = _solve(dyn, z0, cfg.t1, ts, cfg).xs
    xs = jax.vmap(dyn.unscaled)(zs, ts)
    hull = convex_hull_vertices(z0)
    dist = np.linalg.norm(np.asarray(zs[-1])[:, None] - np.asarray(z0)[hull][None], axis=-1).min(1)
    # the limit points (tokens merged at distance tol) must be vertices of their own hull
    zf = np.asarray(zs[-1])
    labels = np.asarray(tp.diagnostics.cluster_labels(jnp.asarray(zf), cfg.tol, metric=tp.diagnostics.Euclidean()))
    limits = zf[np.unique(labels)]
    out.update(identity_limit_points=limits, identity_limits_are_vertices=np.asarray(
        len(limits) < 3 or len(convex_hull_vertices(limits)) == len(limits)))
    out.update(identity_zs=np.asarray(zs), identity_rank=np.asarray(rank(xs)), hull=hull,
               identity_dist_to_hull_vertex=dist,
               identity_fraction_at_vertex=np.asarray(np.mean(dist < cfg.tol)))

    # Simple top eigenvalue: parallel hyperplanes ⟨φ₁, z⟩ = const.
    V = jnp.diag(jnp.asarray([1.0] + [cfg.top_ratio] * (cfg.d - 1)))
    dyn = tp.RescaledSoftmax(eye, eye, V)
    zs = _solve(dyn, z0, cfg.t1, ts, cfg).xs
    out.update(top_zs=np.asarray(zs), top_rank=np.asarray(rank(jax.vmap(dyn.unscaled)(zs, ts))),
               top_num_levels=np.asarray(distinct_values(zs[-1][:, 0], cfg.tol)))

    # V = −I: one cluster at the origin, in the original variables x.
    sol = _solve(tp.SoftmaxAttention(eye, eye, -eye, 1.0), z0, cfg.t1, ts, cfg)
    second = jnp.mean(jnp.sum(sol.xs**2, axis=-1), axis=-1)
    out.update(negative_xs=np.asarray(sol.xs), negative_second_moment=np.asarray(second),
               negative_max_norm=np.asarray(jnp.max(jnp.linalg.norm(sol.xs, axis=-1), axis=-1)))

    # d = 1 leaders: P(t) -> Boolean.
    ts1 = jnp.linspace(0.0, cfg.t1_1d, cfg.num_saves)
    one = jnp.ones((1, 1))
    z1 = jax.random.normal(k2, (cfg.n1d, 1))
    dyn = tp.RescaledSoftmax(one, one, one)
    zs1 = _solve(dyn, z1, cfg.t1_1d, ts1, cfg).xs
    P = jax.vmap(lambda z, t: tp.diagnostics.attention_matrix(dyn.unscaled(z, t)))(zs1, ts1)
    out.update(ts_1d=np.asarray(ts1), leaders_zs=np.asarray(zs1[..., 0]), leaders_P=np.asarray(P),
               leaders_rank=np.asarray(jax.vmap(lambda p: tp.diagnostics.numerical_rank(p, cfg.rank_rtol))(P)),
               leaders=np.asarray([int(jnp.argmin(z1[:, 0])), int(jnp.argmax(z1[:, 0]))]))
    return Result(out)


def boolean_rows(P, tol=1e-3) -> int:
    """Rows of P within ``tol`` (max norm) of a standard basis vector."""
    P = np.asarray(P)
    return int(np.sum(np.abs(P.max(axis=1) - 1) < tol))


def figures(res: Result, cfg: RdSpectrumConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    ts, z0 = res["ts"], res["z0"]
    fig, axs = plt.subplots(2, 3, figsize=(14, 8.6), layout="constrained")
    hull = np.append(res["hull"], res["hull"][0])
    ax = axs[0, 0]
    zs = res["identity_zs"]
    ax.plot(*z0[res["hull"]][np.argsort(np.arctan2(*(z0[res["hull"]] - z0[res["hull"]].mean(0)).T[::-1]))].T,
            "k:", lw=0.8)
    for i in range(cfg.n):
        ax.plot(zs[:, i, 0], zs[:, i, 1], color="0.7", lw=0.7)
    ax.scatter(*z0.T, s=12, facecolors="none", edgecolors="0.4", label="z(0)")
    ax.scatter(*zs[-1].T, s=30, color="C3", label=f"z({ts[-1]:g})")
    ax.set_title(f"V = I: {100 * float(res['identity_fraction_at_vertex']):.0f}% of tokens within "
                 f"{cfg.tol} of a hull vertex", fontsize=9)
    ax.legend(fontsize=7)
    ax.set_aspect("equal")
    del hull
    ax = axs[0, 1]
    zs = res["top_zs"]
    for i in range(cfg.n):
        ax.plot(zs[:, i, 0], zs[:, i, 1], color="0.7", lw=0.7)
    ax.scatter(*z0.T, s=12, facecolors="none", edgecolors="0.4")
    ax.scatter(*zs[-1].T, s=30, color="C2")
    for v in np.unique(np.round(zs[-1][:, 0], 1)):
        ax.axvline(v, color="C2", ls=":", lw=0.8)
    ax.set_title(f"V = diag(1, {cfg.top_ratio:g}): ⟨φ₁, z⟩ → {int(res['top_num_levels'])} values "
                 "(parallel lines)", fontsize=9)
    ax.set_aspect("equal")
    ax = axs[0, 2]
    ax.semilogy(ts[1:], res["negative_second_moment"][1:], label="(1/n) Σ|x_i|²")
    ax.semilogy(ts[1:], cfg.d / (2 * ts[1:]), "k:", label="d/(2t)")
    ax.semilogy(ts, res["negative_max_norm"], label="max |x_i|")
    ax.set_xlabel("t")
    ax.set_title("V = −I: all tokens → 0 (in x)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axs[1, 0]
    ax.plot(ts, res["identity_rank"], label="V = I")
    ax.plot(ts, res["top_rank"], label=f"V = diag(1, {cfg.top_ratio:g})")
    ax.plot(res["ts_1d"], res["leaders_rank"], label="d = 1")
    ax.set_xlabel("t")
    ax.set_ylabel(f"numerical rank of P (rtol {cfg.rank_rtol:g})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axs[1, 1]
    for i in range(cfg.n1d):
        ax.plot(res["ts_1d"], res["leaders_zs"][:, i], lw=0.9)
    ax.set_xlabel("t")
    ax.set_ylabel("z_i (d = 1)")
    ax.set_title("d = 1: tokens follow the two leaders", fontsize=9)
    ax = axs[1, 2]
    ax.imshow(res["leaders_P"][-1], cmap="Greys", vmin=0, vmax=1)
    ax.set_title(f"d = 1: P at t = {res['ts_1d'][-1]:g} (Boolean, rank "
                 f"{int(res['leaders_rank'][-1])}; leaders {res['leaders'].tolist()})", fontsize=9)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    return [tp.plot.save_figure(fig, out_dir / "rd_spectrum.png")]
