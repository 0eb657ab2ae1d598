r"""Normalizing flows by perceptron controls, measured in relative entropy: A. Álvarez-López,
B. Geshkovski, D. Ruiz-Balet, *Constructive approximate transport maps with normalizing flows*,
arXiv 2412.19366 (Appl. Math. Optim. 92, 2025; seed 003, fifth abstract; docs:
math/mean_field.md#normalizing-flows).

The continuity equation ∂_t ρ + div(ρ v) = 0 with the perceptron field

$$v(t, x) = w(t)\,\sigma\big(a(t)^\top x + b(t)\big),\qquad \theta=(w, a, b)\ \text{piecewise constant},$$

transports the base density ρ_B = N(0, I_2) towards a target ρ_* in R². With s switches the
horizon [0, T] is cut into s + 1 equal pieces, θ constant on each, ``width`` neurons per piece
(the abstract's field is one ReLU neuron: ``--activation relu --width 1``; the default is 16 tanh
neurons, see below). The flow is the composition of the pieces' flows, one ``tp.solve`` per
piece (a ``lax.scan``), so no solver step straddles a switch. Each token carries log ρ along
its path (``tp.WithLogDensity``: d/dt log ρ = −div v = −Σ_k (a_kᵀw_k) σ'(a_kᵀx + b_k)), and the
loss is the relative entropy of the abstract,

$$\mathrm{KL}(\rho(T)\,\|\,\rho_*) = \mathbb E_{x\sim\rho_B}\big[\log\rho(T,\Phi_T x)-\log\rho_*(\Phi_T x)\big],$$

on a fixed Monte Carlo sample of the base (``loss="monte-carlo"``) or on the tensor Gauss–Hermite
rule of the base (``loss="quadrature"``: the mean field, no sampling noise;
``tp.diagnostics.relative_entropy`` with the rule's weights), minimized with Adam (rate decayed
by a cosine, the best iterate kept: ``tp.BestIterate``) through the solver (``tp.fit``). Each
number of switches starts from the fit of the next smaller one, embedded exactly
(:func:`embed_controls`), so the training loss never rises with s. The reported KL is measured on
fresh samples (with its standard error), and again with the flow solved 4× finer by Tsit5 (the
fit must not live on its solver's error), against the number of switches, for two targets: a
two-moon-like Gaussian mixture and a bivariate Student t (ν = 3, heavier tails than the base:
the relative tail decay of the abstract's assumption). The "no flow" KL of the base is computed
by quadrature (:func:`no_flow_kl`, with its refinement error), and the best Gaussian's KL
(:func:`best_gaussian_kl`) marks what an affine flow reaches.

Why the moons fit was one lump, measured (seed 0): the map class. One ReLU neuron per piece
moves a half-plane by one linear flow, so s + 1 pieces make a piecewise-affine map with s + 1
folds, which bends the base but cannot open the gap between the moons: with Adam's rate decayed,
the best iterate kept, warm starts and 4096 samples (each of which was needed: the last iterate
was up to 0.1 above the best, cold starts at s = 3 scored above s = 1, 512 samples were
overfitted) it reached 0.49 ± 0.014 at s = 7 (best Gaussian 0.645), still a lump. Widening the
ReLU pieces made it worse (width 16: training 0.39 → 0.49): a token crossing another neuron's
kink inside a step makes the carried log ρ jump in the controls, invisibly to the gradient. A
smooth σ has no kinks: 16 tanh neurons per piece give two moons already at s = 0. Two traps,
measured: at 4 Heun steps per piece the tanh fit's training loss went negative (−0.31; a KL is
not), the fit living on the solver's error, hence 8 steps and the fine-solve check; the
Gauss–Hermite loss (48² nodes) is overfitted even more (training −0.73, fresh 0.45), so Monte
Carlo stays the default.

Default run (seed 0, tanh, width 16, 8 Heun steps per piece, 300 Adam steps, 4096 training
samples, KL on 8192 fresh samples ± 1 s.e.; 2.5 CPU minutes, 12 minutes on 2 cores shared with
other jobs): moons 1.8043 with no flow (quadrature, error < 1e-8), 0.055 / 0.035 / 0.024 ± 0.003
with s = 0 / 1 / 3 switches (4× finer solve 0.056 / 0.038 / 0.029; best Gaussian 0.645): two
moons; Student t 0.3788 with no flow, 0.0111 / 0.0087 / 0.0060 ± 0.001 (finer solve 0.012 /
0.010 / 0.010), far below the best Gaussian's 0.0853. The training loss is below the fresh KL
(moons 0.025 / 0.006 / −0.005): 4096 samples and the 8-step solver are both fitted a little.
"""
from __future__ import annotations

