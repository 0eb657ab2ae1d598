"""Measure-to-measure interpolation on S^2 (docs: math/sphere.md#perceptron-block-and-interpolation,
Geshkovski–Rigollet–Ruiz-Balet).

N input measures (caps around random centres, n tokens each) must be carried to N target caps
by the same Transformer: ``v[μ](t, x) = P⊥_x(V(t) A_B[μ](x) + W(t)(U(t)x + b(t))_+)``, parameters
piecewise constant over ``layers`` layers on [0, T]. The parameters are learned with Adam on
the mean Sinkhorn divergence S_ε(Φ_T#μ^i, ν^i) (ott-jax, explicit ε) by differentiating
through the solver (:func:`flow` pushes the measures, :func:`interpolation_loss` is the loss
``tp.fit`` minimizes); the figure shows inputs, outputs and targets, and the loss curve.
"""
from __future__ import annotations

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import transformer_pde as tp

from ..runs.result import Result
from .configs.interpolation import InterpolationConfig


def problem(cfg: InterpolationConfig, d: int = 3):
    """Inputs (N, n, d), targets (N, n, d) and the initial model."""
    k_in, k_out, k_c, k_model = jax.random.split(jax.random.key(cfg.seed), 4)
    N = cfg.num_measures
    centres = jax.random.normal(k_c, (2 * N, d))
    inputs = jnp.stack([tp.cap_sample(k, centres[i], cfg.n, cfg.spread)
                        for i, k in enumerate(jax.random.split(k_in, N))])
    targets = jnp.stack([tp.cap_sample(k, centres[N + i], cfg.n, cfg.spread)
                         for i, k in enumerate(jax.random.split(k_out, N))])
    model = tp.Sphere(tp.AttentionPerceptron.random(k_model, d, cfg.width, cfg.layers, t1=cfg.t1))
    return inputs, targets, model


def flow(model, inputs, *, t1, dt0, weights=None, solver=None, adjoint=None):
    """Push every input measure through its own dynamics: ``inputs (N, n, d) -> (N, n, d)`` at t1.

    ``model`` is a dynamics (e.g. ``Sphere(AttentionPerceptron(...))``); the measures do not
    interact (each sequence is processed alone), so this is a vmap of :func:`tp.solve`.
    """
    inputs = jnp.asarray(inputs)
    if inputs.ndim != 3:
        raise ValueError(f"inputs must have shape (N, n, d) (N measures of n tokens), got {inputs.shape}")

    def one(x0, w):
        return tp.solve(model, tp.Particles(x0, w), t1=t1, dt0=dt0, solver=solver, adjoint=adjoint).final

    # the solves' checks carried out of the vmap when the program is kept (tp.runs.carry_checks)
    w = None if weights is None else jnp.asarray(weights)
    if w is None:
        return tp.runs.carry_checks(jax.vmap, lambda x0: one(x0, None))(inputs)
    return tp.runs.carry_checks(jax.vmap, one)(inputs, w)


def _interpolation_loss(model, inputs, targets, *, t1, dt0, epsilon, solver=None, adjoint=None):
    """Mean over i of S_ε(Φ_T#μ^i, ν^i) (:func:`transformer_pde.diagnostics.sinkhorn_divergence`,
    threshold 1e-5, 1000 iterations; an unconverged
    step of the descent is tolerated, throw=False): ``inputs (N, n, d)``, ``targets (N, m, d)``."""
    targets = jnp.asarray(targets)
    if targets.ndim != 3 or targets.shape[0] != jnp.shape(inputs)[0]:
        raise ValueError(f"targets must have shape (N, m, d) with N = {jnp.shape(inputs)[0]} "
                         f"inputs, got {targets.shape}")
    out = flow(model, inputs, t1=t1, dt0=dt0, solver=solver, adjoint=adjoint)
    return jnp.mean(tp.runs.carry_checks(jax.vmap, lambda x, y: tp.diagnostics.sinkhorn_divergence(
        x, y, epsilon=epsilon, threshold=1e-5, max_iterations=1000, throw=False))(out, targets))

