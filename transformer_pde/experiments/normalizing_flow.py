r"""Normalizing flows by perceptron controls, measured in relative entropy: A. Álvarez-López,
B. Geshkovski, D. Ruiz-Balet, *Constructive approximate transport maps with normalizing flows*,
arXiv 2412.19366 (Appl. Math. Optim. 92, 2025; seed 003, fifth abstract; docs:
math/mean_field.md#normalizing-flows).

The continuity equation ∂_t ρ + div(ρ v) = 0 with the perceptron field

$$v(t, x) = w(t)\,\big(a(t)^\top x + b(t)\big)_+,\qquad \theta=(w, a, b)\ \text{piecewise constant},$$

transports the base density ρ_B = N(0, I_2) towards a target ρ_* in R². With s switches the
horizon [0, T] is cut into s + 1 equal pieces, θ constant on each (``width`` neurons per piece;
the abstract's field is one). The flow is the composition of the pieces' flows, one ``tp.solve``
per piece (a ``lax.scan``), so no solver step straddles a switch. Each token carries log ρ along
its path (``tp.WithLogDensity``: d/dt log ρ = −div v = −(aᵀw)·1[aᵀx + b > 0] for one neuron),
and the loss is the relative entropy of the abstract,

$$\mathrm{KL}(\rho(T)\,\|\,\rho_*) = \mathbb E_{x\sim\rho_B}\big[\log\rho(T,\Phi_T x)-\log\rho_*(\Phi_T x)\big],$$

on a fixed Monte Carlo sample of the base (``tp.diagnostics.relative_entropy``), minimized with
Adam through the solver (``tp.fit``). The reported KL is measured on a fresh sample (with its
standard error), against the number of switches, for two targets: a two-moon-like Gaussian
mixture and a bivariate Student t (ν = 3, heavier tails than the base: the relative tail decay of
the abstract's assumption). A ReLU kink crossed inside a solver step makes the carried log ρ first
order in the step there (tests/solvers/test_densities.py); ``substeps`` sets the step.

Default run (seed 0, one neuron per piece, 400 Adam steps; ±2 s.e. ≈ 0.03 and 0.008): moons
KL 1.72 with no flow, 1.23 / 0.65 / 0.69 / 0.58 with s = 0 / 1 / 3 / 7 switches; Student t 0.374
with no flow, 0.128 at every s ≤ 7: the flow of finitely many ReLU pieces is piecewise affine,
so the pushed law keeps Gaussian tails, and a few switches do not improve on the best single
piece (the abstract's switch bound grows with the relative tail decay of ρ_* and ρ_B).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt

import transformer_pde as tp

from .._lazy import diffrax, eqx, jax, jnp, optax
from ..runs.result import Result
from ._base import Experiment, register
from ._options import Options, sizes

TARGET_NAMES = ("moons", "student")


@dataclasses.dataclass(frozen=True)
class NormalizingFlowConfig(Options):
    targets: tuple[Literal["moons", "student"], ...] = TARGET_NAMES
    """Targets ρ_*: 'moons' (a two-moon-like mixture of 16 Gaussians), 'student' (bivariate t, ν = 3)."""
    switches: Annotated[tuple[int, ...], Ge(0)] = (0, 1, 3, 7)
    """Numbers of switches s of the controls (s + 1 constant pieces on [0, t1])."""
    width: Annotated[int, Ge(1)] = 1
    """Neurons per piece (1: the abstract's field w(aᵀx + b)_+)."""
    t1: Annotated[float, Gt(0)] = 4.0
    """Horizon T."""
    substeps: Annotated[int, Ge(1)] = 4
    """Solver steps per piece."""
    solver: Literal["euler", "heun", "tsit5"] = "heun"
    """Runge–Kutta method of the solves."""
    n: Annotated[int, Ge(2)] = 512
    """Base samples the loss averages over (fixed during the fit)."""
    n_eval: Annotated[int, Ge(2)] = 8192
    """Fresh base samples for the reported KL and the figures."""
    steps: Annotated[int, Ge(1)] = 400
    """Adam steps per fit."""
    learning_rate: Annotated[float, Gt(0)] = 0.03
    """Adam learning rate."""
    seed: int = 0

    def footprint(self):
        pieces = ("max(switches) + 1", max(self.switches) + 1)
        return {"pushed samples": sizes(self, "targets", "switches", "n_eval", ("d", 2)),
                "fit states": sizes(self, "n", pieces, "substeps", "width")}


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
    active on part of the base), w_l (d, width) ~ N(0, 0.1²) (a near-identity start)."""
    if int(switches) < 0 or int(width) < 1:
        raise ValueError(f"need switches >= 0 and width >= 1, got switches={switches}, width={width}")
    P = int(switches) + 1
    ka, kb, kw = jax.random.split(key, 3)
    a = jax.random.normal(ka, (P, int(width), d))
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    b = jax.random.uniform(kb, (P, int(width)), minval=-1.0, maxval=1.0)
    w = 0.1 * jax.random.normal(kw, (P, d, int(width)))
    return w, a, b


def push(controls, x0, log_rho0, *, t1, substeps, solver=None):
    """Tokens and their log-density after the flow of the piecewise-constant perceptron:
    ``(x (n, d), log_rho (n,))`` at T = t1 (one ``tp.solve`` per piece, in a ``lax.scan``)."""
    w, a, b = controls
    tau = float(t1) / a.shape[0]
    d = x0.shape[1]

    def piece(carry, theta):
        wl, al, bl = theta
        field = tp.MLP(al, bl, wl, jnp.zeros(d, x0.dtype))  # v = w (a x + b)_+, one piece
        # no blow-up watch: a field growing at most linearly cannot blow up in finite time
        sol = tp.solve(field, tp.WithLogDensity(carry[0], carry[1]), t1=tau, dt0=tau / substeps,
                       solver=solver, event=None)
        return sol.final, None

    out, _ = jax.lax.scan(piece, (x0, log_rho0), (w, a, b))
    return out


def flow_kl(controls, x0, log_target, *, t1, substeps, solver=None):
    """KL(ρ(T) ‖ ρ_*) on the base samples x0 (Monte Carlo; module docstring)."""
    x, log_rho = push(controls, x0, base_log_density(x0), t1=t1, substeps=substeps, solver=solver)
    return tp.diagnostics.relative_entropy(x, log_rho, log_target)


@functools.cache
def _compiled_kl():
    return eqx.filter_jit(flow_kl)


@functools.cache
def _compiled_push():
    return eqx.filter_jit(push)


def fit_flow(log_target, x0, controls, *, t1, substeps, solver=None, steps=400, learning_rate=0.03,
             progress=None):
    """Fit θ by Adam on KL(ρ(T) ‖ ρ_*) over the base samples ``x0``: ``tp.FitResult``.

    ``log_target`` must be a normalized log-density on R² (checked:
    :func:`tp.diagnostics.check_normalized`), positive wherever the initial flow sends the
    samples (else a ValueError naming the token, before any step)."""
    tp.diagnostics.check_normalized(log_target, x0.shape[1], scale=1.0)
    # the initial KL with concrete tokens: a zero target density at a token is a ValueError naming it
    x, log_rho = _compiled_push()(controls, x0, base_log_density(x0), t1=t1, substeps=substeps, solver=solver)
    tp.diagnostics.relative_entropy(x, log_rho, log_target)
    loss = lambda c: _compiled_kl()(c, x0, log_target, t1=t1, substeps=substeps, solver=solver)  # noqa: E731
    return tp.fit(controls, loss, optimizer=optax.adam(learning_rate), steps=steps, progress=progress)


_SOLVERS = {"euler": "Euler", "heun": "Heun", "tsit5": "Tsit5"}


def compute(cfg: NormalizingFlowConfig, progress: bool = False) -> Result:
    if not cfg.targets:
        raise ValueError("targets must name at least one target")
    solver = getattr(diffrax, _SOLVERS[cfg.solver])()
    k_train, k_eval, k_init = jax.random.split(jax.random.key(cfg.seed), 3)
    x_train = jax.random.normal(k_train, (cfg.n, 2))
    x_eval = jax.random.normal(k_eval, (cfg.n_eval, 2))
    lr_eval = base_log_density(x_eval)
    switches = np.asarray(sorted(set(cfg.switches)), dtype=int)
    T, S = len(cfg.targets), len(switches)
    kl, kl_se, kl0 = np.zeros((T, S)), np.zeros((T, S)), np.zeros(T)
    pushed, log_rho = np.zeros((T, S, cfg.n_eval, 2)), np.zeros((T, S, cfg.n_eval))
    losses = np.zeros((T, S, cfg.steps + 1))
    for i, name in enumerate(cfg.targets):
        log_target = TARGETS[name]
        terms0 = lr_eval - log_target(x_eval)
        kl0[i] = float(jnp.mean(terms0))
        for j, s in enumerate(switches):
            controls = init_controls(jax.random.fold_in(k_init, int(s)), int(s), cfg.width)
            observer = tp.fitting.tqdm_progress(cfg.steps, f"{name}, {s} switches") if progress else None
            fitted, hist, final = fit_flow(log_target, x_train, controls, t1=cfg.t1, substeps=cfg.substeps,
                                           solver=solver, steps=cfg.steps, learning_rate=cfg.learning_rate,
                                           progress=observer)
            x, lr = _compiled_push()(fitted, x_eval, lr_eval, t1=cfg.t1, substeps=cfg.substeps, solver=solver)
            terms = np.asarray(lr - log_target(x))
            kl[i, j] = float(tp.diagnostics.relative_entropy(x, lr, log_target))
            kl_se[i, j] = float(np.std(terms) / math.sqrt(cfg.n_eval))
            pushed[i, j], log_rho[i, j] = np.asarray(x), np.asarray(lr)
            losses[i, j] = np.concatenate([hist, [final]])
    return Result({
        "switches": switches, "kl": kl, "kl_stderr": kl_se, "kl_identity": kl0,
        "pushed": pushed.astype(np.float32), "log_rho": log_rho.astype(np.float32), "losses": losses,
    })


def figures(res: Result, cfg: NormalizingFlowConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    switches, kl, se = res["switches"], res["kl"], res["kl_stderr"]
    fig, ax = plt.subplots(figsize=(5.5, 4), layout="constrained")
    for i, name in enumerate(cfg.targets):
        ax.errorbar(switches, kl[i], yerr=2 * se[i], marker="o", capsize=3, color=f"C{i}", label=name)
        ax.axhline(float(res["kl_identity"][i]), color=f"C{i}", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("switches s of the controls θ = (w, a, b)")
    ax.set_ylabel("KL(ρ(T) ‖ ρ*)  (fresh samples, ±2 s.e.)")
    ax.set_title(f"perceptron flow, width {cfg.width}, T = {cfg.t1:g}\n(dotted: KL of the base, no flow)",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    paths = [tp.plot.save_figure(fig, out_dir / "kl_vs_switches.png")]

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
            ax.set_title(f"ρ(T) at pushed samples, s = {s}\nKL = {kl[i, j]:.3g}", fontsize=9)
        for ax in axes[i]:
            ax.set_aspect("equal")
            ax.tick_params(labelsize=7)
    fig.suptitle("base N(0, I) pushed by the perceptron flow; colour: the carried density ρ(T, x) "
                 "(same scale as the target)", fontsize=10)
    paths.append(tp.plot.save_figure(fig, out_dir / "pushed_densities.png"))
    return paths


register(Experiment(
    "normalizing-flow",
    "perceptron controls w(aᵀx+b)_+ transport N(0, I) to targets in R²; KL(ρ(T)‖ρ*) vs switches "
    "(Álvarez-López–Geshkovski–Ruiz-Balet, arXiv 2412.19366)",
    NormalizingFlowConfig, compute, figures,
    tiny=dict(targets=("moons",), switches=(2,), n=64, n_eval=64, steps=15, substeps=2)))