import functools
import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import transformer_pde as tp

from ..runs.result import Result
from .configs.normalizing_flow import NormalizingFlowConfig

# ------------------------------------------------------------------------------ target densities


def gaussian_log_density(x, mean, cov):
    """log N(mean, cov) at the rows of x."""
    L = jnp.linalg.cholesky(cov)
    z = jax.scipy.linalg.solve_triangular(L, (x - mean[None, :]).T, lower=True)
    return -0.5 * jnp.sum(z**2, axis=0) - jnp.sum(jnp.log(jnp.diag(L))) - x.shape[1] / 2 * math.log(2 * math.pi)


def moons_log_density(x, scale: float = 1.5, sigma: float = 0.25, per_moon: int = 8):
    """Two interleaved half circles (the two-moons picture), each a uniform mixture of ``per_moon``
    isotropic Gaussians of standard deviation ``sigma``; centred and scaled by ``scale``."""
    th = jnp.linspace(0.0, math.pi, per_moon)
    upper = jnp.stack([jnp.cos(th), jnp.sin(th)], axis=1)
    lower = jnp.stack([1.0 - jnp.cos(th), 0.5 - jnp.sin(th)], axis=1)
    centres = scale * (jnp.concatenate([upper, lower]) - jnp.array([0.5, 0.25])[None, :])
    d2 = jnp.sum((x[:, None, :] - centres[None, :, :]) ** 2, axis=-1)
    k = centres.shape[0]
    return (jax.scipy.special.logsumexp(-0.5 * d2 / sigma**2, axis=1) - math.log(k)
            - math.log(2 * math.pi * sigma**2))


def student_log_density(x, nu: float = 3.0):
    """Bivariate Student t with ν degrees of freedom, location (0.5, 0), scale [[1, .6], [.6, 1]]:
    tails |x|^{−(ν+2)}, heavier than the Gaussian base."""
    loc = jnp.array([0.5, 0.0])
    S = jnp.array([[1.0, 0.6], [0.6, 1.0]])
    L = jnp.linalg.cholesky(S)
    z = jax.scipy.linalg.solve_triangular(L, (x - loc[None, :]).T, lower=True)
    r2 = jnp.sum(z**2, axis=0)
    return (math.lgamma((nu + 2) / 2) - math.lgamma(nu / 2) - math.log(nu * math.pi)
            - jnp.sum(jnp.log(jnp.diag(L))) - (nu + 2) / 2 * jnp.log1p(r2 / nu))


TARGETS = {"moons": moons_log_density, "student": student_log_density}


def base_log_density(x):
    """log ρ_B, the standard Gaussian of R^d."""
    return -0.5 * jnp.sum(x**2, axis=1) - x.shape[1] / 2 * math.log(2 * math.pi)


# ------------------------------------------------------------------------------ the flow


def init_controls(key, switches: int, width: int = 1, d: int = 2):
    """θ = (w, a, b) for s + 1 pieces: a_l (width, d) unit rows, b_l ~ U(−1, 1) (each neuron
    active on part of the base), w_l (d, width) ~ N(0, 0.1²/width) (a near-identity start)."""
    if int(switches) < 0 or int(width) < 1:
        raise ValueError(f"need switches >= 0 and width >= 1, got switches={switches}, width={width}")
    P = int(switches) + 1
    ka, kb, kw = jax.random.split(key, 3)
    a = jax.random.normal(ka, (P, int(width), d))
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    b = jax.random.uniform(kb, (P, int(width)), minval=-1.0, maxval=1.0)
    w = 0.1 / math.sqrt(int(width)) * jax.random.normal(kw, (P, d, int(width)))
    return w, a, b


