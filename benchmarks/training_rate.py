"""Training-rate benchmark (issue 39 item 4): a small attention-only Transformer of depth L with H
heads, trained with AdamW on a synthetic task, against the mean-field ODE, and the measured rate
against Gibson–Reisinger's O(L⁻¹ + L^{-1/3}H^{-1/2}) (arXiv 2605.11059).

The network (their setting: unmasked attention only, 1/L residual steps, heads averaged with
weight 1/H, heads drawn i.i.d. per layer and head, then trained):

    x_i ← x_i + (1/L)·(1/H) Σ_h Σ_j softmax_j(⟨Q_{l,h}x_i, K_{l,h}x_j⟩) V_{l,h}x_j,

is ``tp.layers`` (Euler, one step per layer) of ``tp.MultiHeadAttention`` whose Q, K, V are
``tp.PiecewiseConstant`` stacks over depth t ∈ [0, 1] and W = I/H; training is ``tp.fit`` with
``optax.adamw`` through it. The same trained, depth-indexed parameters define the continuous-depth
ODE ``tp.solve`` integrates accurately (Tsit5, at most 1/64 per step, stepping to every layer
boundary), so the error of a trained (L, H) network splits into

- ``disc``: its Euler layers against the ODE of its own trained parameters (no reference needed;
  the L⁻¹ part),
- ``heads``: that ODE against the mean-field ODE (H heads per layer are a Monte Carlo sample of
  the trained head law ν_t, and training itself saw the finite network),
- ``total``: its layers against the mean-field ODE,
- ``init``: the untrained network against its mean-field ODE, which is exact here: the initial
  head law has V independent of (Q, K) and symmetric, B_θ is odd in V, so the mean field is zero
  and the ODE's solution is x(t) = x(0) (no reference needed; the heads' Monte Carlo part alone),

each the root-mean-square over the test tokens of the hidden state at depth 1. The mean-field ODE
is not known in closed form: its proxy is ``tp.solve`` of the ODE whose per-depth head law is the
population of a large reference network (L_ref, H_ref) trained the same way. The proxy's own
error (O(1/L_ref) from training at finite depth, (L_ref H_ref)^{-1/2} from its heads) is reported
as the distance to a second reference of depth L_ref/2.

    python benchmarks/training_rate.py [--tiny] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import transformer_pde as tp  # noqa: E402

SIZES = {
    "full": dict(Ls=(4, 8, 16, 32), Hs=(2, 8, 32, 128), seeds=4, L_ref=128, H_ref=256, steps=30,
                 bootstrap=300),
    "tiny": dict(Ls=(2, 4), Hs=(2, 4), seeds=2, L_ref=8, H_ref=8, steps=2, bootstrap=20),
}
D, K, N_TOKENS, N_SEQ = 4, 4, 8, 16  # token dimension, query/key width, tokens per sequence, sequences
LR, WEIGHT_DECAY = 2e-2, 1e-3
# Adam's update is invariant to the 1/(LH) scale of a head's gradient only while eps is far below it
EPS = 1e-14
MAX_STEP = 1.0 / 64  # the ODE's largest step (Tsit5: its own error far below every Euler error here)


def init_heads(key, num_layers: int, num_heads: int) -> tp.MultiHeadAttention:
    """The network at initialization: Q, K, V entries N(0, 1/d), i.i.d. over layers and heads (the
    head law ν_0 has mean field zero: B_θ is odd in V), W = I/H (the 1/H average, not trained)."""
    shapes = dict(Q=(K, D), K=(K, D), V=(D, D))
    keys = dict(zip(shapes, jr.split(key, 3)))
    stack = {name: tp.PiecewiseConstant(jr.normal(keys[name], (num_layers, num_heads, *s)) / np.sqrt(D),
                                        0.0, 1.0 / num_layers)
             for name, s in shapes.items()}
    return tp.MultiHeadAttention(stack["Q"], stack["K"], stack["V"], jnp.eye(D) / num_heads, 1.0,
                                 backend=tp.kernels.Exact())


def init_seeds(key, num_layers: int, num_heads: int, seeds: int) -> tp.MultiHeadAttention:
    """``seeds`` independent networks stacked on a leading axis of every array (trained together:
    their losses are summed, and AdamW acts on each coordinate alone, so each trains as if alone)."""
    return eqx.filter_vmap(lambda k: init_heads(k, num_layers, num_heads))(jr.split(key, seeds))


def num_layers(attn: tp.MultiHeadAttention) -> int:
    return attn.Q.num_layers


def layers(attn, X):
    """The residual network (Euler, one step per layer) on a batch of sequences ``(B, n, d)``."""
    L = num_layers(attn)
    return jax.vmap(lambda x: tp.layers(attn, x, L, 1.0 / L).xs[-1])(X)


def ode(attn, X):
    """The continuous-depth ODE of the same depth-indexed parameters to depth 1 (Tsit5)."""
    L = num_layers(attn)
    dt = 1.0 / (L * max(1, int(np.ceil(1.0 / (L * MAX_STEP)))))
    return jax.vmap(lambda x: tp.solve(attn, x, t1=1.0, dt0=dt, solver=diffrax.Tsit5()).xs[-1])(X)


def refined(attn, L: int, H: int) -> tp.MultiHeadAttention:
    """The same seed-stacked networks as L layers of H heads: each layer repeated (the same
    function of depth) and heads with V = 0 added (they add exactly 0), W = I/H_own kept; so one
    compiled ODE serves every (L, H) of the grid."""
    L0, H0 = attn.Q.values.shape[1:3]  # (seeds, layers, heads, ., .)

    def grid(P):
        v = jnp.repeat(P.values, L // L0, axis=1)
        return jnp.concatenate([v, jnp.zeros((*v.shape[:2], H - H0, *v.shape[3:]), v.dtype)], axis=2)

    Q, K, V = (grid(P) for P in (attn.Q, attn.K, attn.V))
    # built anew (not eqx.tree_at): the constructor binds the backend to these Q and K
    return eqx.filter_vmap(lambda q, k, v, w, b: tp.MultiHeadAttention(
        tp.PiecewiseConstant(q, 0.0, 1.0 / L), tp.PiecewiseConstant(k, 0.0, 1.0 / L),
        tp.PiecewiseConstant(v, 0.0, 1.0 / L), w, b, backend=tp.kernels.Exact()))(
        Q, K, V, attn.W, attn.beta)


# over the seeds' axis of a stack of networks (init_seeds), one compiled program per (L, H)
layers_seeds = eqx.filter_jit(eqx.filter_vmap(layers, in_axes=(eqx.if_array(0), None)))
ode_seeds = eqx.filter_jit(eqx.filter_vmap(ode, in_axes=(eqx.if_array(0), None)))


def task(key):
    """A teacher–student task: sequences X ~ N(0, I) of n tokens, targets the flow to depth 1 of a
    single-head teacher attention (random Q*, K*, V* = I/2)."""
    kq, kk, ktr, kte = jr.split(key, 4)
    teacher = tp.SoftmaxAttention(jr.normal(kq, (D, D)), jr.normal(kk, (D, D)), 0.5 * jnp.eye(D), 1.0 / np.sqrt(D))
    flow = jax.vmap(lambda x: tp.solve(teacher, x, t1=1.0, dt0=MAX_STEP).xs[-1])
    Xtr, Xte = jr.normal(ktr, (N_SEQ, N_TOKENS, D)), jr.normal(kte, (N_SEQ, N_TOKENS, D))
    return Xtr, flow(Xtr), Xte, flow(Xte)


def train(attn, Xtr, Ytr, steps: int):
    """AdamW on the mean squared error of the networks' outputs (a stack of seeds: their sum), Q,
    K, V trained (W = I/H fixed)."""
    def loss(a):
        return jnp.sum(jnp.mean(jnp.sum((layers_seeds(a, Xtr) - Ytr) ** 2, axis=-1), axis=(1, 2)))

    opt = optax.adamw(LR, eps=EPS, weight_decay=WEIGHT_DECAY)
    return tp.fit(attn, loss, optimizer=opt, steps=steps, trainable=lambda m: (m.Q, m.K, m.V))


def rms(a, b) -> np.ndarray:
    """Root-mean-square distance over the tokens of the last three axes (one per seed)."""
    return np.sqrt(np.mean(np.sum((np.asarray(a) - np.asarray(b)) ** 2, axis=-1), axis=(-2, -1)))


def joint_fit(Ls, Hs, errors):
    """Fit err(L, H) = a·L^{-α} + b·L^{-γ}H^{-δ} on log scale to the seed-mean errors ``(nL, nH)``.
    Returns (α, γ, δ, a, b)."""
    from scipy.optimize import least_squares

    LL, HH = np.meshgrid(np.log(Ls), np.log(Hs), indexing="ij")
    y = np.log(errors)

    def resid(p):
        la, al, lb, ga, de = p
        return np.logaddexp(la - al * LL, lb - ga * LL - de * HH).ravel() - y.ravel()

    p0 = np.array([np.log(errors.min()) + np.log(Ls[-1]), 1.0, np.log(errors.max()), 0.5, 0.5])
    r = least_squares(resid, p0, bounds=([-30, 0, -30, 0, 0], [10, 3, 10, 3, 3]))
    la, al, lb, ga, de = r.x
    return float(al), float(ga), float(de), float(np.exp(la)), float(np.exp(lb))


def bootstrap_joint(Ls, Hs, errs, num, seed=0):
    """The joint fit and percentile 95 % intervals, seeds resampled in every (L, H) cell;
    ``errs`` ``(nL, nH, S)``, fitted to seed means."""
    rng = np.random.default_rng(seed)
    best = joint_fit(Ls, Hs, errs.mean(-1))
    S = errs.shape[-1]
    boots = []
    for _ in range(num):
        idx = rng.integers(0, S, size=errs.shape)
        boots.append(joint_fit(Ls, Hs, np.take_along_axis(errs, idx, axis=-1).mean(-1)))
    boots = np.array(boots)
    ci = [(float(np.quantile(boots[:, i], 0.025)), float(np.quantile(boots[:, i], 0.975))) for i in range(3)]
    return dict(alpha=best[0], gamma=best[1], delta=best[2], a=best[3], b=best[4],
                alpha_ci=ci[0], gamma_ci=ci[1], delta_ci=ci[2])


def rate(ns, errs, num):
    f = tp.statistics.fit_rate(ns, errs, num_bootstrap=num)
    return dict(slope=f.slope, ci=list(f.slope_ci))


def run(size: str, log=print):
    cfg = SIZES[size]
    Ls, Hs, S = np.array(cfg["Ls"]), np.array(cfg["Hs"]), cfg["seeds"]
    Xtr, Ytr, Xte, Yte = task(jr.key(2605))
    t0 = time.perf_counter()

    def trained(L, H, key, seeds):
        model, losses, final = train(init_seeds(key, int(L), int(H), seeds), Xtr, Ytr, cfg["steps"])
        return model, float(losses[0]) / seeds, final / seeds

    ref, ref_loss0, ref_loss = trained(cfg["L_ref"], cfg["H_ref"], jr.key(10**6), 1)
    X_ref = ode_seeds(ref, Xte)[0]
    half, _, _ = trained(cfg["L_ref"] // 2, cfg["H_ref"], jr.key(10**6 + 1), 1)
    reference = dict(L=cfg["L_ref"], H=cfg["H_ref"], loss_init=ref_loss0, loss=ref_loss,
                     own_disc=float(rms(layers_seeds(ref, Xte)[0], X_ref)),
                     vs_half_depth=float(rms(ode_seeds(half, Xte)[0], X_ref)),
                     test_loss=float(rms(X_ref, Yte) ** 2))
    log(f"reference {reference} ({time.perf_counter() - t0:.0f} s)")
    names = ("total", "disc", "heads", "init")
    errs = {k: np.zeros((len(Ls), len(Hs), S)) for k in names}
    losses = np.zeros((len(Ls), len(Hs)))
    for i, L in enumerate(Ls):
        for j, H in enumerate(Hs):
            key = jr.fold_in(jr.key(0), 1000 * int(L) + int(H))
            errs["init"][i, j] = rms(layers_seeds(init_seeds(key, int(L), int(H), S), Xte), Xte)
            model, _, losses[i, j] = trained(L, H, key, S)
            xl, xo = layers_seeds(model, Xte), ode_seeds(refined(model, int(Ls[-1]), int(Hs[-1])), Xte)
            errs["total"][i, j], errs["disc"][i, j], errs["heads"][i, j] = rms(xl, X_ref), rms(xl, xo), rms(xo, X_ref)
            log(f"L={L} H={H}: " + ", ".join(f"{k} {errs[k][i, j].mean():.3e}" for k in names)
                + f", train loss {losses[i, j]:.3e} ({time.perf_counter() - t0:.0f} s)")
    nb = cfg["bootstrap"]
    fits = dict(
        joint_total=bootstrap_joint(Ls, Hs, errs["total"], nb),
        disc_vs_L={int(H): rate(Ls, errs["disc"][:, j], nb) for j, H in enumerate(Hs)},
        heads_vs_H={int(L): rate(Hs, errs["heads"][i], nb) for i, L in enumerate(Ls)},
        heads_vs_L={int(H): rate(Ls, errs["heads"][:, j], nb) for j, H in enumerate(Hs)},
        total_vs_L_at_max_H=rate(Ls, errs["total"][:, -1], nb),
        joint_init=bootstrap_joint(Ls, Hs, errs["init"], nb),
        init_vs_H={int(L): rate(Hs, errs["init"][i], nb) for i, L in enumerate(Ls)},
        init_vs_L={int(H): rate(Ls, errs["init"][:, j], nb) for j, H in enumerate(Hs)},
    )
    return dict(size=size, config=cfg, d=D, k=K, tokens=N_TOKENS, sequences=N_SEQ, lr=LR,
                weight_decay=WEIGHT_DECAY, eps=EPS, Ls=Ls.tolist(), Hs=Hs.tolist(), reference=reference,
                errors={k: v.tolist() for k, v in errs.items()}, train_loss=losses.tolist(), fits=fits,
                seconds=time.perf_counter() - t0, machine=f"{platform.machine()}, {platform.python_version()}, "
                f"jax {jax.__version__}")


def _est(f, name):
    """A joint fit's exponent with its interval."""
    return f"{f[name]:.2f} [{f[name + '_ci'][0]:.2f}, {f[name + '_ci'][1]:.2f}]"


