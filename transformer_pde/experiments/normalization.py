r"""Normalization schemes as speed regulation: clustering and token speed vs depth
(docs: math/sphere.md#differences-from-the-papers; Karagodin–Ge–Polyanskiy–Rigollet, "Normalization in Attention
Dynamics", arXiv 2510.22026).

The same multi-head softmax attention A (the set-up of the authors' code, ``nikitus20/simuformer``)
inside the residual layer of each scheme of :mod:`transformer_pde.models.normalization`:

| name | layer (step h) | library |
|---|---|---|
| ``post-ln`` | x ← N(x + hA(x)) (the authors' post-LN) | ``tp.PostLN`` |
| ``projected`` | x ← N(x + hP⊥_x A(x)) (GLPR's projected flow, Euler) | ``tp.Sphere`` |
| ``pre-ln`` | x ← x + hA(N(x)) | ``tp.PreLN`` |
| ``peri-ln`` | x ← x + hN(A(N(x))) | ``tp.PeriLN`` |
| ``ngpt`` | x ← N(x + αh(N(A(x)) − x)), α = ``ngpt_alpha`` | ``tp.NGPT`` |
| ``mix-ln`` | post-LN for the first ⌊αL⌋ layers, then pre-LN (α = ``mix_fraction``) | ``tp.MixLN`` |
| ``ln-scaling`` | x ← x + hA(N(x)/√ℓ), ℓ = l + 1 | ``tp.LNScaling`` |

with N(x) = x/|x| (unit sphere) and, per draw, H = ``heads`` heads averaged as in the authors'
code (``M2 += A_head / n_heads``): ``tp.MultiHeadAttention`` with full-width heads Q_h, K_h, V_h
of shape (d, d), V_h = I and output maps W_h = I/H, so A(x)_i = (1/H) Σ_h Σ_j softmax_j(β⟨Q_h x_i,
K_h x_j⟩) x_j; optionally causal (token i attends to j ≤ i, their ``--sequential``).
**Scaling of KᵀQ**: Q_h, K_h have i.i.d. N(0, d^{-1/2}) entries, so K_hᵀQ_h = G₁ᵀG₂/√d has
entries of mean 0 and variance 1, the law of the authors' default ``randomKQ=1``
(``BF1 @ BF2 / sqrt(d)``); the score of two unit tokens then has standard deviation about 1.
Tokens start i.i.d. uniform on S^{d-1}; every (scheme, β, mask) sees the same draws of tokens and
weights (seed by seed), so the schemes are compared on common random numbers.

Measured at every layer l (t = lh), averaged over the ``seeds`` draws:

* **P(clustered pair)**: the fraction of ordered pairs i ≠ j of directions θ = x/|x| with
  ⟨θ_i, θ_j⟩ > ``threshold`` (``tp.diagnostics.clustered_pair_fraction``, the authors' "density");
* **token speed**: (1/n) Σ_i |θ_i(l) − θ_i(l − 1)| / h, the distance a direction moves in layer l
  per unit depth (NaN at l = 0);
* **radius**: (1/n) Σ_i |x_i(l)| (1 for the schemes on the sphere; Pre-, Peri-LN, LN-scaling and the
  Pre-LN part of Mix-LN let it grow, which slows θ: |θ̇| = |P⊥A|/r).

Saved labelled (``results.nc``, group ``depth``: dims scheme × beta × causal × layer, coordinate
t along layer).

**Published numbers.** The public numbers of the authors' code for Pre-LN and Peri-LN
(P(clustered pair) at t = 20: Pre-LN 0.42/0.29/0.20, Peri-LN 0.58/0.41/0.26 at β = 1/5/9) come
from a radius update r ← r + h Σ_coordinates(rA), a coordinate sum instead of ⟨θ, A⟩
(docs: math/sphere.md#differences-from-the-papers): they are **not** this model and not a target
(saved as ``simuformer_*`` for reference). Post-LN does not use r: post-LN → 1.00 clustered at t = 20 (every β) is
the check. Their nGPT layer θ ← N(θ + 0.2hÂ) is exactly the nGPT layer here,
N(x + αh(Â − x)) = N(x + (αh/(1 − αh))Â), with αh/(1 − αh) = 0.2h: at the default α = 0.2/1.02, h = 0.1 their 200
layers are this run's 200, layer for layer (at α = 0.2 they are its first 196: layer 196 there gave
0.277/0.028/0.013 ± 0.012/0.005/ 0.002 over 32 draws, against their 0.28/0.03/0.01, while layer 200 read
0.395/0.045/0.020). The figure puts their point at the corresponding depth (:func:`simuformer_depth`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

from ..runs.programs import compile_program
from ..runs.result import Result, grid
from ._common import clustered_pairs_described, import_end_modules_meanwhile
from ._progress import progress_bar
from .configs.normalization import NormalizationConfig

# The authors' code (simuformer), P(clustered pair) at t = 20, β = 1, 5, 9, no mask
# (docs: math/sphere.md#differences-from-the-papers). Pre-/Peri-LN there update the radius with a coordinate sum:
# not the model, not a target.
SIMUFORMER_BETAS = np.array([1.0, 5.0, 9.0])
SIMUFORMER_TIME = 20.0
SIMUFORMER_SCHEMES = np.array(["post-ln", "pre-ln", "peri-ln", "ngpt"])
SIMUFORMER_FRACTION = np.array([[1.00, 1.00, 1.00], [0.42, 0.29, 0.20], [0.58, 0.41, 0.26],
                                [0.28, 0.03, 0.01]])
SIMUFORMER_IS_MODEL = np.array([True, False, False, True])
"""Which of the published rows test the model implemented here (post-LN, nGPT)."""
SIMUFORMER_NGPT_STEP = 0.2
"""Their nGPT layer θ ← N(θ + 0.2hÂ): a post-type step 0.2h of the unit field Â."""


# ----------------------------------------------------------------------------- the schemes


@dataclasses.dataclass(frozen=True)
class LayerScheme:
    """A scheme that is one dynamics: its layers are ``tp.layers(wrap(attention), x0, L, h)``."""

    name: str
    label: str
    wrap: Callable
    """attention -> the scheme's dynamics (e.g. ``tp.PreLN``)."""

    def run(self, attention, x0, num_layers: int, step: float) -> tp.Solution:
        """The L + 1 states (input included, ``xs`` of shape ``(L + 1, n, d)``) and when they became
        NaN or inf (``nonfinite_time``, inf when never: ``throw=False``, a value to raise on)."""
        return tp.layers(self.wrap(attention), x0, num_layers, step, throw=False)