def push(controls, x0, log_rho0, *, t1, substeps, solver=None, activation=None):
    """Tokens and their log-density after the flow of the piecewise-constant perceptron
    v = w σ(aᵀx + b) (σ = ``activation``, None: relu): ``(x (n, d), log_rho (n,))`` at T = t1 (one
    ``tp.solve`` per piece, in a ``lax.scan``)."""
    w, a, b = controls
    tau = float(t1) / a.shape[0]
    d = x0.shape[1]
    activation = jax.nn.relu if activation is None else activation

    def piece(carry, theta):
        wl, al, bl = theta
        field = tp.MLP(al, bl, wl, jnp.zeros(d, x0.dtype), activation=activation)  # v = w σ(a x + b)
        # no blow-up watch: a field growing at most linearly cannot blow up in finite time
        sol = tp.solve(field, tp.WithLogDensity(carry[0], carry[1]), t1=tau, dt0=tau / substeps,
                       solver=solver, event=None)
        return sol.final, None

    out, _ = jax.lax.scan(piece, (x0, log_rho0), (w, a, b))
    return out


def embed_controls(controls, switches: int, key):
    """The controls of a fit with fewer switches as controls with ``switches`` switches defining the
    same flow: the old piece j (length T/P) becomes the new piece ⌊jP'/P⌋ (length T/P') with w
    scaled by P'/P (the flow of cv for time τ/c is the flow of v for time τ; a Runge–Kutta step
    of h/c on cv is the step of h on v), the other pieces w = 0 (the identity) with fresh (a, b)
    from ``key`` (:func:`init_controls`). The larger fit warm-started here starts at the smaller
    fit's loss, so with the best iterate kept it never ends above it."""
    w, a, b = controls
    P, Pn = a.shape[0], int(switches) + 1
    if Pn < P:
        raise ValueError(f"embed_controls: {P - 1} switches cannot be embedded in fewer, got switches={switches}")
    wn, an, bn = init_controls(key, Pn - 1, a.shape[1], a.shape[2])
    at = (np.arange(P) * Pn) // P
    return (jnp.zeros_like(wn).at[at].set(w * (Pn / P)), an.at[at].set(a), bn.at[at].set(b))


def base_rule(order: int):
    """``(nodes (order², 2), weights (order²,))``: the tensor Gauss–Hermite rule of the base N(0, I₂)
    (``tp.GaussHermiteRule``), exact for polynomials of degree <= 2·order − 1 per axis."""
    rule = tp.GaussHermiteRule(jnp.zeros(2), jnp.eye(2))
    tokens = rule(None, order, dtype=jnp.zeros(()).dtype)
    return tokens.x, tokens.weights


def flow_kl(controls, x0, log_target, *, t1, substeps, solver=None, weights=None, activation=None):
    """KL(ρ(T) ‖ ρ_*) on the base tokens x0: the Monte Carlo mean over base samples (``weights``
    None) or the quadrature rule ``(x0, weights)`` of the base (:func:`base_rule`)."""
    x, log_rho = push(controls, x0, base_log_density(x0), t1=t1, substeps=substeps, solver=solver,
                      activation=activation)
    return tp.diagnostics.relative_entropy(x, log_rho, log_target, weights)