def _ci(f):
    return f"{f['slope']:+.2f} [{f['ci'][0]:+.2f}, {f['ci'][1]:+.2f}]"


def markdown(r) -> str:
    Ls, Hs = r["Ls"], r["Hs"]
    e = {k: np.array(v).mean(-1) for k, v in r["errors"].items()}
    out = ["Hidden-state error at depth 1 (RMS over test tokens, mean over seeds): total | disc | heads "
           "(trained) and init (untrained, exact mean field)", "",
           "| L \\ H | " + " | ".join(str(h) for h in Hs) + " |", "|---|" + "---|" * len(Hs)]
    for i, L in enumerate(Ls):
        cells = (" \\| ".join(f"{e[k][i, j]:.2e}" for k in ("total", "disc", "heads", "init")) for j in range(len(Hs)))
        out.append(f"| {L} | " + " | ".join(cells) + " |")
    j = r["fits"]["joint_total"]
    out += ["", "Fitted exponents (95 % bootstrap intervals over seeds):", "",
            "| fit | measured | Gibson–Reisinger bound |", "|---|---|---|",
            f"| total = a L^-α + b L^-γ H^-δ: α | {_est(j, 'alpha')} | 1 |",
            f"| γ | {_est(j, 'gamma')} | 1/3 |",
            f"| δ | {_est(j, 'delta')} | 1/2 |",
            f"| total vs L at H = {Hs[-1]} | {_ci(r['fits']['total_vs_L_at_max_H'])} | −1 (then −1/3) |"]
    out += [f"| disc vs L at H = {H} | {_ci(f)} | −1 |" for H, f in r["fits"]["disc_vs_L"].items()]
    out += [f"| heads vs H at L = {L} | {_ci(f)} | −1/2 |" for L, f in r["fits"]["heads_vs_H"].items()]
    out += [f"| heads vs L at H = {H} | {_ci(f)} | −1/3 |" for H, f in r["fits"]["heads_vs_L"].items()]
    ji = r["fits"]["joint_init"]
    out += [f"| init = a L^-α + b L^-γ H^-δ: α, γ, δ | {_est(ji, 'alpha')}, {_est(ji, 'gamma')}, "
            f"{_est(ji, 'delta')} | 1, 1/3, 1/2 |"]
    out += [f"| init vs H at L = {L} | {_ci(f)} | −1/2 |" for L, f in r["fits"]["init_vs_H"].items()]
    out += [f"| init vs L at H = {H} | {_ci(f)} | −1/3 |" for H, f in r["fits"]["init_vs_L"].items()]
    ref = r["reference"]
    out += ["", f"Reference (L_ref, H_ref) = ({ref['L']}, {ref['H']}): train loss {ref['loss_init']:.3e} → "
            f"{ref['loss']:.3e}; its own Euler-vs-ODE gap {ref['own_disc']:.2e}; distance to the "
            f"depth-{ref['L'] // 2} reference {ref['vs_half_depth']:.2e}. Run time {r['seconds']:.0f} s."]
    return "\n".join(out)