def make_schemes(cfg: NormalizationConfig) -> tuple:
    """The config's scheme names, each mapped once to the object that runs it."""
    objects = {
        # each class looked up when a program is traced: a run that loads its programs
        # (runs/programs.py) imports no model (equinox and the models, 0.15 s)
        "post-ln": LayerScheme("post-ln", "post-LN", lambda attn: tp.PostLN(attn)),
        "projected": LayerScheme("projected", "projected (Sphere)", lambda attn: tp.Sphere(attn)),
        "pre-ln": LayerScheme("pre-ln", "Pre-LN", lambda attn: tp.PreLN(attn)),
        "peri-ln": LayerScheme("peri-ln", "Peri-LN", lambda attn: tp.PeriLN(attn)),
        "ngpt": LayerScheme("ngpt", f"nGPT (α = {cfg.ngpt_alpha:g})",
                            lambda attn: tp.NGPT(attn, cfg.ngpt_alpha)),
        "mix-ln": LayerScheme("mix-ln", f"Mix-LN (α = {cfg.mix_fraction:g})",
                              lambda attn: tp.MixLN.from_layers(attn, cfg.num_layers, cfg.step, cfg.mix_fraction)),
        "ln-scaling": LayerScheme("ln-scaling", "LN-scaling", lambda attn: tp.LNScaling(attn, cfg.step)),
    }
    return tuple(objects[name] for name in cfg.schemes)