def no_flow_kl(log_target, half_width: float = 12.0, nodes: int = 961):
    """``(KL, error)``: KL(ρ_B ‖ ρ_*) of the base itself (no flow), by the tensor trapezoid rule on
    [−``half_width``, ``half_width``]² with ``nodes`` points per axis (the base's mass outside is
    below e^{−half_width²/2}; for a smooth integrand decaying this fast the rule converges
    spectrally, where the Gauss–Hermite rule resolves the moons' σ = 0.25 only at order ~ 250),
    and its error estimated against the rule with every other node (no sampling noise)."""
    nodes = int(nodes)
    if nodes < 5 or nodes % 2 == 0:
        raise ValueError(f"no_flow_kl: nodes must be odd and >= 5 (the coarse rule takes every other one), got {nodes}")
    g = np.linspace(-half_width, half_width, nodes)
    X, Y = np.meshgrid(g, g, indexing="ij")
    x = jnp.asarray(np.stack([X.ravel(), Y.ravel()], axis=1))
    lb = base_log_density(x)
    f = np.asarray(jnp.exp(lb) * (lb - log_target(x)), np.float64).reshape(nodes, nodes)
    h = g[1] - g[0]
    fine, coarse = float(f.sum() * h * h), float(f[::2, ::2].sum() * 4 * h * h)
    return fine, abs(fine - coarse)


def best_gaussian_kl(log_target, order: int = 48) -> float:
    """min over N(m, LLᵀ) of KL(N(m, LLᵀ) ‖ ρ_*): the Gauss–Hermite rule of N(0, I₂) mapped by
    z ↦ m + Lz (``order`` nodes per axis), minimized by BFGS; the score an affine flow can reach."""
    from scipy.optimize import minimize

    z, wz = base_rule(order)

    def kl(p):  # p = (m, log L11, L21, log L22)
        L = jnp.array([[jnp.exp(p[2]), 0.0], [p[3], jnp.exp(p[4])]])
        x = p[:2][None, :] + z @ L.T
        return jnp.sum(wz * (base_log_density(z) - p[2] - p[4] - log_target(x)))

    # kept between processes (tp.runs.kept), as every program of a run
    value_and_grad = tp.runs.kept(lambda p: jax.value_and_grad(kl)(p))
    res = minimize(lambda p: tuple(np.asarray(v, np.float64) for v in value_and_grad(jnp.asarray(p, z.dtype))),
                   np.zeros(5), jac=True, method="BFGS")
    return float(res.fun)


@functools.cache
def _compiled_kl():
    return eqx.filter_jit(flow_kl)


def _push_positional(controls, x0, log_rho0, t1, substeps, solver, activation):
    return push(controls, x0, log_rho0, t1=t1, substeps=substeps, solver=solver, activation=activation)


@functools.cache
def _compiled_push():
    """:func:`push`, compiled once and kept between processes (``tp.runs.kept``: the solves'
    checks inside are host callbacks, which JAX's cache alone recompiles in every process)."""
    kept = tp.runs.kept(_push_positional)
    return lambda controls, x0, log_rho0, *, t1, substeps, solver=None, activation=None: kept(
        controls, x0, log_rho0, t1, substeps, solver, activation)


def fit_flow(log_target, x0, controls, *, t1, substeps, solver=None, steps=400, learning_rate=0.03,
             progress=None, weights=None, activation=None):
    """Fit θ by Adam (learning rate decayed to 0 by a cosine) on KL(ρ(T) ‖ ρ_*) over the base tokens
    ``x0`` (Monte Carlo, or the quadrature rule ``(x0, weights)``), keeping the iterate of least
    loss (``tp.BestIterate``): ``tp.FitResult``.

    ``log_target`` must be a normalized log-density on R² (checked:
    :func:`tp.diagnostics.check_normalized`), positive wherever the initial flow sends the
    samples (else a ValueError naming the token, before any step)."""
    tp.diagnostics.check_normalized(log_target, x0.shape[1], scale=1.0)
    # the initial KL with concrete tokens: a zero target density at a token is a ValueError naming it
    x, log_rho = _compiled_push()(controls, x0, base_log_density(x0), t1=t1, substeps=substeps, solver=solver,
                                  activation=activation)
    tp.diagnostics.relative_entropy(x, log_rho, log_target, weights)
    loss = lambda c: _compiled_kl()(c, x0, log_target, t1=t1, substeps=substeps, solver=solver,  # noqa: E731
                                    weights=weights, activation=activation)
    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))
    return tp.fit(controls, loss, optimizer=optimizer, steps=steps, progress=progress,
                  keep=tp.BestIterate())


_SOLVERS = {"euler": diffrax.Euler, "heun": diffrax.Heun, "tsit5": diffrax.Tsit5}
"""The diffrax solver class of each value of the ``solver`` option."""