@functools.cache
def _compiled_loss():
    return tp.runs.carry_checks(eqx.filter_jit, _interpolation_loss)


def interpolation_loss(model, inputs, targets, *, t1, dt0, epsilon, solver=None, adjoint=None):
    """Mean over i of S_ε(Φ_T#μ^i, ν^i), compiled once (module docstring; ``_interpolation_loss``)."""
    return _compiled_loss()(model, inputs, targets, t1=t1, dt0=dt0, epsilon=epsilon, solver=solver,
                            adjoint=adjoint)


def compute(cfg: InterpolationConfig, progress: bool = False) -> Result:
    inputs, targets, model = problem(cfg)
    dt0 = cfg.t1 / (cfg.layers * cfg.substeps)
    solver = {"euler": diffrax.Euler, "heun": diffrax.Heun, "tsit5": diffrax.Tsit5}[cfg.solver]()

    def loss(m):
        return interpolation_loss(m, inputs, targets, t1=cfg.t1, dt0=dt0, epsilon=cfg.epsilon,
                                  solver=solver)

    # the pushes are kept between processes (tp.runs.kept), as the fit's programs are
    push = tp.runs.kept(lambda m, x: flow(m, x, t1=cfg.t1, dt0=dt0, solver=solver))
    before = push(model, inputs)
    observer = tp.fitting.tqdm_progress(cfg.steps, "interpolation") if progress else None
    trained, losses, final = tp.fit(model, loss, optimizer=optax.adam(cfg.learning_rate), steps=cfg.steps,
                                    progress=observer)
    after = push(trained, inputs)
    return Result({
        "inputs": np.asarray(inputs), "targets": np.asarray(targets),
        "outputs_before": np.asarray(before), "outputs": np.asarray(after),
        "losses": np.concatenate([losses, [final]]),
        "loss_ratio": np.asarray(losses[0] / final),
    })


def figures(res: Result, cfg: InterpolationConfig, out_dir) -> list:
    import matplotlib.pyplot as plt

    def lonlat(x):
        return np.degrees(np.arctan2(x[..., 1], x[..., 0])), np.degrees(np.arcsin(np.clip(x[..., 2], -1, 1)))

    # longitude–latitude view: every token visible (a 3-D sphere hides its far side)
    fig = plt.figure(figsize=(17, 4.6), layout="constrained")
    panels = [("inputs", "inputs μ^i(0)"), ("outputs_before", "outputs, untrained"),
              ("outputs", "outputs μ^i(T), trained")]
    for k, (key, title) in enumerate(panels):
        ax = fig.add_subplot(1, 4, k + 1)
        for i in range(res["inputs"].shape[0]):
            ax.scatter(*lonlat(res["targets"][i]), s=40, marker="o", facecolor="none",
                       edgecolor=f"C{i}", alpha=0.5, label="target ν^i" if i == 0 else None)
            ax.scatter(*lonlat(res[key][i]), s=8, color=f"C{i}", label="tokens" if i == 0 else None)
        ax.set_xlim(-180, 180)
        ax.set_ylim(-90, 90)
        ax.set_xlabel("longitude (°)")
        ax.set_ylabel("latitude (°)")
        ax.set_title(f"{title}\n(open circles: targets ν^i)", fontsize=9)
        ax.grid(alpha=0.3)
    ax = fig.add_subplot(1, 4, 4)
    ax.semilogy(res["losses"])
    ax.set_xlabel("Adam step")
    ax.set_ylabel(f"mean Sinkhorn divergence (ε={cfg.epsilon:g})")
    ax.set_title(f"loss ÷ {float(res['loss_ratio']):.3g}")
    ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"measure-to-measure interpolation: {cfg.num_measures} measures, {cfg.layers} layers, "
                 f"perceptron width {cfg.width}")
    return [tp.plot.save_figure(fig, out_dir / "interpolation.png")]