def draws(cfg: NormalizationConfig):
    """Per seed: tokens uniform on S^{d-1} ``(S, n, d)`` and head weights Q, K ``(S, H, d, d)``
    with i.i.d. N(0, d^{-1/2}) entries (K_hᵀQ_h has entries of variance 1). NumPy: no compilation."""
    rng = np.random.default_rng([cfg.seed, cfg.n, cfg.d, cfg.heads])
    x0 = rng.standard_normal((cfg.seeds, cfg.n, cfg.d))
    x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
    scale = cfg.d ** -0.25
    Q = scale * rng.standard_normal((cfg.seeds, cfg.heads, cfg.d, cfg.d))
    K = scale * rng.standard_normal((cfg.seeds, cfg.heads, cfg.d, cfg.d))
    return x0, Q, K


def attention(Q, K, beta, causal: bool):
    """H heads averaged: V = I and W = I/H shared by the heads (the authors' ``M2 += A_head /
    n_heads``), so the heads' weights are summed before they meet the tokens; the causal mask
    (token i attends to j <= i) is :class:`~transformer_pde.Causal` of it."""
    from ..runs import finite_by_construction as cover_finiteness

    H, d = Q.shape[0], Q.shape[-1]
    eye = jnp.eye(d, dtype=Q.dtype)
    V, W = eye, eye / H
    cover_finiteness([V, W])  # finite by construction: no runtime check under jit
    heads = tp.MultiHeadAttention(Q, K, V, W, beta)
    return tp.Causal(heads) if causal else heads


STATISTICS_BATCH = 8
"""Draws whose pair statistics are computed together (memory, not numbers)."""


def depth_statistics(xs, step, threshold):
    """Per layer, for a batch of runs ``(S, L + 1, n, d)``: P(clustered pair) and mean |x|, and the
    token speed mean_i |θ_i(l) − θ_i(l − 1)|/h (NaN at l = 0); each ``(S, L + 1)``; and per run
    whether a direction θ = x/|x| was NaN or inf (a zero token; the states' own NaN is the layers'
    report), ``(S,)``. Compiled once per run for every scheme (:func:`statistics_program`; the
    schemes differ in their layers, not in their states' shape)."""

    from ..runs import finite_by_construction as cover_finiteness

    def one(x):  # (L + 1, n, d)
        r = jnp.linalg.norm(x, axis=-1)
        theta = x / r[..., None]
        bad = ~jnp.all(jnp.isfinite(theta))

        def pairs(y):  # one layer's directions
            cover_finiteness([y])  # a NaN is reported by ``bad``: no runtime check of its own
            return tp.diagnostics.clustered_pair_fraction(y, threshold)

        fraction = jax.vmap(pairs)(theta)
        speed = jnp.mean(jnp.linalg.norm(jnp.diff(theta, axis=0), axis=-1), axis=-1) / step
        return (fraction, jnp.concatenate([jnp.full((1,), jnp.nan, speed.dtype), speed]),
                jnp.mean(r, axis=-1), bad)

    # a few draws at a time: every draw's Gram matrices and unit tokens at once were the run's
    # largest buffers (the run's peak memory 835 -> 552 MiB at the peers' settings: benchmarks/README.md)
    return jax.lax.map(one, xs, batch_size=STATISTICS_BATCH)


def scheme_states(cfg: NormalizationConfig, index: int, causal: bool, beta, x0, Q, K):
    """The states ``(S, L + 1, n, d)`` of every draw under the config's scheme ``index`` and when
    each became NaN or inf, ``(S,)`` (traced by :func:`scheme_program`).

    It holds no runtime check (a host callback, which keeps a program out of JAX's persistent
    compilation cache and out of :mod:`~transformer_pde.runs.programs`): the config's β are checked
    finite (``Options``) and ``compute`` checks the draws before (:func:`check_draws`), V = I and
    W = I/H are finite by construction, the starts' norms are the draws', and the layers report a
    NaN as a value (``throw=False``) that ``compute`` raises on."""
    from ..runs import finite_by_construction as cover_finiteness
    from ..runs import unit_rows_by_construction as mark_unit_rows

    scheme = make_schemes(cfg)[index]
    cover_finiteness([beta])  # a config's β: checked finite in float32 (Options)

    def one(x, q, k):
        cover_finiteness([q, k])  # the draws: checked by compute (check_draws)
        sol = scheme.run(attention(q, k, beta, causal), mark_unit_rows(x), cfg.num_layers, cfg.step)
        return sol.xs, sol.nonfinite_time

    return jax.vmap(one)(x0, Q, K)