def activation_function(name: str):
    """σ of the option ``activation`` (the dict is built on call: JAX is imported lazily)."""
    return {"tanh": jnp.tanh, "relu": jax.nn.relu}[name]


def compute(cfg: NormalizingFlowConfig, progress: bool = False) -> Result:
    if not cfg.targets:
        raise ValueError("targets must name at least one target")
    solver = _SOLVERS[cfg.solver]()
    act = activation_function(cfg.activation)
    flow = dict(t1=cfg.t1, activation=act)
    k_train, k_eval, k_init = jax.random.split(jax.random.key(cfg.seed), 3)
    if cfg.loss == "quadrature":
        x_train, w_train = base_rule(cfg.order)
    else:
        x_train, w_train = jax.random.normal(k_train, (cfg.n, 2)), None
    x_eval = jax.random.normal(k_eval, (cfg.n_eval, 2))
    lr_eval = base_log_density(x_eval)
    switches = np.asarray(sorted(set(cfg.switches)), dtype=int)
    T, S = len(cfg.targets), len(switches)
    kl, kl_se, kl_train, kl_fine = np.zeros((T, S)), np.zeros((T, S)), np.zeros((T, S)), np.zeros((T, S))
    kl0, kl0_err, kl_gauss = np.zeros(T), np.zeros(T), np.zeros(T)
    pushed, log_rho = np.zeros((T, S, cfg.n_eval, 2)), np.zeros((T, S, cfg.n_eval))
    losses = np.full((T, S, cfg.steps + 1), np.nan)
    for i, name in enumerate(cfg.targets):
        log_target = TARGETS[name]
        kl0[i], kl0_err[i] = no_flow_kl(log_target)
        kl_gauss[i] = best_gaussian_kl(log_target)
        controls = None
        for j, s in enumerate(switches):
            key = jax.random.fold_in(k_init, int(s))
            # each fit starts from the previous one (the same flow, exactly): never above its loss
            controls = (init_controls(key, int(s), cfg.width) if controls is None
                        else embed_controls(controls, int(s), key))
            observer = tp.fitting.tqdm_progress(cfg.steps, f"{name}, {s} switches") if progress else None
            controls, hist, final = fit_flow(log_target, x_train, controls, substeps=cfg.substeps, solver=solver,
                                             steps=cfg.steps, learning_rate=cfg.learning_rate,
                                             progress=observer, weights=w_train, **flow)
            x, lr = _compiled_push()(controls, x_eval, lr_eval, substeps=cfg.substeps, solver=solver, **flow)
            # the same flow solved 4× finer by Tsit5: what the fitted controls do, not the fit's steps
            xf, lrf = _compiled_push()(controls, x_eval, lr_eval, substeps=4 * cfg.substeps,
                                       solver=diffrax.Tsit5(), **flow)
            kl_fine[i, j] = float(tp.diagnostics.relative_entropy(xf, lrf, log_target))
            terms = np.asarray(lr - log_target(x))
            kl[i, j] = float(tp.diagnostics.relative_entropy(x, lr, log_target))
            kl_se[i, j] = float(np.std(terms) / math.sqrt(cfg.n_eval))
            kl_train[i, j] = final
            pushed[i, j], log_rho[i, j] = np.asarray(x), np.asarray(lr)
            losses[i, j, : len(hist) + 1] = np.concatenate([hist, [final]])
    return Result({
        "switches": switches, "kl": kl, "kl_stderr": kl_se, "kl_train": kl_train, "kl_fine": kl_fine,
        "kl_identity": kl0, "kl_identity_error": kl0_err, "kl_best_gaussian": kl_gauss,
        "pushed": pushed.astype(np.float32), "log_rho": log_rho.astype(np.float32), "losses": losses,
    })


