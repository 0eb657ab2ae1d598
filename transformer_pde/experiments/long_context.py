r"""The critical temperature of long-context attention (issue 38 item 1; docs:
math/attention.md#long-context-critical-temperature).

A fixed query q against n i.i.d. uniform keys on S^{d−1}, n = 2^{log2_n_min} … 2^{log2_n_max}: for
each d and n, the entropy H, the effective number of keys e^H and the largest weight of the
softmax weights w_i ∝ e^{β⟨q, k_i⟩}, on a grid of β = λ (A_d n)^{2/(d−1)} around the law of
Bruno–Rigollet–Chen–Polyanskiy–Lin (arXiv 2605.08505). The keys are streamed in chunks drawn
from a fold of the PRNG key, all β at once per chunk (nothing of size n is held), with the
distance u = 1 − ⟨q, k⟩ computed without cancellation (float32 keeps u ~ 1e-14 at d = 2,
n = 2^24, where 1 − cos would be zero).

The measured critical β_n* is the entropy-collapse point: per draw, the β at which e^H falls to
``collapse_keys`` (H decreases in β: dH/dβ = −β Var_w(u)), interpolated in log β. Its exponent
in n is fitted per d (:func:`transformer_pde.statistics.fit_rate`, seeds resampled for the
interval) against 2/(d−1); the same points are drawn against the γ log n law (arXiv 2510.05554)
and the gap-counting scale sup_t log N_n(t)/t of Hayase–Karakida (arXiv 2605.12697). The limits:
the law-of-large-numbers entropy below criticality and the Poisson limit at it
(:mod:`transformer_pde.theory.long_context`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.result import Result, grid
from ._progress import progress_bar
from .configs.long_context import LongContextConfig

# ----------------------------------------------------------------------------- streamed keys


def fine_normal(key, shape, dtype):
    """Standard normal numbers with relative precision near 0: √2 erfinv(U) with a random sign,
    U uniform on [0, 1) built from 23 random bits plus a uniform fraction of the last bit.
    ``jax.random.normal`` maps a uniform on a grid of spacing 2^-22 through erfinv, so its values
    near 0 lie on a grid of ~3e-7: at d = 2 the nearest of 2^20 keys (angle ~1e-6) would sit on
    a few grid points."""
    k1, k2 = jax.random.split(key)
    bits = jax.random.bits(k1, shape, jnp.uint32)
    sign = jnp.where(bits >> 31 == 1, 1.0, -1.0).astype(dtype)
    hi = (bits & (2**23 - 1)).astype(dtype)
    lo = jax.random.uniform(k2, shape, dtype)
    below_one = 1.0 - float(jnp.finfo(dtype).epsneg)
    mag = jnp.minimum((hi + lo) * 2.0**-23, below_one)  # (hi + lo) may round up to 2^23 in float32
    return sign * np.sqrt(2.0).astype(dtype) * jax.scipy.special.erfinv(mag)


def chunk_keys(key, index, chunk: int, d: int, dtype=None):
    """The keys of chunk ``index`` (unit vectors, shape ``(chunk, d)``) for the query e_1, and
    their distances u = 1 − k_1 to it: standard normal vectors g (:func:`fine_normal`) normalized, u computed as
    |g_⊥|²/(|g|(|g| + g_1)) where g_1 > 0 (no cancellation as k_1 → 1). ``dtype``: JAX's default
    float unless given."""
    g = fine_normal(jax.random.fold_in(key, index), (chunk, d), dtype or jnp.result_type(float))
    g1 = g[:, 0]
    r2 = jnp.sum(g[:, 1:] ** 2, axis=1)
    norm = jnp.sqrt(g1**2 + r2)
    u = jnp.where(g1 > 0, r2 / (norm * (norm + g1)), (norm - g1) / norm)
    return g / norm[:, None], u


def _accumulate(m, a, b, u, valid, betas):
    """One chunk into the running sums, for every β at once: m the smallest u so far (shape
    ``batch``), a(β) = Σ e^{−β(u − m)} and b(β) = Σ (u − m) e^{−β(u − m)} (``batch + (G,)``),
    u the chunk's distances (``batch + (C,)``), ``valid`` which of them count."""
    u = jnp.where(valid, u, jnp.inf)
    m_new = jnp.minimum(m, jnp.min(u, axis=-1))
    shift = (m - m_new)[..., None]  # >= 0: the old sums move to the new minimum
    f = jnp.exp(-betas.reshape((1,) * m.ndim + (-1,)) * shift)
    x = jnp.where(valid, u - m_new[..., None], 0.0)
    e = jnp.where(valid[..., None], jnp.exp(-betas.reshape((1,) * x.ndim + (-1,)) * x[..., None]), 0.0)
    b = f * (b + shift * a) + jnp.sum(x[..., None] * e, axis=-2)
    a = f * a + jnp.sum(e, axis=-2)
    return m_new, a, b