def scheme_program(cfg: NormalizationConfig, index: int, causal: bool, dtype):
    """:func:`scheme_states` compiled for the config's draws in ``dtype`` (β an argument, not a
    constant), through :func:`~transformer_pde.runs.programs.compile_program`: a later ``compute``
    with the same config in the same process compiles nothing (a new function per call compiled
    the two schemes' programs again, 0.25 s each at the peers' settings), and a later process
    loads the compiled program."""
    S, H, n, d = cfg.seeds, cfg.heads, cfg.n, cfg.d
    args = tuple(jax.ShapeDtypeStruct(shape, dtype) for shape in ((), (S, n, d), (S, H, d, d), (S, H, d, d)))
    return compile_program(scheme_states, (cfg, index, causal), args)


def statistics_program(step: float, threshold: float, shape: tuple, dtype):
    """:func:`depth_statistics` compiled for states of ``shape`` (S, L + 1, n, d), kept as
    :func:`scheme_program`."""
    return compile_program(depth_statistics_program, (step, threshold), (jax.ShapeDtypeStruct(shape, dtype),))


def depth_statistics_program(step: float, threshold: float, xs):
    """:func:`depth_statistics` with the step and threshold static (a traced threshold is
    checked at run time, a host callback)."""
    return depth_statistics(xs, step, threshold)


def check_draws(x0, Q, K, dtype) -> None:
    """The draws as :func:`scheme_states` takes them, checked now (concrete): finite, and the
    tokens unit rows within ``unit_tolerance`` (1e-3 in float32; ValueError naming the first bad
    one)."""
    from ..runs import unit_row_tolerance as unit_tolerance

    for name, a in (("x0", x0), ("Q", Q), ("K", K)):
        if not np.all(np.isfinite(a)):
            raise ValueError(f"normalization: the draw {name} holds NaN or inf at "
                             f"{tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])}")
    dev = np.abs(np.linalg.norm(np.asarray(x0, np.float64), axis=-1) - 1)
    tol = unit_tolerance(dtype)
    if np.any(dev > tol):
        s, i = np.argwhere(dev > tol)[0]
        raise ValueError(f"normalization: the start x0[{s}, {i}] is off the unit sphere by {dev[s, i]:.3g} "
                         f"(tolerance {tol:.2g})")