def figures(res: Result, cfg: NormalizingFlowConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    switches, kl, se = res["switches"], res["kl"], res["kl_stderr"]
    fig, ax = plt.subplots(figsize=(6.5, 6), layout="constrained")
    est = (f"{cfg.n} Monte Carlo samples" if cfg.loss == "monte-carlo"
           else f"Gauss–Hermite rule, {cfg.order}² nodes")
    for i, name in enumerate(cfg.targets):
        ax.errorbar(switches, kl[i], yerr=2 * se[i], marker="o", capsize=3, color=f"C{i}",
                    label=f"{name}: fresh samples (n = {cfg.n_eval}), ±2 s.e.")
        ax.plot(switches, res["kl_train"][i], marker="x", ls="--", lw=1, color=f"C{i}",
                label=f"{name}: training loss ({est})")
        ax.plot(switches, res["kl_fine"][i], marker="+", ls="none", ms=9, color=f"C{i}",
                label=f"{name}: fresh samples, the flow solved 4× finer (Tsit5)")
        ax.axhline(float(res["kl_identity"][i]), color=f"C{i}", ls=":", lw=1)
        ax.axhline(float(res["kl_best_gaussian"][i]), color=f"C{i}", ls="-.", lw=1)
        ax.annotate(f"no flow {res['kl_identity'][i]:.4f} (quadrature, ±{res['kl_identity_error'][i]:.0e})",
                    (switches[-1], float(res["kl_identity"][i])), fontsize=7, ha="right", va="bottom")
        ax.annotate(f"best Gaussian {res['kl_best_gaussian'][i]:.3f}",
                    (switches[0], float(res["kl_best_gaussian"][i])), fontsize=7, ha="left", va="bottom")
    # symlog: a training loss may be below 0 (the fit's sample and solver error; a KL is not)
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_ylim(min(0.0, 1.5 * float(np.min(res["kl_train"]))), 3.0 * float(np.max(res["kl_identity"])))
    ax.set_xlabel("switches s of the controls θ = (w, a, b)")
    ax.set_ylabel("KL(ρ(T) ‖ ρ*)")
    ax.set_title(f"perceptron flow w·{cfg.activation}(aᵀx + b), width {cfg.width}, T = {cfg.t1:g}; "
                 "each s warm-started from the previous\n"
                 "dotted: the base (no flow, exact); dash-dot: the best Gaussian (quadrature)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    kl_path = tp.plot.save_figure(fig, out_dir / "kl_vs_switches.png")

    T, S = len(cfg.targets), len(switches)
    fig, axes = plt.subplots(T, S + 1, figsize=(3.0 * (S + 1), 3.0 * T), layout="constrained", squeeze=False)
    lim = 4.0
    g = np.linspace(-lim, lim, 161)
    gx, gy = np.meshgrid(g, g)
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
    for i, name in enumerate(cfg.targets):
        dens = np.exp(np.asarray(TARGETS[name](jnp.asarray(grid)))).reshape(gx.shape)
        vmax = float(dens.max())
        axes[i, 0].imshow(dens, extent=(-lim, lim, -lim, lim), origin="lower", cmap="viridis", vmin=0, vmax=vmax)
        axes[i, 0].set_title(f"target ρ* ({name})", fontsize=9)
        for j, s in enumerate(switches):
            ax = axes[i, j + 1]
            x, rho = res["pushed"][i, j], np.exp(res["log_rho"][i, j])
            ax.set_facecolor("black")
            ax.scatter(x[:, 0], x[:, 1], c=rho, s=2, cmap="viridis", vmin=0, vmax=vmax, linewidths=0)
            ax.set_xlim(-lim, lim)
            ax.set_ylim(-lim, lim)
            ax.set_title(f"ρ(T) at fresh pushed samples, s = {s}\n"
                         f"KL on fresh samples {kl[i, j]:.3g} ± {se[i, j]:.1g}", fontsize=9)
        for ax in axes[i]:
            ax.set_aspect("equal")
            ax.tick_params(labelsize=7)
    fig.suptitle("base N(0, I) pushed by the perceptron flow; colour: the carried density ρ(T, x) "
                 "(same scale as the target)", fontsize=10)
    # the pushed laws first: the gallery shows a run's first figure
    return [tp.plot.save_figure(fig, out_dir / "pushed_densities.png"), kl_path]