@functools.cache
def _jitted(fun, static: tuple[str, ...]):
    # jitted on first use, not at import: `list` and `--help` import this module without JAX
    return jax.jit(fun, static_argnames=static)


def _stream(keys, n, betas, *, chunk: int, d: int, top: int):
    """Per key of ``keys`` (a batch of PRNG keys, one per seed): the nearest distance u_min,
    a(β), b(β) of :func:`_accumulate` and the ``top`` smallest u, accumulated over ceil(n/chunk)
    chunks (the last one masked beyond n)."""
    idx = jnp.arange(chunk)

    def one(key):
        def body(i, carry):
            m, a, b, best = carry
            _, u = chunk_keys(key, i, chunk, d, betas.dtype)
            valid = i * chunk + idx < n
            m, a, b = _accumulate(m, a, b, u, valid, betas)
            best = -jax.lax.top_k(-jnp.concatenate([best, jnp.where(valid, u, jnp.inf)]), top)[0]
            return m, a, b, best

        zeros = jnp.zeros_like(betas)
        init = (jnp.asarray(4.0, betas.dtype), zeros, zeros, jnp.full((top,), jnp.inf, betas.dtype))
        return jax.lax.fori_loop(0, (n + chunk - 1) // chunk, body, init)

    return jax.vmap(one)(keys)


def _layer(x, betas, *, rows: int, cols: int):
    """a(β), b(β) of every row of the self-attention of tokens ``x`` (each token a query against
    all, itself included), in blocks of rows × cols pairs; u = |x_i − x_j|²/2 keeps its relative
    precision for near pairs."""
    n = x.shape[0]

    def row_block(r):
        xr = jax.lax.dynamic_slice_in_dim(x, r * rows, rows)

        def body(c, carry):
            xc = jax.lax.dynamic_slice_in_dim(x, c * cols, cols)
            u = 0.5 * jnp.sum((xr[:, None, :] - xc[None, :, :]) ** 2, axis=-1)
            return _accumulate(*carry, u, jnp.ones(cols, bool), betas)

        zeros = jnp.zeros((rows, betas.size), betas.dtype)
        m, a, b = jax.lax.fori_loop(0, n // cols, body, (jnp.full((rows,), 4.0, betas.dtype), zeros, zeros))
        return a, b

    a, b = jax.lax.map(row_block, jnp.arange(n // rows))
    return a.reshape(n, -1), b.reshape(n, -1)


def layer_statistics(key, n: int, d: int, betas, *, block: int = 256):
    """Entropy and largest weight of every row of the self-attention of n tokens uniform on
    S^{d−1} (``(n, len(betas))`` each; row i is token i's weights over all n tokens, its own
    included). n a multiple of ``block`` or below it."""
    betas = jnp.asarray(betas, dtype=jnp.result_type(float))
    g = fine_normal(key, (n, d), betas.dtype)
    x = g / jnp.linalg.norm(g, axis=1, keepdims=True)
    rows = min(block, n)
    if n % rows:
        raise ValueError(f"n ({n}) must be a multiple of block ({block}) or below it")
    cols = min(4 * rows, n) if n % min(4 * rows, n) == 0 else rows
    a, b = _jitted(_layer, ("rows", "cols"))(x, betas, rows=rows, cols=cols)
    a, b, beta = (np.asarray(v, dtype=np.float64) for v in (a, b, betas))
    return {"entropy": np.log(a) + beta * b / a, "max_weight": 1 / a, "tokens": np.asarray(x)}


def fixed_query_statistics(key, n: int, d: int, betas, *, chunk: int = 2**15, top: int = 2, seeds: int = 1):
    """Statistics of the softmax weights of a query against n uniform keys on S^{d−1}, streamed.

    Returns a dict of NumPy arrays, one row per seed (keys ``jax.random.split(key, seeds)``):
    ``entropy`` and ``max_weight`` of shape ``(seeds, len(betas))``, ``log_partition``
    log Σ e^{−βu_i} (the normaliser of e^{β⟨q,k⟩} divided by e^β), ``nearest`` the ``top``
    smallest distances u (ascending, ``(seeds, top)``)."""
    betas = jnp.asarray(betas, dtype=jnp.result_type(float))
    stream = _jitted(_stream, ("chunk", "d", "top"))
    m, a, b, best = stream(jax.random.split(key, seeds), n, betas, chunk=chunk, d=d, top=top)
    m, a, b, best, beta = (np.asarray(v, dtype=np.float64) for v in (m, a, b, best, betas))
    return {"entropy": np.log(a) + beta * b / a, "max_weight": 1 / a,
            "log_partition": np.log(a) - beta * m[:, None], "nearest": best}


def gap_counting_scale(nearest):
    """sup_t log N(t)/t over the gaps t of the sorted smallest distances (``(..., top)``), with
    N(t) = #{j : u_(j) − u_(1) <= t}: the sup sits at a gap g_j = u_(j) − u_(1), value log j/g_j."""
    u = np.asarray(nearest, dtype=np.float64)
    gaps = u[..., 1:] - u[..., :1]
    j = np.arange(2, u.shape[-1] + 1)
    with np.errstate(divide="ignore"):
        ratio = np.where(gaps > 0, np.log(j) / np.where(gaps > 0, gaps, 1.0), 0.0)
    return ratio.max(axis=-1)


def collapse_point(betas, entropy, level: float):
    """The β at which ``entropy`` (``(..., len(betas))``, decreasing in β) crosses ``level``,
    interpolated linearly in log β; the grid's end where it does not cross inside it (the count of
    those is the second return)."""
    lb = np.log(np.asarray(betas, dtype=np.float64))
    h = np.asarray(entropy, dtype=np.float64)
    flat = h.reshape(-1, h.shape[-1])
    lbf = np.broadcast_to(lb, h.shape).reshape(-1, h.shape[-1])
    out = np.empty(flat.shape[0])
    clipped = 0
    for r, (row, x) in enumerate(zip(flat, lbf)):
        below = np.nonzero(row <= level)[0]
        if below.size == 0 or below[0] == 0:
            clipped += 1
            out[r] = x[-1] if below.size == 0 else x[0]
            continue
        k = below[0]
        s = (row[k - 1] - level) / (row[k - 1] - row[k])
        out[r] = x[k - 1] + s * (x[k] - x[k - 1])
    return np.exp(out).reshape(h.shape[:-1]), clipped


# ----------------------------------------------------------------------------- the experiment


def compute(cfg: LongContextConfig, progress: bool = False) -> Result:
    theory = tp.theory.long_context
    ns, lams, dims = cfg.ns, cfg.lambdas, np.asarray(cfg.dims)
    D, N, S, G = len(dims), len(ns), cfg.seeds, len(lams)
    ent, wmax, logz = (np.empty((D, N, S, G)) for _ in range(3))
    gap = np.empty((D, N, S))
    betas = np.empty((D, N, G))
    bar = progress_bar(progress, total=D * N, desc="long-context", unit="(d, n)")
    for i, d in enumerate(cfg.dims):
        for j, n in enumerate(ns):
            betas[i, j] = lams * theory.critical_scale(n, d)
            st = fixed_query_statistics(jax.random.fold_in(jax.random.key(cfg.seed), d), int(n), d, betas[i, j],
                                        chunk=cfg.chunk, top=cfg.top, seeds=S)
            ent[i, j], wmax[i, j], logz[i, j] = st["entropy"], st["max_weight"], st["log_partition"]
            gap[i, j] = gap_counting_scale(st["nearest"])
            bar.update()
    bar.close()
    level = np.log(cfg.collapse_keys)
    beta_star, clipped = collapse_point(betas[:, :, None, :], ent, level)  # (D, N, S)
    layer = _layer_part(cfg, progress) if cfg.layer_log2_n_max else {}

    # the limits: mean field (sub-critical), Poisson (critical), and the normaliser's fluctuations
    mf = np.stack([theory.mean_field_entropy(ns[:, None], betas[i], d) for i, d in enumerate(cfg.dims)])
    var = np.stack([theory.partition_variance(betas[i], d) for i, d in enumerate(cfg.dims)])  # (D, N, G)
    log_m = np.stack([np.log(theory.mean_partition(betas[i], d)) for i, d in enumerate(cfg.dims)])
    ratio = np.exp(logz - np.log(ns)[None, :, None, None] - log_m[:, :, None, :])  # Z/(n m(β))
    z_partition = (ratio - 1) / np.sqrt(var[:, :, None, :] / ns[None, :, None, None])
    lim_ent, lim_wmax, lam_star_lim = np.empty((D, G)), np.empty((D, G)), np.empty(D)
    for i, d in enumerate(cfg.dims):
        e_l, w_l = theory.critical_limit(lams, d, samples=cfg.limit_samples, seed=cfg.seed)
        lim_ent[i], lim_wmax[i] = e_l.mean(axis=0), w_l.mean(axis=0)
        lam_star_lim[i] = np.exp(np.mean(np.log(collapse_point(lams, e_l, level)[0])))

    # fitted exponents: β_n* against n, against log n, and the gap-counting scale against n
    fits = {}
    for name, x, y in (("exponent", ns, beta_star), ("log_exponent", np.log(ns), beta_star),
                       ("gap_exponent", ns, gap)):
        slope, lo, hi = np.empty(D), np.empty(D), np.empty(D)
        for i in range(D):
            f = tp.statistics.fit_rate(x, y[i], num_bootstrap=2000, seed=cfg.seed)
            slope[i], (lo[i], hi[i]) = f.slope, f.slope_ci
        fits[name], fits[f"{name}_lo"], fits[f"{name}_hi"] = slope, lo, hi
    if layer:
        slope, lo, hi = np.empty(D), np.empty(D), np.empty(D)
        for i in range(D):
            f = tp.statistics.fit_rate(cfg.layer_ns, layer["layer_beta_star"][i], num_bootstrap=2000, seed=cfg.seed)
            slope[i], (lo[i], hi[i]) = f.slope, f.slope_ci
        layer.update(layer_exponent=slope, layer_exponent_lo=lo, layer_exponent_hi=hi)
    scale = np.stack([theory.critical_scale(ns, d) for d in cfg.dims])  # (D, N)
    lam_star = np.exp(np.log(beta_star).mean(axis=2)) / scale

    arrays = {"dims": dims, "ns": ns, "lambdas": lams, "betas": betas, "entropy": ent, "max_weight": wmax,
              "log_partition": logz, "gap_scale": gap, "beta_star": beta_star, "clipped": np.asarray(clipped),
              "predicted_exponent": 2.0 / (dims - 1), **fits, "lambda_star": lam_star,
              "lambda_star_limit": lam_star_lim, "mean_field_entropy": mf, "limit_entropy": lim_ent,
              "limit_max_weight": lim_wmax, "z_partition": z_partition, **layer}
    coords = {"d": dims, "n": ns, "seed": np.arange(S), "lam": lams}
    labelled = grid(
        coords, entropy=(("d", "n", "seed", "lam"), ent), max_weight=(("d", "n", "seed", "lam"), wmax),
        beta=(("d", "n", "lam"), betas), beta_star=(("d", "n", "seed"), beta_star),
        gap_scale=(("d", "n", "seed"), gap), mean_field_entropy=(("d", "n", "lam"), mf),
        limit_entropy=(("d", "lam"), lim_ent),
        describe={"d": ("dimension of the space of the keys (S^(d-1))", ""), "n": ("number of keys", ""),
                  "seed": ("independent draw of the keys", ""),
                  "lam": ("λ = β/(A_d n)^(2/(d−1)), β in units of the 2605.08505 scale", ""),
                  "entropy": ("entropy H of the attention weights (nats)", "nat"),
                  "max_weight": ("largest attention weight", ""), "beta": ("inverse temperature β", ""),
                  "beta_star": ("β at which exp(H) falls to collapse_keys (entropy-collapse point)", ""),
                  "gap_scale": ("gap-counting scale sup_t log N(t)/t of the draw", ""),
                  "mean_field_entropy": ("law-of-large-numbers entropy (sub-critical limit)", "nat"),
                  "limit_entropy": ("mean entropy of the Poisson (critical) limit, n → ∞", "nat")})
    return Result(arrays, {"long_context": labelled})


def _layer_part(cfg: LongContextConfig, progress: bool) -> dict:
    """The full self-attention layer: per (d, n, draw) the row-mean entropy and largest weight on
    the λ grid, the collapse point of the row-mean entropy, and the Poisson limit of a row (the
    token itself a key at distance 0)."""
    theory = tp.theory.long_context
    ns, lams = cfg.layer_ns, cfg.lambdas
    D, N, S, G = len(cfg.dims), len(ns), cfg.layer_seeds, len(lams)
    ent, wmax = np.empty((D, N, S, G)), np.empty((D, N, S, G))
    betas = np.empty((D, N, G))
    bar = progress_bar(progress, total=D * N * S, desc="long-context layer", unit="layer")
    for i, d in enumerate(cfg.dims):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(cfg.seed), 1000 + d), S)
        for j, n in enumerate(ns):
            betas[i, j] = lams * theory.critical_scale(n, d)
            for k in range(S):
                st = layer_statistics(keys[k], int(n), d, betas[i, j])
                ent[i, j, k], wmax[i, j, k] = st["entropy"].mean(axis=0), st["max_weight"].mean(axis=0)
                bar.update()
    bar.close()
    beta_star, clipped = collapse_point(betas[:, :, None, :], ent, np.log(cfg.collapse_keys))
    lim = np.stack([theory.critical_limit(lams, d, samples=cfg.limit_samples, seed=cfg.seed,
                                          self_key=True)[0].mean(axis=0) for d in cfg.dims])
    return {"layer_ns": ns, "layer_betas": betas, "layer_entropy": ent, "layer_max_weight": wmax,
            "layer_beta_star": beta_star, "layer_clipped": np.asarray(clipped), "layer_limit_entropy": lim}


def exponent_table(res) -> str:
    """The fitted exponents per d as a Markdown table (benchmarks/README.md)."""
    layer = "layer_exponent" in res
    lines = ["| d | 2/(d−1) | β_n* ∝ n^p: p [95 %] | gap scale ∝ n^p | β_n* ∝ (log n)^p | λ* (largest n) | λ* limit |"
             + (" layer: p [95 %] |" if layer else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if layer else "")]
    for i, d in enumerate(res["dims"]):
        lines.append(f"| {d} | {res['predicted_exponent'][i]:.3f} | {res['exponent'][i]:.3f} "
                     f"[{res['exponent_lo'][i]:.3f}, {res['exponent_hi'][i]:.3f}] | {res['gap_exponent'][i]:.3f} | "
                     f"{res['log_exponent'][i]:.2f} | {res['lambda_star'][i, -1]:.3f} | "
                     f"{res['lambda_star_limit'][i]:.3f} |"
                     + (f" {res['layer_exponent'][i]:.3f} [{res['layer_exponent_lo'][i]:.3f}, "
                        f"{res['layer_exponent_hi'][i]:.3f}] |" if layer else ""))
    return "\n".join(lines)


def figures(res: Result, cfg: LongContextConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    dims, ns, lams, betas = res["dims"], res["ns"], res["lambdas"], res["betas"]
    ent, bstar, gap = res["entropy"], res["beta_star"], res["gap_scale"]
    focus = int(np.nonzero(dims == 3)[0][0]) if 3 in dims else 0
    fd = int(dims[focus])
    keys = np.exp(ent).mean(axis=2)  # (D, N, G) mean effective number of keys
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(ns)))
    fig, axs = plt.subplots(2, 3, figsize=(15, 8.5), layout="constrained")
    # top row: the same measurements of d = fd against the three scales; only the right one collapses
    gap_med = np.median(gap[focus], axis=1)  # (N,)
    xs = (lams[None, :] * np.ones((len(ns), 1)), betas[focus] / np.log(ns)[:, None], betas[focus] / gap_med[:, None])
    labels = ("λ = β/(A_d n)^{2/(d−1)}  [2605.08505]", "β/log n  [2510.05554]",
              "β/(gap-counting scale)  [2605.12697]")
    for ax, x, label in zip(axs[0], xs, labels):
        for j, n in enumerate(ns):
            ax.loglog(x[j], keys[focus, j], color=colors[j], lw=1,
                      label=f"n = 2^{int(np.log2(n))}" if j in (0, len(ns) - 1) else None)
        ax.axhline(cfg.collapse_keys, color="k", ls=":", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel(f"mean e^H, d = {fd}")
        ax.grid(alpha=0.3)
    axs[0, 0].loglog(lams, np.exp(res["limit_entropy"][focus]), "r--", lw=1.5, label="Poisson limit (e^{E H})")
    axs[0, 0].legend(fontsize=7)
    axs[0, 1].legend(fontsize=7)
    # bottom left: β_n* against n with the three laws, each with one fitted constant
    ax = axs[1, 0]
    for i, d in enumerate(dims):
        c = f"C{i}"
        gm = np.exp(np.log(bstar[i]).mean(axis=1))
        ax.loglog(ns, gm, "o", color=c, ms=4, label=f"d = {d}: β_n* (p = {res['exponent'][i]:.3f})")
        for law, ls in ((tp.theory.long_context.critical_scale(ns, int(d)), "-"), (np.log(ns), "--"),
                        (np.median(gap[i], axis=1), ":")):
            k = np.exp(np.mean(np.log(gm) - np.log(law)))
            ax.loglog(ns, k * law, ls, color=c, lw=1)
        if "layer_beta_star" in res:
            ax.loglog(res["layer_ns"], np.exp(np.log(res["layer_beta_star"][i]).mean(axis=1)), "s", mfc="none",
                      color=c, ms=5, label=f"d = {d}: layer (p = {res['layer_exponent'][i]:.3f})")
    ax.plot([], [], "k-", label="c·n^{2/(d−1)}")
    ax.plot([], [], "k--", label="c·log n")
    ax.plot([], [], "k:", label="c·gap-counting scale")
    ax.set_xlabel("n (keys)")
    ax.set_ylabel(f"β_n*: e^H = {cfg.collapse_keys:g}")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    # bottom middle: entropy at the largest n against the two limits
    ax = axs[1, 1]
    for i, d in enumerate(dims):
        c = f"C{i}"
        ax.semilogx(lams, ent[i, -1].mean(axis=0) - np.log(ns[-1]), "o", ms=3, color=c, label=f"d = {d}")
        ax.semilogx(lams, res["mean_field_entropy"][i, -1] - np.log(ns[-1]), ":", color=c, lw=1)
        ax.semilogx(lams, res["limit_entropy"][i] - np.log(ns[-1]), "--", color=c, lw=1)
    ax.plot([], [], "k:", label="mean field (sub-critical)")
    ax.plot([], [], "k--", label="Poisson limit (critical)")
    ax.set_xlabel("λ = β/(A_d n)^{2/(d−1)}")
    ax.set_ylabel(f"E H − log n, n = 2^{int(np.log2(ns[-1]))}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    # bottom right: fitted exponents with intervals
    ax = axs[1, 2]
    x = np.arange(len(dims))
    ax.errorbar(x, res["exponent"], yerr=[res["exponent"] - res["exponent_lo"], res["exponent_hi"] - res["exponent"]],
                fmt="o", capsize=4, label="fitted exponent of β_n* (95 % bootstrap)")
    if "layer_exponent" in res:
        ax.errorbar(x + 0.15, res["layer_exponent"], fmt="s", mfc="none", capsize=4,
                    yerr=[res["layer_exponent"] - res["layer_exponent_lo"],
                          res["layer_exponent_hi"] - res["layer_exponent"]],
                    label="the same, full self-attention layer (row means)")
    ax.plot(x, res["predicted_exponent"], "r_", ms=20, mew=2, label="2/(d−1)")
    ax.plot(x, res["gap_exponent"], "gx", label="exponent of the gap-counting scale")
    ax.set_xticks(x, [f"d = {d}" for d in dims])
    ax.set_yscale("log")
    ax.set_ylabel("exponent p in β ∝ n^p")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    # top right also carries the max weight at the largest n against the Poisson limit
    ax2 = axs[0, 2].inset_axes([0.55, 0.55, 0.42, 0.4])
    for i in range(len(dims)):
        ax2.semilogx(lams, res["max_weight"][i, -1].mean(axis=0), "o", ms=2, color=f"C{i}")
        ax2.semilogx(lams, res["limit_max_weight"][i], "--", color=f"C{i}", lw=0.8)
    ax2.set_title("max weight vs λ (-- limit)", fontsize=6)
    ax2.tick_params(labelsize=5)
    fig.suptitle(f"Fixed query against n uniform keys on S^(d−1): the critical β (seeds = {cfg.seeds})")
    return [tp.plot.save_figure(fig, out_dir / "long-context.png")]