def compute(cfg: NormalizationConfig, progress: bool = False) -> Result:
    schemes = make_schemes(cfg)
    dtype = jnp.asarray(1.0).dtype
    x0, Q, K = (jnp.asarray(a, dtype) for a in draws(cfg))
    shape = (len(schemes), len(cfg.betas), len(cfg.masks), cfg.num_layers + 1)
    stats = {k: np.empty(shape) for k in ("fraction", "fraction_sem", "speed", "speed_sem", "radius")}
    sem = lambda a: a.std(axis=0) / np.sqrt(cfg.seeds)  # noqa: E731
    bar = progress_bar(progress, total=len(schemes) * len(cfg.masks) * len(cfg.betas),
                       desc="normalization")
    check_draws(x0, Q, K, dtype)
    statistics = statistics_program(cfg.step, cfg.threshold, (cfg.seeds, cfg.num_layers + 1, cfg.n, cfg.d), dtype)
    programs = {(c, s): scheme_program(cfg, s, mask == "causal", dtype)
                for c, mask in enumerate(cfg.masks) for s in range(len(schemes))}
    # matplotlib and xarray imported while the programs run (they do not hold the GIL): a second
    # run at the peers' settings 4.4 -> 4.2 s; its peak memory +85 MB, the first run's too (its
    # compilations come first, so their peak does not meet the modules)
    import_end_modules_meanwhile()
    with bar:
        for c, mask in enumerate(cfg.masks):
            for s, scheme in enumerate(schemes):
                states = programs[c, s]
                for b, beta in enumerate(cfg.betas):
                    # the states (S, L + 1, n, d) are held by no name: freed once read, not
                    # alive beside the next β's
                    xs, nonfinite = states(jnp.asarray(beta, dtype), x0, Q, K)
                    frac, speed, radius, bad = (np.asarray(a) for a in statistics(xs))
                    del xs
                    raise_if_nonfinite(np.asarray(nonfinite), bad, scheme.name, mask, beta)
                    frac, speed, radius = (a.astype(np.float64) for a in (frac, speed, radius))
                    stats["fraction"][s, b, c] = frac.mean(axis=0)
                    stats["fraction_sem"][s, b, c] = sem(frac)
                    stats["speed"][s, b, c] = speed.mean(axis=0)
                    stats["speed_sem"][s, b, c] = sem(speed)
                    stats["radius"][s, b, c] = radius.mean(axis=0)
                    bar.update()
                end = ", ".join(f"β={b:g}: {f:.3f}" for b, f in zip(cfg.betas, stats["fraction"][s, :, c, -1]))
                bar.note(f"{scheme.name:>10} mask={mask:<6} P(clustered pair) at t={cfg.t1:g}: {end}")
    ts = cfg.step * np.arange(cfg.num_layers + 1)
    arrays = {
        "schemes": np.array(cfg.schemes), "labels": np.array([s.label for s in schemes]),
        "betas": np.array(cfg.betas), "causal": np.array([m == "causal" for m in cfg.masks]),
        "ts": ts, **stats,
        "simuformer_schemes": SIMUFORMER_SCHEMES, "simuformer_betas": SIMUFORMER_BETAS,
        "simuformer_time": np.array(SIMUFORMER_TIME), "simuformer_fraction": SIMUFORMER_FRACTION,
        "simuformer_is_model": SIMUFORMER_IS_MODEL,
    }
    dims = ("scheme", "beta", "causal", "layer")
    depth = grid({"scheme": arrays["schemes"], "beta": arrays["betas"], "causal": arrays["causal"],
                  "layer": np.arange(cfg.num_layers + 1)},
                 **{k: (dims, v) for k, v in stats.items()},
                 describe={
                     "scheme": ("normalization scheme of the residual layer", ""),
                     "beta": ("inverse temperature β of the attention", ""),
                     "causal": ("whether the attention is causal (token i attends to j <= i)", ""),
                     "layer": ("layer index l (depth t = l h)", ""),
                     **clustered_pairs_described("draws"),
                     "speed": ("token speed (1/n) Σ_i |θ_i(l) − θ_i(l − 1)| / h, mean over the draws "
                               "(NaN at l = 0)", ""),
                     "speed_sem": ("standard error over the draws of speed", ""),
                     "radius": ("mean token norm (1/n) Σ_i |x_i(l)|, mean over the draws", "")})
    # t is a second coordinate along layer, which grid does not make: described here
    return Result(arrays, {"depth": depth.assign_coords(
        t=("layer", ts, {"description": "depth t = l h of the layer", "units": ""}))})


def raise_if_nonfinite(nonfinite_time, bad_direction, scheme: str, mask: str, beta) -> None:
    """:class:`~transformer_pde.NonFiniteStateError` naming the first draw whose tokens became NaN
    or inf (the states' program reports it as a value), or whose direction x/|x| was (a zero
    token)."""
    where = f"normalization: scheme {scheme}, mask {mask}, beta = {beta:g}"
    tp.runs.raise_if_nonfinite(where, nonfinite_time, {"draw": np.arange(len(nonfinite_time))},
                               "the step or beta is too large")
    if bad_direction.any():
        raise tp.NonFiniteStateError(f"{where}: draw {int(np.argmax(bad_direction))} reached a zero token "
                                  f"(its direction x/|x| is NaN)")


# ----------------------------------------------------------------------------- figures


ROWS = (("fraction", "P(clustered pair)"), ("speed", "token speed mean|Δθ|/h"),
        ("radius", "mean radius |x|"))