def figure(r, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ls, Hs = np.array(r["Ls"]), np.array(r["Hs"])
    e = {k: np.array(v) for k, v in r["errors"].items()}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    j = r["fits"]["joint_total"]
    for jj, H in enumerate(Hs):
        line = axes[0].loglog(Ls, e["total"][:, jj].mean(-1), "o", label=f"H = {H}")[0]
        Lf = np.geomspace(Ls[0], Ls[-1], 50)
        axes[0].loglog(Lf, j["a"] * Lf ** -j["alpha"] + j["b"] * Lf ** -j["gamma"] * H ** -j["delta"], "-",
                       color=line.get_color(), lw=1)
        axes[1].loglog(Ls, e["disc"][:, jj].mean(-1), "o-", color=line.get_color(), label=f"H = {H}")
    axes[0].set(xlabel="depth L", ylabel="total error", title=f"network vs mean-field ODE; fit α={j['alpha']:.2f}, "
                f"γ={j['gamma']:.2f}, δ={j['delta']:.2f}")
    axes[1].loglog(Ls, e["disc"][:, -1].mean(-1)[0] * Ls[0] / Ls, "k--", lw=1, label="∝ 1/L")
    axes[1].set(xlabel="depth L", ylabel="disc error", title="Euler layers vs ODE of the same weights")
    for ii, L in enumerate(Ls):
        axes[2].loglog(Hs, e["heads"][ii].mean(-1), "o-", label=f"L = {L}")
    axes[2].loglog(Hs, e["heads"][-1, 0].mean() * np.sqrt(Hs[0] / Hs), "k--", lw=1, label="∝ H^-1/2")
    axes[2].set(xlabel="heads H", ylabel="heads error", title="ODE of the weights vs mean-field ODE")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="seconds: L, H in {2, 4}, 2 seeds, 2 steps")
    p.add_argument("--out", type=Path, default=None, help="writes training_rate.{json,md,png}")
    a = p.parse_args(argv)
    r = run("tiny" if a.tiny else "full", log=lambda s: print(s, flush=True))
    md = markdown(r)
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "training_rate.json").write_text(json.dumps(r, indent=1))
        (a.out / "training_rate.md").write_text(md + "\n")
        figure(r, a.out / "training_rate.png")


if __name__ == "__main__":
    main()