def figures(res: Result, cfg: NormalizationConfig, out_dir) -> list:
    """One figure per mask: rows P(clustered pair), token speed (log) and radius vs depth, one
    column per β, one line per scheme; ○: the authors' code where it is this model (post-LN,
    nGPT), at the corresponding depth (:func:`simuformer_depth`)."""
    import matplotlib.pyplot as plt

    betas, ts = res["betas"], res["ts"]
    published = published_setup(cfg)
    paths = []
    for c, is_causal in enumerate(res["causal"]):
        fig, axs = plt.subplots(len(ROWS), len(betas), figsize=(4.0 * len(betas) + 1.5, 8.4),
                                squeeze=False, sharex=True, sharey="row")
        for b, beta in enumerate(betas):
            for r, (key, ylabel) in enumerate(ROWS):
                ax = axs[r, b]
                first = 1 if key == "speed" else 0  # no speed before the first layer
                for s, label in enumerate(res["labels"]):
                    ax.plot(ts[first:], res[key][s, b, c, first:], color=f"C{s}", lw=1.2, label=str(label))
                if key == "fraction" and published and not is_causal:
                    _published(ax, res, cfg, beta)
                ax.set_yscale("log" if key == "speed" else "linear")
                ax.grid(alpha=0.3)
                if b == 0:
                    ax.set_ylabel(ylabel)
            axs[0, b].set_title(f"β = {beta:g}")
            axs[-1, b].set_xlabel("depth t = l h")
        legend = axs[0, -1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        mask = "causal" if is_causal else "none"
        fig.suptitle(f"{'causal mask' if is_causal else 'no mask'}: d = {cfg.d}, n = {cfg.n}, {cfg.heads} heads "
                     f"averaged, random KᵀQ, V = I, h = {cfg.step:g}, {cfg.seeds} draws"
                     + (" (○ authors' code at their t = 20)" if published and not is_causal else ""))
        # fixed margins in inches and room for the legend as wide as it is drawn, not tight_layout
        # and a trimmed save: those measured every tick label three times (the two figures at the
        # peers' settings 1.20 -> 0.78 s)
        w, h = fig.get_size_inches()
        legend_w = legend.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi
        fig.subplots_adjust(left=0.95 / w, right=1 - (legend_w + 0.3) / w, bottom=0.55 / h,
                            top=1 - 0.75 / h, wspace=0.08, hspace=0.12)
        paths.append(tp.plot.save_figure(fig, out_dir / f"normalization_{mask}.png", trim=False))
    return paths


def published_setup(cfg: NormalizationConfig) -> bool:
    """Whether the run has the set-up of the authors' published numbers (d = 16, n = 64, 8 heads,
    h = 0.1, to t >= 20 and the 0.999 threshold)."""
    return ((cfg.d, cfg.n, cfg.heads) == (16, 64, 8) and abs(cfg.step - 0.1) < 1e-12
            and cfg.t1 >= SIMUFORMER_TIME and cfg.threshold == 0.999)


def simuformer_depth(name: str, cfg: NormalizationConfig) -> float:
    """The depth of this experiment's run of ``name`` that corresponds to the authors' t = 20:
    t = 20 for post-LN; for nGPT our layer is N(θ + sÂ) with s = αh/(1 − αh) and theirs
    N(θ + 0.2hÂ), the same map with another step, so their 200 layers of 0.2h end where ours
    have taken the same total step, at depth 20 · 0.2h/s."""
    if name != "ngpt":
        return SIMUFORMER_TIME
    ah = cfg.ngpt_alpha * cfg.step
    return SIMUFORMER_TIME * SIMUFORMER_NGPT_STEP * cfg.step / (ah / (1 - ah))


def _published(ax, res: Result, cfg: NormalizationConfig, beta) -> None:
    """The authors' published P(clustered pair) for the schemes it tests (post-LN, nGPT), at the
    depth of our run that corresponds to their t = 20 (:func:`simuformer_depth`)."""
    k = np.nonzero(np.isclose(res["simuformer_betas"], beta))[0]
    for p, name in enumerate(res["simuformer_schemes"]):
        s = np.nonzero(res["schemes"] == name)[0]
        if k.size and s.size and res["simuformer_is_model"][p]:
            ax.plot(simuformer_depth(str(name), cfg), res["simuformer_fraction"][p, k[0]], "o", mfc="none",
                    color=f"C{s[0]}", ms=7)
