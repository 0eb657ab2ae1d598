"""The fuzz registry: every public entry point, a builder of valid arguments, and the parameters
to fuzz with the kinds of bad value each must refuse (issue 25, "a fuzz harness in the suite").

An :class:`Entry` calls one public callable with keyword arguments built fresh by ``valid()``;
each :class:`Param` names one of them and the value kinds (:data:`KINDS`) that must be refused
(``bad``: a ValueError/TypeError naming the parameter, or under ``jax.jit`` the same message
through ``eqx.error_if``) and those that are meaningful values (``ok``: the call must return,
and every floating array it returns must be finite). ``traced=True`` also passes the generated
value as a traced argument of ``eqx.filter_jit``.

A value kind applies to the valid value: for an array, ``nan``/``inf``/``neg`` replace one
element (hypothesis draws which), ``shape`` drops or adds an axis, ``dtype`` gives strings or
complex numbers; for a scalar it is the value itself. ``tests/fuzz/test_fuzz.py`` runs every
(entry, parameter) pair with hypothesis; ``tests/fuzz/make_bad_inputs.py`` renders one example
of each (entry, parameter, kind) into ``docs/bad_inputs.md``.

Public names that take no value a user chooses (abstract bases, result containers, exceptions,
modules, constants) are listed in :data:`EXEMPT` with the reason; ``test_fuzz.py`` fails when a
public name is neither registered nor exempted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import transformer_pde as tp
from transformer_pde import convergence, diagnostics, kernels, measures, stationary, statistics, sweeps, theory

# ----------------------------------------------------------------------------- the value kinds

KINDS = {
    "nan": "NaN",
    "inf": "+inf or -inf",
    "neg": "a negative number",
    "zero": "zero",
    "frac": "a non-integer float for an integer",
    "huge": "a huge number (1e300, 2**40 or 2**63)",
    "str": "a string",
    "none": "None",
    "vector": "a vector where a scalar is expected",
    "shape": "an array of the wrong rank (a matrix flattened, a vector with two more axes)",
    "dtype": "an array of strings or complex numbers",
    "big": "a number above the parameter's upper bound",
}
"""Kinds of bad value, by name (the docs table names a value by its kind)."""

ELEMENTWISE = ("nan", "inf", "neg", "zero", "huge", "big")
"""Kinds that change one element of an array-valued parameter (a scalar: the value itself)."""

TRACEABLE = ("nan", "inf", "neg", "zero", "huge", "big", "frac")
"""Kinds that keep the valid value's shape: passed as traced values under jit."""


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    bad: tuple[str, ...]
    ok: tuple[str, ...] = ()
    traced: bool = False
    names: tuple[str, ...] = ()
    """Other words a message may use for the parameter (``beta`` for ``β``...)."""
    big: float = 2.0
    """The value of kind ``big`` (above an upper bound)."""

    @property
    def words(self) -> tuple[str, ...]:
        return (self.name, *self.names)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    call: Callable[..., Any]
    valid: Callable[[], dict]
    params: tuple[Param, ...]
    covers: tuple[str, ...] = ()
    """Other public names this entry fuzzes through (a method's class, an alias)."""

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


# ----------------------------------------------------------------------------- shared values

D = 2
X = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
W = np.array([0.25, 0.25, 0.5])
KEY = jax.random.key(0)
ATTN = tp.SoftmaxAttention.identity(D, 1.0)
I2 = np.eye(D)


def _program_to_lower(scale, x):
    """A module-level program for ``tp.runs.lower_program`` and ``compile_program``."""
    return scale * x


def _clustering_run():
    from transformer_pde.experiments import REGISTRY as EXPERIMENTS

    exp = EXPERIMENTS["clustering"]
    return dict(exp=exp, config=exp.make_config(**exp.tiny), out_dir="/nonexistent-fuzz/run", progress=False)


def _qkv(**extra):
    return lambda: dict(Q=I2.copy(), K=I2.copy(), V=I2.copy(), beta=1.0, **extra)


def _mha():
    return dict(Q=np.eye(D)[None], K=np.eye(D)[None], V=np.eye(D)[None], W=np.eye(D)[None], beta=1.0)


BETA = Param("beta", bad=("nan", "inf", "vector", "str"), ok=("neg", "zero"), traced=True)
QKV = tuple(Param(m, bad=("nan", "inf", "shape", "dtype"), traced=True) for m in ("Q", "K", "V"))
X_P = Param("x", bad=("nan", "inf", "shape", "dtype", "none"), traced=True)
X_CONCRETE = Param("x", bad=("nan", "inf", "dtype", "none"))
"""Tokens of a diagnostic computed on the host (NumPy): concrete only; (n, 1) tokens are valid."""
W_P = Param("weights", bad=("nan", "inf", "neg", "shape", "huge"), traced=True)
INT_GE1 = ("zero", "neg", "frac", "nan", "inf", "str")
POS = ("zero", "neg", "nan", "inf", "str")
FINITE = ("nan", "inf", "str")
PROB = ("neg", "nan", "inf", "big", "str")


def _velocity(dynamics):
    return lambda x, weights: dynamics.velocity(x, weights)


def _sinkhorn_args():
    return dict(x=X.copy(), y=X[::-1].copy() + 0.1, a=W.copy(), b=None, epsilon=0.1)


def _block():
    return tp.PerceptronBlock(2.0, np.array([[1.0, 0.0]]), np.array([0.5]))


def _loss(model):
    return jnp.sum((model.V - 2.0 * jnp.eye(D)) ** 2)


def _sweep_fn(beta):
    return jnp.sum(tp.SoftmaxAttention.identity(D, beta).velocity(jnp.asarray(X)) ** 2)


def _sphere_x():
    return np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])


def _mlp_args():
    return dict(W1=np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]), b1=np.zeros(3), W2=np.ones((D, 3)), b2=np.zeros(D))


MLP_ = tp.MLP(**_mlp_args())
ARRAY = ("nan", "inf", "shape", "dtype")
"""The bad kinds of a matrix or vector parameter of a model."""
NONNEG = ("nan", "inf", "neg", "str")
OBJECT = ("str", "none")
"""The bad kinds of a parameter that is an object (a dynamics, a solver, a state)."""


def _circle_rule(offset, order):
    return tp.CircleRule(offset)(None, order)


def _gauss_hermite_rule(mean, cov, order):
    return tp.GaussHermiteRule(mean, cov)(None, order)


def _convergence_result():
    ns, seeds, ts = np.array([4, 8, 16]), np.array([0, 1]), np.array([0.1, 0.2])
    errors = {"w1": np.array([0.5, 0.35, 0.25])[:, None, None] * np.array([1.0, 1.1])[None, :, None]
              * np.array([1.0, 1.2])[None, None, :]}
    return convergence.ConvergenceResult(ns, seeds, ts, errors, D, reference=None)


def _reduction_args():
    return dict(q=X.copy(), k=X.copy(), v=X.copy(), bias=np.log(W))


REGISTRY: list[Entry] = [
    # --- models: attentions and other dynamics
    Entry("SoftmaxAttention", tp.SoftmaxAttention, _qkv(), (BETA, *QKV)),
    Entry("SoftmaxAttention.identity", tp.SoftmaxAttention.identity, lambda: dict(d=D, beta=1.0),
          (Param("d", bad=INT_GE1), BETA)),
    Entry("SoftmaxAttention.velocity", _velocity(ATTN), lambda: dict(x=X.copy(), weights=W.copy()), (X_P, W_P),
          covers=("AbstractAttention", "AbstractDynamics")),
    Entry("SoftmaxAttention.gaussian_velocity", ATTN.gaussian_velocity, lambda: dict(mean=np.zeros(D), cov=np.eye(D)),
          (Param("mean", bad=ARRAY, traced=True), Param("cov", bad=ARRAY + ("neg",), traced=True))),
    Entry("L2Attention", tp.L2Attention, _qkv(), (BETA, *QKV)),
    Entry("HardAttention", tp.HardAttention, lambda: dict(Q=I2.copy(), K=I2.copy(), V=I2.copy(), tol=0.0),
          (Param("tol", bad=("neg", "nan", "inf", "str"), ok=("zero",)), *QKV)),
    Entry("KrauseAttention", tp.KrauseAttention,
          lambda: dict(Q=I2.copy(), K=I2.copy(), V=I2.copy(), sigma=1.0, radius=1.0, top_k=2,
                       layout=tp.kernels.SpatialTiles(tp.kernels.Streaming(key_block=2, query_block=2))),
          (Param("sigma", bad=POS), Param("radius", bad=POS, ok=("none",)), Param("top_k", bad=INT_GE1, ok=("none",)),
           Param("layout", bad=OBJECT), *QKV)),
    Entry("KrauseAttention.sphere", tp.KrauseAttention.sphere, lambda: dict(d=3, sigma=1.0, angle=1.0, top_k=2),
          (Param("angle", bad=POS + ("big",), ok=("none",), big=4.0), Param("sigma", bad=POS),
           Param("d", bad=INT_GE1))),
    Entry("UnnormalizedAttention", tp.UnnormalizedAttention, _qkv(shift=0.0),
          (BETA, Param("shift", bad=FINITE, ok=("neg",), traced=True))),
    Entry("SigmoidAttention", tp.SigmoidAttention, _qkv(bias=0.0),
          (BETA, Param("bias", bad=FINITE, ok=("neg",), traced=True))),
    Entry("SinkhornAttention", tp.SinkhornAttention, _qkv(epsilon=1.0),
          (Param("epsilon", bad=POS, traced=True), Param("threshold", bad=POS),
           Param("max_iterations", bad=INT_GE1 + ("huge",)))),
    Entry("MultiHeadAttention", tp.MultiHeadAttention, _mha,
          (BETA, Param("W", bad=("nan", "inf", "shape", "dtype"), traced=True))),
    Entry("MultiHeadAttention.scalar", tp.MultiHeadAttention.scalar,
          lambda: dict(d=D, scores=np.array([1.0, 0.0]), values=np.array([1.0, -0.5]), beta=1.0),
          (Param("d", bad=INT_GE1), Param("scores", bad=ARRAY), Param("values", bad=ARRAY), BETA)),
    Entry("Causal", tp.Causal, lambda: dict(attention=ATTN, alibi=0.0),
          (Param("attention", bad=OBJECT + ("shape",)), Param("alibi", bad=FINITE + ("neg",), traced=True))),
    Entry("MeanShift", tp.MeanShift, lambda: dict(beta=1.0),
          (Param("beta", bad=("nan", "inf", "str", "vector"), traced=True),)),
    Entry("LostInTheMiddle", tp.LostInTheMiddle, lambda: dict(beta=1.0, lam=1.0),
          (Param("beta", bad=FINITE, traced=True), Param("lam", bad=FINITE, traced=True))),
    Entry("PerceptronBlock", tp.PerceptronBlock, lambda: dict(beta=2.0, a=np.array([[1.0, 0.0]]), omega=np.array([0.5])),
          (Param("beta", bad=FINITE), Param("a", bad=FINITE), Param("omega", bad=FINITE))),
    Entry("NGPT", tp.NGPT, lambda: dict(dynamics=ATTN, alpha=0.5),
          (Param("alpha", bad=("nan", "inf", "neg", "str"), traced=True),
           Param("dynamics", bad=("str", "none")))),
    Entry("MixLN", tp.MixLN, lambda: dict(dynamics=ATTN, switch_time=0.5),
          (Param("switch_time", bad=("nan", "inf", "str"), traced=True), Param("dynamics", bad=("str", "none")))),
    Entry("MixLN.from_layers", tp.MixLN.from_layers, lambda: dict(dynamics=ATTN, num_layers=8, step=0.1, alpha=0.25),
          (Param("num_layers", bad=INT_GE1), Param("step", bad=POS), Param("alpha", bad=PROB, big=1.5))),
    Entry("Norm", tp.Norm, lambda: dict(scale=1.0),
          (Param("scale", bad=POS, traced=True),)),
    Entry("LNScaling", tp.LNScaling, lambda: dict(dynamics=ATTN, depth_scale=1.0),
          (Param("depth_scale", bad=("nan", "inf", "str"), traced=True),)),
    Entry("PreLN", tp.PreLN, lambda: dict(dynamics=ATTN), (Param("dynamics", bad=("str", "none")),)),
    Entry("PreLN.velocity", _velocity(tp.PreLN(ATTN)), lambda: dict(x=X.copy(), weights=W.copy()),
          (Param("x", bad=X_P.bad + ("zero",), traced=True),)),  # zero: no direction x/|x|
    Entry("LNScaling.velocity", lambda x, t: tp.LNScaling(ATTN, 1e-4).velocity(x, None, t),
          lambda: dict(x=X.copy(), t=0.5),  # h0 = 1e-4: every negative t drawn is before the first layer
          (Param("t", bad=FINITE + ("neg",), ok=("zero",), traced=True),)),
    Entry("PeriLN", tp.PeriLN, lambda: dict(dynamics=ATTN), (Param("dynamics", bad=("str", "none")),)),
    Entry("Sphere", tp.Sphere, lambda: dict(dynamics=ATTN), (Param("dynamics", bad=("str", "none", "shape")),)),
    Entry("RandomBatch", tp.RandomBatch, lambda: dict(attention=ATTN, batch_size=2, step=0.1, key=KEY),
          (Param("batch_size", bad=INT_GE1 + ("huge",)), Param("step", bad=POS, traced=True),
           Param("key", bad=("none", "str", "nan")))),
    Entry("GaussianHeads", tp.GaussianHeads, lambda: dict(d=D, beta=1.0, sigma_A=1.0),
          (Param("d", bad=INT_GE1 + ("huge",)), Param("beta", bad=FINITE), Param("sigma_A", bad=("nan", "inf", "neg", "str")))),
    Entry("num_post_layers", tp.num_post_layers, lambda: dict(alpha=0.25, num_layers=8),
          (Param("alpha", bad=PROB, big=1.5), Param("num_layers", bad=INT_GE1))),
    Entry("uniform_sphere", tp.uniform_sphere, lambda: dict(key=KEY, n=4, d=3),
          (Param("n", bad=INT_GE1 + ("huge",)), Param("d", bad=INT_GE1 + ("huge",)), Param("key", bad=("none", "str")))),
    Entry("cap_sample", tp.cap_sample, lambda: dict(key=KEY, center=np.array([1.0, 0.0, 0.0]), n=4, spread=0.1),
          (Param("n", bad=INT_GE1), Param("spread", bad=("nan", "inf", "neg", "str")),
           Param("center", bad=("nan", "inf", "shape", "zero")))),
    Entry("normalize", tp.normalize, lambda: dict(x=X.copy()), (X_P,)),
    Entry("polar", tp.polar, lambda: dict(x=X.copy()), (Param("x", bad=X_P.bad + ("zero",), traced=True),)),
    Entry("polar_velocity", tp.polar_velocity, lambda: dict(dynamics=ATTN, x=X.copy(), weights=W.copy(), t=0.0),
          (X_P, W_P, Param("t", bad=FINITE + ("vector",)), Param("dynamics", bad=OBJECT))),
    Entry("tangent_projection", tp.tangent_projection, lambda: dict(x=X.copy(), v=X[::-1].copy()),
          (Param("x", bad=ARRAY + ("none",), traced=True), Param("v", bad=ARRAY + ("none",), traced=True))),
    Entry("AttentionPerceptron", tp.AttentionPerceptron,
          lambda: dict(V=I2.copy(), B=I2.copy(), W=np.ones((D, 3)), U=np.ones((3, D)), b=np.zeros(3)),
          tuple(Param(m, bad=ARRAY, traced=True) for m in ("V", "B", "W", "U", "b"))),
    Entry("RescaledSoftmax", tp.RescaledSoftmax, lambda: dict(Q=I2.copy(), K=I2.copy(), V=I2.copy()), QKV),
    Entry("MLP", tp.MLP, _mlp_args,
          (*(Param(m, bad=ARRAY, traced=True) for m in ("W1", "b1", "W2", "b2")), Param("activation", bad=OBJECT))),
    Entry("Block", tp.Block, lambda: dict(attention=tp.PreLN(ATTN), mlp=tp.PreLN(MLP_), step=0.1),
          (Param("step", bad=POS + ("vector",), traced=True), Param("attention", bad=OBJECT + ("shape",)),
           Param("mlp", bad=OBJECT))),
    Entry("SphereBlock", tp.SphereBlock, lambda: dict(attention=tp.PostLN(ATTN), mlp=tp.PostLN(MLP_), step=0.1),
          (Param("step", bad=POS + ("vector",), traced=True), Param("attention", bad=OBJECT), Param("mlp", bad=OBJECT))),
    Entry("AffineFeedForward", tp.AffineFeedForward, lambda: dict(attention=ATTN, W=-0.5 * I2, b=np.ones(D)),
          (Param("W", bad=ARRAY, traced=True), Param("b", bad=ARRAY, traced=True), Param("attention", bad=OBJECT))),
    Entry("GaussianFactorFlow", tp.GaussianFactorFlow, lambda: dict(closure=ATTN), (Param("closure", bad=OBJECT),)),
    Entry("Switched", tp.Switched, lambda: dict(before=ATTN, after=tp.PreLN(ATTN), switch_time=0.5),
          (Param("switch_time", bad=FINITE + ("vector",), traced=True), Param("before", bad=OBJECT),
           Param("after", bad=OBJECT)), covers=("AbstractSwitched",)),
    Entry("CommonNoiseSDE", tp.CommonNoiseSDE,
          lambda: dict(heads=tp.GaussianHeads(D, 1.0), W=np.full((2, D, D), 0.5), Wp=np.full((2, D, D), 0.25)),
          (Param("W", bad=ARRAY, traced=True), Param("Wp", bad=ARRAY, traced=True), Param("heads", bad=OBJECT))),
    Entry("RandomHeadsMeanField", tp.RandomHeadsMeanField,
          lambda: dict(nodes=tp.CommonNoiseSDE(tp.GaussianHeads(D, 1.0), np.full((2, D, D), 0.5),
                                               np.full((2, D, D), 0.25))), (Param("nodes", bad=OBJECT),)),
    Entry("Sharded", tp.Sharded, lambda: dict(dynamics=ATTN),
          (Param("dynamics", bad=OBJECT + ("shape",)), Param("axis", bad=("none",)), Param("mesh", bad=("str",)))),
    # --- states, noise, events, parameters
    Entry("Particles", tp.Particles, lambda: dict(x=X.copy(), weights=W.copy()), (X_P, W_P)),
    Entry("Gaussian", tp.Gaussian, lambda: dict(mean=np.zeros(D), cov=np.eye(D)),
          (Param("mean", bad=("nan", "inf", "shape", "dtype"), traced=True),
           Param("cov", bad=("nan", "inf", "neg", "shape", "dtype"), traced=True))),
    Entry("Tracers", tp.Tracers, lambda: dict(carrier=tp.Particles(X), z=X[:2].copy()),
          (Param("z", bad=("nan", "inf", "shape", "dtype"), traced=True), Param("carrier", bad=("str", "none")))),
    Entry("Noise", tp.Noise, lambda: dict(sigma=0.1), (Param("sigma", bad=("nan", "inf", "neg", "str"), traced=True),)),
    Entry("CommonNoise", tp.CommonNoise,
          lambda: dict(diffusion=tp.CommonNoiseSDE(tp.GaussianHeads(D, 1.0), np.full((2, D, D), 0.5),
                                                   np.full((2, D, D), 0.25)), sigma=0.1),
          (Param("sigma", bad=("nan", "inf", "neg", "str"), traced=True), Param("diffusion", bad=OBJECT),
           Param("path", bad=("str",)))),
    Entry("BlowUp", tp.BlowUp, lambda: dict(threshold=10.0), (Param("threshold", bad=POS),)),
    Entry("BlowUpAtSaves", tp.BlowUpAtSaves, lambda: dict(threshold=10.0), (Param("threshold", bad=POS),)),
    Entry("BrownianTree", tp.BrownianTree, lambda: dict(tol=1e-3), (Param("tol", bad=POS),)),
    Entry("BrownianGrid", tp.BrownianGrid, lambda: dict(dt=0.1, tol=1e-3),
          (Param("dt", bad=POS), Param("tol", bad=POS))),
    Entry("CircleDensity", tp.CircleDensity, lambda: dict(rho=np.full(8, 1 / (2 * np.pi)), sigma=0.0),
          (Param("rho", bad=("nan", "inf", "neg", "shape", "dtype"), names=("density", "values"), traced=True), Param("sigma", bad=("nan", "inf", "neg", "str")))),
    Entry("SphereDensity", tp.SphereDensity, lambda: dict(rho=np.diag([1.0, 0.0, 0.0]), sigma=0.0),
          (Param("rho", bad=("nan", "inf", "shape", "dtype", "str", "none"), names=("density", "coefficients"),
                 traced=True),
           Param("sigma", bad=("nan", "inf", "neg", "str")))),
    Entry("ZonalDensity", tp.ZonalDensity, lambda: dict(rho=np.ones(5), d=3, sigma=0.5),
          (Param("rho", bad=("nan", "inf", "neg", "shape", "dtype"), names=("density", "values"), traced=True),
           Param("d", bad=INT_GE1), Param("sigma", bad=("nan", "inf", "neg", "str")))),
    Entry("Coupled", lambda parts: tp.Coupled(*parts),
          lambda: dict(parts=(tp.Particles(X), tp.Gaussian(np.zeros(D), np.eye(D)))), (Param("parts", bad=("str",)),)),
    Entry("WithLogDensity", tp.WithLogDensity, lambda: dict(tokens=X.copy(), log_rho0=np.zeros(3)),
          (Param("log_rho0", bad=ARRAY, traced=True),
           Param("tokens", bad=("nan", "inf", "shape", "str", "none"), names=("x",)))),
    Entry("CircleRule", _circle_rule, lambda: dict(offset=0.5, order=8),
          (Param("offset", bad=FINITE + ("vector",)), Param("order", bad=INT_GE1 + ("huge",)))),
    Entry("SphereRule", lambda order: tp.SphereRule()(None, order), lambda: dict(order=4),
          (Param("order", bad=INT_GE1 + ("huge",)),)),
    Entry("GaussHermiteRule", _gauss_hermite_rule, lambda: dict(mean=np.zeros(D), cov=np.eye(D), order=4),
          (Param("mean", bad=ARRAY), Param("cov", bad=ARRAY + ("neg",)), Param("order", bad=INT_GE1 + ("huge",)))),
    Entry("Retracted", tp.Retracted, lambda: dict(solver=diffrax.Heun(), retraction=tp.UnitSphere()),
          (Param("solver", bad=OBJECT), Param("retraction", bad=OBJECT))),
    Entry("PiecewiseConstant", tp.PiecewiseConstant, lambda: dict(values=np.ones(3), t0=0.0, dt=0.5),
          (Param("values", bad=("nan", "inf", "dtype"), traced=True), Param("dt", bad=POS, traced=True),
           Param("t0", bad=FINITE, traced=True))),
    # --- solvers
    Entry("solve", lambda **kw: tp.solve(ATTN, **kw).xs,
          lambda: dict(state0=X.copy(), t1=0.2, dt0=0.1, t0=0.0, saveat=np.array([0.0, 0.2])),
          (Param("t1", bad=("nan", "inf", "neg", "zero", "str", "vector"), traced=True),
           Param("dt0", bad=("nan", "inf", "neg", "zero", "str"), traced=True),
           Param("t0", bad=("nan", "inf", "str", "vector")),
           Param("saveat", bad=("nan", "inf", "neg", "huge", "shape", "dtype"), names=("saveat times",)),
           Param("max_steps", bad=INT_GE1 + ("huge",)),
           Param("state0", bad=("nan", "inf", "shape", "dtype", "none"), traced=True, names=("x", "x0")),
           Param("adjoint", bad=("str",)), Param("event", bad=("str",))),
          covers=("Solution",)),
    Entry("solve_density", lambda **kw: tp.solve_density(tp.Sphere(ATTN), **kw).xs,
          lambda: dict(density=tp.CircleDensity(np.full(8, 1 / (2 * np.pi)), 0.0), t1=0.1, tol=1e-6),
          (Param("t1", bad=("nan", "inf", "neg", "zero", "str")), Param("tol", bad=POS),
           Param("density", bad=OBJECT))),
    Entry("raise_if_failed", tp.raise_if_failed,
          lambda: dict(result=jax.vmap(lambda _: diffrax.RESULTS.successful)(jnp.arange(3)),
                       nonfinite_time=np.full(3, np.inf)),
          (Param("result", bad=OBJECT), Param("nonfinite_time", bad=("str", "shape")))),
    Entry("layers", lambda **kw: tp.layers(ATTN, **kw).xs, lambda: dict(x0=X.copy(), num_layers=4, step=0.1, save_every=2),
          (Param("num_layers", bad=INT_GE1 + ("huge",)), Param("step", bad=POS),
           Param("save_every", bad=INT_GE1), Param("x0", bad=("nan", "inf", "shape", "dtype"), names=("x",)),
           Param("fn", bad=("str",)))),
    # --- diagnostics
    *[Entry(f"diagnostics.{f.__name__}", f, lambda: dict(x=X.copy(), threshold=0.9),
            (Param("threshold", bad=("nan", "inf", "big", "str", "vector"), big=2.0), X_CONCRETE))
      for f in (diagnostics.cluster_count, diagnostics.cluster_labels, diagnostics.clustered_pair_fraction,
                diagnostics.atoms)],
    Entry("diagnostics.cluster_masses", diagnostics.cluster_masses, lambda: dict(x=X.copy(), threshold=0.9, weights=W.copy()),
          (Param("threshold", bad=("nan", "inf", "big", "str"), big=2.0), W_P)),
    Entry("diagnostics.gap_clusters", diagnostics.gap_clusters, lambda: dict(x=X.copy(), gap=0.5),
          (Param("gap", bad=("neg", "nan", "inf", "str"), ok=("zero",)), Param("x", bad=("nan", "inf", "dtype", "none")))),
    Entry("diagnostics.renyi_centers", diagnostics.renyi_centers, lambda: dict(x=X.copy(), delta=0.5),
          (Param("delta", bad=("neg", "nan", "inf", "str"), ok=("zero",)), X_CONCRETE)),
    Entry("diagnostics.bures_wasserstein", diagnostics.bures_wasserstein,
          lambda: dict(mean1=np.zeros(D), cov1=np.eye(D), mean2=np.ones(D), cov2=2 * np.eye(D)),
          (Param("mean1", bad=("nan", "inf", "shape"), traced=True), Param("cov1", bad=("nan", "inf", "neg", "shape"), traced=True))),
    Entry("diagnostics.exact_wasserstein", diagnostics.exact_wasserstein,
          lambda: dict(x=X.copy(), y=X[::-1] + 0.1, a=W.copy(), p=2.0),
          (Param("p", bad=("nan", "inf", "neg", "zero", "str")), Param("a", bad=("nan", "inf", "neg", "shape", "huge")), X_CONCRETE)),
    *[Entry(f"diagnostics.{f.__name__}", f, _sinkhorn_args,
            (Param("epsilon", bad=POS, traced=True), Param("p", bad=("nan", "inf", "neg", "zero", "str")),
             Param("threshold", bad=POS), Param("max_iterations", bad=INT_GE1),
             Param("a", bad=("nan", "inf", "neg", "shape", "huge")), X_P))
      for f in (diagnostics.sinkhorn_divergence, diagnostics.sinkhorn_wasserstein,
                diagnostics.sinkhorn_wasserstein_status)],
    Entry("diagnostics.stability_ratio", diagnostics.stability_ratio,
          lambda: dict(xs=np.stack([X, X + 0.1]), ys=np.stack([X + 0.05, X + 0.2]), p=2.0),
          (Param("p", bad=("nan", "inf", "neg", "zero", "str")), Param("xs", bad=("nan", "inf", "shape")))),
    Entry("diagnostics.support_radius", diagnostics.support_radius, lambda: dict(x=X.copy(), weights=W.copy()), (X_P, W_P)),
    Entry("diagnostics.wasserstein_circle", diagnostics.wasserstein_circle,
          lambda: dict(x=np.array([0.1, 1.0, 2.0]), y=np.array([0.3, 1.5, 4.0]), period=2 * np.pi),
          (Param("period", bad=POS), Param("x", bad=("nan", "inf", "shape")))),
    Entry("diagnostics.wasserstein_circle.p", diagnostics.wasserstein_circle,  # W_p, p > 1: the best cut
          lambda: dict(x=np.array([0.1, 1.0, 2.0]), y=np.array([0.3, 1.5, 4.0]), a=np.array([0.2, 0.3, 0.5]), p=2.0),
          (Param("p", bad=("nan", "inf", "neg", "zero", "str"), ok=("huge",)),  # huge p: gaps^p over/underflow
           Param("a", bad=("nan", "inf", "neg", "shape", "huge")))),
    Entry("diagnostics.sliced_wasserstein_sphere", diagnostics.sliced_wasserstein_sphere,
          lambda: dict(x=X.copy(), y=np.array([[0.0, -1.0], [-0.8, 0.6]]), frames=np.eye(2)[None], p=2.0),
          (Param("x", bad=("nan", "inf", "huge", "shape", "dtype", "none"), traced=True),  # huge: off the sphere
           Param("frames", bad=("nan", "inf", "huge", "shape"), traced=True),  # huge: not orthonormal
           Param("p", bad=("nan", "inf", "neg", "zero", "str"), ok=("huge",)))),
    Entry("diagnostics.random_great_circles", diagnostics.random_great_circles, lambda: dict(key=KEY, num=3, d=3),
          (Param("num", bad=INT_GE1 + ("huge",)), Param("d", bad=INT_GE1 + ("huge",)), Param("key", bad=("none", "str")))),
    Entry("diagnostics.wasserstein_circle.tokens", diagnostics.wasserstein_circle,  # tokens on S^1, (n, 2)
          lambda: dict(x=X.copy(), y=np.array([[0.0, 1.0], [-1.0, 0.0], [0.8, -0.6]]), period=2 * np.pi),
          (Param("x", bad=("nan", "inf", "zero"), traced=True),  # zero: no angle (arctan2 said 0)
           Param("period", bad=POS + ("huge",), traced=True))),  # huge: not 2π
    Entry("diagnostics.wasserstein_line", diagnostics.wasserstein_line,
          lambda: dict(x=np.array([0.1, 1.0, 2.0]), y=np.array([0.3, 1.5, 4.0]), p=1.0),
          (Param("p", bad=("nan", "inf", "neg", "zero", "str"), ok=("huge",)),  # huge p: |gap|^p overflowed
           Param("x", bad=("nan", "inf", "shape")))),
    Entry("diagnostics.attention_matrix", diagnostics.attention_matrix, lambda: dict(x=X.copy(), beta=1.0, weights=W.copy()),
          (Param("beta", bad=FINITE, ok=("neg", "zero"), traced=True), W_P, X_P)),
    *[Entry(f"diagnostics.{f.__name__}", f, lambda: dict(x=X.copy(), beta=1.0, weights=W.copy()),
            (Param("beta", bad=FINITE, traced=True), W_P, X_P))
      for f in (diagnostics.interaction_energy, diagnostics.log_interaction_energy)],
    Entry("diagnostics.normalized_energy", diagnostics.normalized_energy,  # any real β (β < 0: repulsive;
          lambda: dict(x=X.copy(), beta=1.0, weights=W.copy()),           # a huge |β| overflows: an error)
          (Param("beta", bad=FINITE, ok=("zero",), traced=True), W_P, X_P)),
    Entry("diagnostics.mean_token", diagnostics.mean_token, lambda: dict(x=X.copy(), weights=W.copy()), (W_P, X_P)),
    Entry("diagnostics.numerical_rank", diagnostics.numerical_rank, lambda: dict(P=np.eye(3), rtol=1e-3),
          (Param("rtol", bad=("nan", "inf", "neg", "str", "big"), big=1.5), Param("P", bad=("nan", "inf", "shape")))),
    Entry("diagnostics.perceptron_energy", diagnostics.perceptron_energy, lambda: dict(block=_block(), x=_sphere_x(), weights=W.copy()),
          (W_P, Param("x", bad=("nan", "inf", "shape")))),
    Entry("diagnostics.stationarity_residual", diagnostics.stationarity_residual,
          lambda: dict(block=_block(), positions=np.array([[1.0, 0.0], [-1.0, 0.0]]), masses=np.array([0.5, 0.5])),
          (Param("positions", bad=("nan", "inf", "shape")), Param("masses", bad=("nan", "inf", "neg", "shape")))),
    Entry("diagnostics.check_normalized", diagnostics.check_normalized,
          lambda: dict(log_density=lambda z: -0.5 * jnp.sum(z ** 2, -1) - 0.5 * z.shape[-1] * jnp.log(2 * jnp.pi), dim=1),
          (Param("dim", bad=INT_GE1 + ("huge",)), Param("scale", bad=POS), Param("levels", bad=INT_GE1 + ("huge",)),
           Param("tol", bad=POS))),
    Entry("diagnostics.relative_entropy", diagnostics.relative_entropy,
          lambda: dict(x=X.copy(), log_rho=np.zeros(3), log_target=lambda z: -jnp.sum(z ** 2, -1), weights=W.copy()),
          (W_P, Param("log_rho", bad=("nan", "shape", "dtype")),
           Param("x", bad=("nan", "inf", "shape", "dtype"), traced=True))),
    Entry("diagnostics.kde_critical_points", diagnostics.kde_critical_points,
          lambda: dict(samples=np.array([0.1, 0.2, 2.0]), beta=4.0, resolution=0.1),
          (Param("beta", bad=POS), Param("resolution", bad=POS), Param("block", bad=INT_GE1),
           Param("samples", bad=("nan", "inf", "dtype")))),
    Entry("diagnostics.kde_modes", diagnostics.kde_modes, lambda: dict(samples=np.array([0.1, 0.2, 2.0]), beta=4.0),
          (Param("beta", bad=POS), Param("samples", bad=("nan", "inf")))),
    Entry("diagnostics.empirical_moments", diagnostics.empirical_moments, lambda: dict(x=X.copy(), weights=W.copy()), (W_P, X_P)),
    Entry("diagnostics.mean_overlap", diagnostics.mean_overlap, lambda: dict(x=X.copy()), (X_P,)),
    Entry("diagnostics.lipschitz_rate", diagnostics.lipschitz_rate, lambda: dict(attn=ATTN, R=1.0),
          (Param("R", bad=("nan", "inf", "neg", "str")),)),
    Entry("diagnostics.stability_bound", diagnostics.stability_bound, lambda: dict(attn=ATTN, R0=1.0, ts=np.array([0.0, 0.5])),
          (Param("R0", bad=("nan", "inf", "neg", "str"), traced=True), Param("ts", bad=("nan", "inf", "shape")),
           Param("substeps", bad=INT_GE1))),
    Entry("diagnostics.support_radius_bound", diagnostics.support_radius_bound,
          lambda: dict(attn=ATTN, R0=1.0, ts=np.array([0.0, 0.5])),
          (Param("R0", bad=("nan", "inf", "neg", "str"), traced=True), Param("ts", bad=("nan", "inf", "shape")))),
    Entry("diagnostics.value_norm_integral", diagnostics.value_norm_integral, lambda: dict(attn=ATTN, ts=np.array([0.0, 0.5])),
          (Param("ts", bad=("nan", "inf", "shape")), Param("substeps", bad=INT_GE1))),
    # --- theory
    Entry("theory.noisy_sphere.critical_coupling", theory.noisy_sphere.critical_coupling, lambda: dict(beta=1.0, d=2, sigma=1.0),
          (Param("beta", bad=FINITE), Param("d", bad=INT_GE1), Param("sigma", bad=("neg", "nan", "inf", "str"), ok=("zero",)))),
    Entry("theory.noisy_sphere.funk_hecke", theory.noisy_sphere.funk_hecke, lambda: dict(l=1, beta=1.0, d=2),
          (Param("l", bad=("neg", "frac", "nan", "str")), Param("beta", bad=FINITE), Param("d", bad=INT_GE1))),
    Entry("theory.noisy_sphere.critical_beta", theory.noisy_sphere.critical_beta, lambda: dict(d=2),
          (Param("d", bad=INT_GE1),)),
    Entry("theory.noisy_sphere.NoisySA", theory.noisy_sphere.NoisySA, lambda: dict(beta=1.0, d=2, sigma=1.0),
          (Param("beta", bad=FINITE), Param("d", bad=INT_GE1), Param("sigma", bad=("neg", "nan", "inf", "str"), ok=("zero",)))),
    Entry("theory.noisy_sphere.NoisyUSA", theory.noisy_sphere.NoisyUSA, lambda: dict(beta=1.0, d=2, sigma=1.0),
          (Param("beta", bad=FINITE), Param("d", bad=INT_GE1), Param("sigma", bad=("neg", "nan", "inf", "str"), ok=("zero",)))),
    Entry("theory.long_context.distance_constant", theory.long_context.distance_constant, lambda: dict(d=3),
          (Param("d", bad=INT_GE1),)),
    Entry("theory.long_context.critical_scale", theory.long_context.critical_scale, lambda: dict(n=100, d=3),
          (Param("n", bad=POS), Param("d", bad=INT_GE1))),
    Entry("theory.long_context.mean_partition", theory.long_context.mean_partition, lambda: dict(beta=2.0, d=3),
          (Param("beta", bad=NONNEG, ok=("zero",)), Param("d", bad=INT_GE1))),
    Entry("theory.long_context.mean_field_entropy", theory.long_context.mean_field_entropy, lambda: dict(n=100, beta=2.0, d=3),
          (Param("n", bad=POS), Param("beta", bad=NONNEG, ok=("zero",)), Param("d", bad=INT_GE1))),
    Entry("theory.long_context.partition_variance", theory.long_context.partition_variance, lambda: dict(beta=2.0, d=3),
          (Param("beta", bad=NONNEG, ok=("zero",)), Param("d", bad=INT_GE1))),
    Entry("theory.long_context.critical_limit", theory.long_context.critical_limit,
          lambda: dict(lam=np.array([0.5, 2.0]), d=3, samples=10, points=10),
          (Param("lam", bad=("nan", "inf", "neg", "zero", "dtype")), Param("d", bad=INT_GE1),
           Param("samples", bad=INT_GE1), Param("points", bad=INT_GE1), Param("seed", bad=("neg", "frac", "str")),
           Param("self_key", bad=("str", "none")))),
    Entry("theory.lost_in_the_middle.bessel_i", theory.lost_in_the_middle.bessel_i, lambda: dict(n=1, beta=1.0),
          (Param("beta", bad=FINITE), Param("num_nodes", bad=INT_GE1))),
    Entry("theory.causal_clustering.cap_measure", theory.causal_clustering.cap_measure, lambda: dict(delta=0.5, d=3),
          (Param("delta", bad=("nan", "inf", "neg", "str")), Param("d", bad=INT_GE1))),
    Entry("theory.causal_clustering.expected_renyi_centers", theory.causal_clustering.expected_renyi_centers, lambda: dict(n=10, d=3, delta=0.5),
          (Param("n", bad=INT_GE1), Param("d", bad=INT_GE1), Param("delta", bad=("nan", "inf", "neg", "str")))),
    Entry("theory.lost_in_the_middle.retrieval_weights", theory.lost_in_the_middle.retrieval_weights, lambda: dict(M=4, n_max=8),
          (Param("M", bad=INT_GE1), Param("n_max", bad=INT_GE1))),
    Entry("theory.lost_in_the_middle.litm_kernel", theory.lost_in_the_middle.litm_kernel, lambda: dict(sigma=0.3, sigma_p=0.2, lam=1.0),
          (Param("lam", bad=FINITE),)),
    Entry("theory.lost_in_the_middle.LostInTheMiddleMeanField", theory.lost_in_the_middle.LostInTheMiddleMeanField, lambda: dict(beta=1.0, lam=1.0, num_sigma=8, num_theta=8),
          (Param("beta", bad=FINITE), Param("lam", bad=FINITE), Param("num_sigma", bad=INT_GE1), Param("num_theta", bad=INT_GE1))),
    Entry("theory.lost_in_the_middle.volterra_closed_form", theory.lost_in_the_middle.volterra_closed_form,
          lambda: dict(a=1.0, t=1.0, sigma=np.array([0.5, 0.9]), sigma0=0.2, lam=1.0),
          (Param("a", bad=FINITE), Param("t", bad=NONNEG), Param("lam", bad=NONNEG),
           Param("sigma", bad=("nan", "inf", "neg", "zero", "dtype")), Param("sigma0", bad=POS))),
    Entry("theory.lost_in_the_middle.volterra_numerical", theory.lost_in_the_middle.volterra_numerical,
          lambda: dict(a=1.0, t=1.0, sigma0=0.2, lam=1.0, num_points=11),
          (Param("a", bad=FINITE), Param("t", bad=FINITE), Param("lam", bad=NONNEG),
           Param("sigma0", bad=POS + ("big",), big=2.0), Param("num_points", bad=INT_GE1 + ("huge",)))),
    Entry("theory.lost_in_the_middle.retrieval_profile", theory.lost_in_the_middle.retrieval_profile,
          lambda: dict(t=1.0, sigma0=np.array([0.2, 0.5, 0.8]), beta=1.0, lam=1.0, M=4, n_max=5),
          (Param("t", bad=NONNEG), Param("sigma0", bad=("nan", "inf", "neg", "zero", "dtype")),
           Param("beta", bad=NONNEG), Param("lam", bad=NONNEG), Param("M", bad=INT_GE1), Param("n_max", bad=INT_GE1))),
    Entry("theory.lost_in_the_middle.retrieval_discrete", theory.lost_in_the_middle.retrieval_discrete,
          lambda: dict(t=1.0, n=4, beta=1.0, lam=1.0, M=4, n_max=5),
          (Param("t", bad=NONNEG), Param("n", bad=INT_GE1), Param("beta", bad=FINITE), Param("lam", bad=FINITE),
           Param("M", bad=INT_GE1), Param("n_max", bad=INT_GE1))),
    Entry("theory.lost_in_the_middle.smallness_holds", theory.lost_in_the_middle.smallness_holds, lambda: dict(t=0.1, beta=1.0, lam=1.0, n_max=8),
          (Param("t", bad=NONNEG), Param("beta", bad=FINITE), Param("lam", bad=NONNEG), Param("n_max", bad=INT_GE1))),
    Entry("theory.lost_in_the_middle.u_shape", theory.lost_in_the_middle.u_shape, lambda: dict(profile=np.array([3.0, 1.0, 2.0])),
          (Param("profile", bad=("nan", "inf", "shape", "dtype", "none")),)),
    Entry("theory.equiangular.reduced_gap", theory.equiangular.reduced_gap,
          lambda: dict(ode=theory.equiangular.SAReducedODE(4, 1.0), rho0=0.2, ts=np.array([0.0, 0.5, 1.0]),
                       controller=diffrax.PIDController(rtol=1e-6, atol=1e-9)),
          (Param("rho0", bad=("nan", "inf", "big", "str"), big=2.0), Param("ts", bad=("nan", "inf", "shape")),
           Param("ode", bad=OBJECT))),
    Entry("theory.gaussian.sinkhorn_conditional_cov", theory.gaussian.sinkhorn_conditional_cov,
          lambda: dict(cov=np.eye(D), At=0.5 * np.eye(D)),
          (Param("cov", bad=ARRAY + ("neg",), traced=True), Param("At", bad=ARRAY, traced=True))),
    Entry("theory.equiangular.equiangular_start", theory.equiangular.equiangular_start, lambda: dict(key=KEY, n=3, d=3, rho0=0.2),
          (Param("n", bad=INT_GE1), Param("d", bad=INT_GE1), Param("rho0", bad=("nan", "inf", "big", "str"), big=2.0))),
    Entry("theory.equiangular.SAReducedODE", theory.equiangular.SAReducedODE, lambda: dict(n=4, beta=1.0),
          (Param("n", bad=INT_GE1), Param("beta", bad=FINITE))),
    Entry("theory.equiangular.USAReducedODE", theory.equiangular.USAReducedODE, lambda: dict(n=4, beta=1.0),
          (Param("n", bad=INT_GE1), Param("beta", bad=FINITE))),
    Entry("theory.equiangular.MultiHeadReducedODE", theory.equiangular.MultiHeadReducedODE,
          lambda: dict(n=4, beta=1.0, scores=np.array([1.0, 0.0]), values=np.array([1.0, -0.5])),
          (Param("n", bad=INT_GE1), Param("beta", bad=FINITE + ("vector",)), Param("scores", bad=ARRAY),
           Param("values", bad=ARRAY))),
    Entry("theory.equiangular.MultiHeadUSAReducedODE", theory.equiangular.MultiHeadUSAReducedODE,
          lambda: dict(n=4, beta=1.0, scores=np.array([1.0, -0.5])),
          (Param("n", bad=INT_GE1), Param("beta", bad=FINITE + ("vector",)), Param("scores", bad=ARRAY))),
    Entry("theory.equiangular.usa_critical_beta", theory.equiangular.usa_critical_beta,
          lambda: dict(score=0.5, repulsion=1.0, rho0=0.3),
          (Param("score", bad=POS), Param("repulsion", bad=POS), Param("rho0", bad=("nan", "inf", "big", "str", "neg"), big=2.0))),
    Entry("theory.equiangular.multihead_critical_beta", theory.equiangular.multihead_critical_beta,
          lambda: dict(n=4, score=1.0, value=1.0, repulsion=0.5, rho0=0.0),
          (Param("n", bad=INT_GE1), Param("score", bad=POS), Param("value", bad=POS), Param("repulsion", bad=POS),
           Param("rho0", bad=("nan", "inf", "big", "str"), big=2.0))),
    Entry("theory.equiangular.hitting_time", theory.equiangular.hitting_time,
          lambda: dict(ode=theory.equiangular.SAReducedODE(4, jnp.asarray(1.0)), rho0=0.0, rho1=0.5, num_nodes=16),
          (Param("ode", bad=OBJECT), Param("rho0", bad=("nan", "inf", "big", "str"), big=2.0),
           Param("rho1", bad=("nan", "inf", "big", "str"), big=2.0), Param("num_nodes", bad=INT_GE1 + ("huge",)))),
    Entry("theory.spectral_selection.symmetric_attention", theory.spectral_selection.symmetric_attention,
          lambda: dict(V=np.diag([1.0, -0.5]), beta=1.0),
          (Param("V", bad=ARRAY), BETA)),
    Entry("theory.spectral_selection.pure_mode_growth", theory.spectral_selection.pure_mode_growth,
          lambda: dict(eigenvalues=np.array([1.0, -0.5, 0.2]), k=0, plus=2, minus=1, beta=1.0),
          (Param("eigenvalues", bad=ARRAY), Param("k", bad=INT_GE1[1:] + ("big",), big=3), Param("plus", bad=INT_GE1[1:]),
           Param("minus", bad=INT_GE1[1:]), Param("beta", bad=POS))),
    Entry("theory.spectral_selection.homogeneous_mode_stable", theory.spectral_selection.homogeneous_mode_stable,
          lambda: dict(eigenvalues=np.array([1.0, -0.5, 0.2]), k=0),
          (Param("eigenvalues", bad=ARRAY), Param("k", bad=INT_GE1[1:] + ("big",), big=3))),
    Entry("theory.spectral_selection.balanced_split_stable", theory.spectral_selection.balanced_split_stable,
          lambda: dict(eigenvalues=np.array([-1.0, -0.5, 0.2]), k=0, beta=1.0),
          (Param("eigenvalues", bad=ARRAY), Param("k", bad=INT_GE1[1:] + ("big",), big=3), Param("beta", bad=POS))),
    Entry("theory.spectral_selection.predicted_mode", theory.spectral_selection.predicted_mode,
          lambda: dict(eigenvalues=np.array([1.0, -0.5, 0.2])), (Param("eigenvalues", bad=ARRAY),)),
    Entry("theory.gaussian.identity_value_cov", theory.gaussian.identity_value_cov, lambda: dict(cov0=np.eye(D), A=0.5 * np.eye(D), t=0.1),
          (Param("cov0", bad=("nan", "inf", "neg", "shape")), Param("t", bad=("nan", "inf", "str")),
           Param("A", bad=("nan", "inf", "shape")))),
    Entry("theory.gaussian.low_rank_distance", theory.gaussian.low_rank_distance, lambda: dict(cov=np.eye(D), rank=1),
          (Param("cov", bad=("nan", "inf", "neg", "shape", "dtype")), Param("rank", bad=("neg", "frac", "str", "big"), big=3))),
    Entry("theory.gaussian.identity_value_blowup_time", theory.gaussian.identity_value_blowup_time,
          lambda: dict(cov0=np.eye(D), A=0.5 * np.eye(D)), (Param("cov0", bad=("nan", "inf", "neg", "shape")),)),
    Entry("theory.logistic_overlap.logistic", theory.logistic_overlap.logistic, lambda: dict(u0=0.5, s=1.0),
          (Param("u0", bad=("nan", "inf", "str")), Param("s", bad=("nan", "inf", "str")))),
    Entry("theory.interaction_energy.candidate_energies", theory.interaction_energy.candidate_energies,
          lambda: dict(D=np.diag([1.0, 3.0]), beta=1.0), (Param("D", bad=("nan", "inf", "shape", "dtype")), Param("beta", bad=POS))),
    Entry("theory.interaction_energy.ngon_energy", theory.interaction_energy.ngon_energy, lambda: dict(n=5, beta=1.0),
          (Param("n", bad=INT_GE1), Param("beta", bad=POS))),
    Entry("theory.interaction_energy.four_particle_root", theory.interaction_energy.four_particle_root,
          lambda: dict(d1=1.0, d2=2.0, beta=1.0, tol=1e-12),
          (Param("d1", bad=POS), Param("d2", bad=POS), Param("beta", bad=POS), Param("tol", bad=POS))),
    Entry("theory.metastability.cap_alpha", theory.metastability.cap_alpha, lambda: dict(eps=0.05, angle=1.5),
          (Param("eps", bad=("nan", "inf", "neg", "big", "str"), big=2.0), Param("angle", bad=FINITE))),
    Entry("theory.metastability.predicted_exit_time", theory.metastability.predicted_exit_time,
          lambda: dict(betas=np.array([2.0, 4.0]), angle=1.5),
          (Param("betas", bad=("nan", "inf", "neg", "zero")), Param("angle", bad=("nan", "inf", "neg", "zero", "str")))),
    Entry("theory.metastability.bipodal_gamma", theory.metastability.bipodal_gamma, lambda: dict(a=0.5, b=2.0, phi=np.array([0.0, 1.0])),
          (Param("a", bad=FINITE), Param("b", bad=FINITE), Param("phi", bad=FINITE))),
    Entry("theory.metastability.bipodal_escape_rate", theory.metastability.bipodal_escape_rate, lambda: dict(gamma=np.array([1.0, 2.0])),
          (Param("gamma", bad=FINITE),)),
    Entry("theory.metastability.bipodal_log_slope", theory.metastability.bipodal_log_slope, lambda: dict(a=0.5, b=2.0),
          (Param("a", bad=FINITE), Param("b", bad=FINITE))),
    # --- convergence, statistics, sweeps, fitting
    Entry("convergence.convergence_study", convergence.convergence_study,
          lambda: dict(dynamics=ATTN, law=tp.Gaussian(np.zeros(D), np.eye(D)), ns=[4, 8], t1=0.1, dt0=0.05, seeds=(0, 1),
                       ts=np.array([0.0, 0.1]), w2_max_n=8),
          (Param("ns", bad=("nan", "inf", "neg", "zero", "frac", "huge", "shape")),
           Param("t1", bad=("nan", "inf", "neg", "zero", "str")), Param("dt0", bad=("nan", "inf", "neg", "zero", "str")),
           Param("seeds", bad=("nan", "neg", "frac", "str")), Param("n_ref", bad=INT_GE1 + ("huge",)),
           Param("w2_epsilon", bad=POS), Param("w2_max_iterations", bad=INT_GE1), Param("w2_threshold", bad=POS),
           Param("ts", bad=("nan", "inf", "neg", "shape", "str")), Param("dtype", bad=("str",)),
           Param("w2_max_n", bad=("neg", "frac", "nan", "inf", "str"))),
          covers=("convergence.ConvergenceResult",)),
    Entry("convergence.GaussianLaw", convergence.GaussianLaw, lambda: dict(law=tp.Gaussian(np.zeros(D), np.eye(D))),
          (Param("law", bad=OBJECT),)),
    Entry("convergence.SampledLaw", convergence.SampledLaw, lambda: dict(sample=tp.Gaussian(np.zeros(D), np.eye(D)).sample),
          (Param("sample", bad=OBJECT),)),
    Entry("convergence.gaussian_affine_field", convergence.gaussian_affine_field,
          lambda: dict(dynamics=ATTN, mean=np.zeros(D), cov=np.eye(D), t=0.0),
          (Param("mean", bad=ARRAY, traced=True), Param("cov", bad=ARRAY + ("neg",), traced=True),
           Param("t", bad=FINITE + ("vector",)), Param("dynamics", bad=OBJECT))),
    Entry("convergence.rate_table", convergence.rate_table,
          lambda: dict(result=_convergence_result(), metrics=["w1"], time_index=-1),
          (Param("result", bad=OBJECT), Param("metrics", bad=("str",)),
           Param("time_index", bad=("frac", "nan", "str", "huge")))),
    Entry("convergence.geometric_ns", convergence.geometric_ns, lambda: dict(lo=2, hi=16, step=1),
          (Param("lo", bad=INT_GE1), Param("hi", bad=INT_GE1 + ("huge",)), Param("step", bad=INT_GE1))),
    Entry("convergence.reference_rates", convergence.reference_rates, lambda: dict(d=2), (Param("d", bad=INT_GE1),)),
    Entry("convergence.uniform_sphere_law", convergence.uniform_sphere_law, lambda: dict(d=3), (Param("d", bad=INT_GE1),),
          covers=("convergence.StationaryLaw",)),
    Entry("convergence.perturbed_circle_law", convergence.perturbed_circle_law, lambda: dict(epsilon=0.1, k=1, order=16),
          (Param("epsilon", bad=("nan", "inf", "str", "big"), big=2.0), Param("k", bad=INT_GE1),
           Param("order", bad=INT_GE1 + ("huge",))),
          covers=("convergence.QuadratureLaw",)),
    Entry("convergence.vmf_cap_law", convergence.vmf_cap_law, lambda: dict(center=np.array([1.0, 0.0, 0.0]), kappa=2.0, order=8),
          (Param("kappa", bad=("nan", "inf", "neg", "str")), Param("order", bad=INT_GE1 + ("huge",)),
           Param("center", bad=("nan", "inf", "zero", "shape")))),
    Entry("convergence.gaussian_quadrature_law", convergence.gaussian_quadrature_law,
          lambda: dict(law=tp.Gaussian(np.zeros(D), np.eye(D)), order=8),
          (Param("order", bad=INT_GE1 + ("huge",)), Param("law", bad=("str", "none")))),
    Entry("convergence.SinkhornDistance", convergence.SinkhornDistance,
          lambda: dict(epsilon=0.01, max_iterations=100, threshold=1e-4),
          (Param("epsilon", bad=POS), Param("max_iterations", bad=INT_GE1), Param("threshold", bad=POS)),
          covers=("diagnostics.SinkhornDistance",)),
    Entry("convergence.mean_field_reference", convergence.mean_field_reference,
          lambda: dict(dynamics=ATTN, law=tp.Gaussian(np.zeros(D), np.eye(D)), n_ref=16, dtype=jnp.float64),
          (Param("n_ref", bad=INT_GE1 + ("huge",)),)),
    # --- measures, stationary states
    Entry("measures.refinement_orders", measures.refinement_orders, lambda: dict(order=8, rule=tp.CircleRule()),
          (Param("order", bad=INT_GE1),)),
    Entry("stationary.branch_from_uniform", stationary.branch_from_uniform,
          lambda: dict(dynamics=tp.Sphere(tp.UnnormalizedAttention.identity(2, 1.0)), sigma=1.0, modes=8, K_max=2.0,
                       max_points=3),
          (Param("sigma", bad=POS), Param("modes", bad=INT_GE1), Param("K_max", bad=POS),
           Param("K_min", bad=FINITE + ("big",), big=3.0), Param("ds", bad=POS + ("big",), big=1.0),
           Param("ds_min", bad=POS + ("big",), big=1.0), Param("ds_max", bad=POS), Param("tol", bad=POS),
           Param("max_points", bad=INT_GE1), Param("order_max", bad=PROB + ("zero",), big=2.0))),
    Entry("stationary.zonal_branch", stationary.zonal_branch,
          lambda: dict(dynamics=tp.Sphere(tp.UnnormalizedAttention.identity(3, 1.0)), sigma=1.0, degree=4, K_max=5.0,
                       max_points=3),
          (Param("sigma", bad=POS), Param("degree", bad=INT_GE1 + ("huge",)), Param("K_max", bad=POS),
           Param("K_min", bad=FINITE + ("big",), big=6.0), Param("ds", bad=POS + ("big",), big=1.0),
           Param("ds_min", bad=POS + ("big",), big=1.0), Param("ds_max", bad=POS), Param("tol", bad=POS),
           Param("max_points", bad=INT_GE1), Param("order_max", bad=PROB + ("zero",), big=2.0),
           Param("dynamics", bad=OBJECT))),
    Entry("stationary.critical_coupling", stationary.critical_coupling,
          lambda: dict(dynamics=tp.Sphere(tp.UnnormalizedAttention.identity(3, 4.0)), sigma=1.0, degree=48),
          (Param("sigma", bad=POS), Param("degree", bad=INT_GE1 + ("huge",)), Param("dynamics", bad=OBJECT))),
    Entry("stationary.zonal_spectrum", stationary.zonal_spectrum,
          lambda: dict(dynamics=tp.Sphere(tp.UnnormalizedAttention.identity(3, 1.0)), density=tp.ZonalDensity(np.ones(5), 3, 1.0),
                       K=1.0),
          (Param("K", bad=FINITE + ("vector",)), Param("density", bad=OBJECT))),
    Entry("stationary.spectrum", stationary.spectrum,
          lambda: dict(dynamics=tp.Sphere(tp.UnnormalizedAttention.identity(2, 1.0)), density=tp.CircleDensity(np.ones(8), 1.0),
                       K=1.0),
          (Param("K", bad=FINITE + ("vector",)), Param("density", bad=OBJECT))),
    Entry("statistics.fit_rate", statistics.fit_rate,
          lambda: dict(ns=np.array([4.0, 8.0, 16.0]), errors=np.array([[0.5, 0.4], [0.35, 0.3], [0.25, 0.2]]),
                       level=0.9, num_bootstrap=20),
          (Param("level", bad=("nan", "inf", "neg", "zero", "big", "str"), big=1.0),
           Param("num_bootstrap", bad=INT_GE1), Param("ns", bad=("nan", "inf", "neg", "zero", "shape")),
           Param("errors", bad=("nan", "inf", "neg", "shape")), Param("seed", bad=("neg", "frac", "nan", "str"))),
          covers=("statistics.RateFit",)),
    Entry("statistics.fit_log_law", statistics.fit_log_law,
          lambda: dict(ns=np.array([4.0, 8.0, 16.0]), values=np.array([[5.0, 4.0], [6.5, 6.0], [7.5, 8.0]]),
                       level=0.9, num_bootstrap=20),
          (Param("level", bad=("nan", "inf", "neg", "zero", "big", "str"), big=1.0),
           Param("num_bootstrap", bad=INT_GE1), Param("ns", bad=("nan", "inf", "neg", "zero", "shape")),
           Param("values", bad=("nan", "inf", "shape")), Param("seed", bad=("neg", "frac", "nan", "str"))),
          covers=("statistics.LogLawFit",)),
    Entry("sweep", tp.sweep, lambda: dict(fn=_sweep_fn, axes={"beta": [0.5, 1.0]}),
          (Param("axes", bad=("nan", "inf", "str", "none", "shape")), Param("chunk_size", bad=INT_GE1),
           Param("max_memory", bad=INT_GE1), Param("static", bad=("str", "huge", "vector")))),
    Entry("sweeps.first_time", sweeps.first_time, lambda: dict(ts=np.array([0.0, 0.5, 1.0]), condition=np.array([False, True, True])),
          (Param("ts", bad=("nan", "inf", "shape")),)),
    Entry("fit", tp.fit, lambda: dict(model=ATTN, loss=_loss, optimizer=optax.sgd(0.1), steps=2),
          (Param("steps", bad=INT_GE1 + ("huge",)), Param("optimizer", bad=("str", "none")),
           Param("keep", bad=("str",))),
          covers=("FitResult",)),
    Entry("BestIterate", tp.BestIterate, lambda: dict(patience=5, tol=0.0),
          (Param("patience", bad=INT_GE1), Param("tol", bad=("nan", "inf", "neg", "str"), ok=("zero",)))),
    Entry("checkpointed_adjoint", tp.checkpointed_adjoint, lambda: dict(num_steps=8),
          (Param("num_steps", bad=INT_GE1), Param("memory", bad=INT_GE1))),
    # --- kernels
    Entry("kernels.Fast", kernels.Fast, lambda: dict(tol=1e-6, radius=1.0),
          (Param("tol", bad=("nan", "inf", "neg", "zero", "big", "str"), big=1.0), Param("radius", bad=POS))),
    Entry("kernels.Auto", kernels.Auto, lambda: dict(tol=1e-6, radius=1.0),
          (Param("tol", bad=("nan", "inf", "neg", "zero", "big", "str"), big=1.0), Param("radius", bad=POS))),
    Entry("kernels.Streaming", kernels.Streaming, lambda: dict(key_block=4),
          (Param("key_block", bad=INT_GE1), Param("query_block", bad=INT_GE1))),
    Entry("kernels.DenseOrStreaming", kernels.DenseOrStreaming, lambda: dict(max_dense_pairs=64),
          (Param("max_dense_pairs", bad=("neg", "frac", "nan", "inf", "str"), ok=("zero",)),)),  # 0: always stream
    Entry("kernels.SpatialTiles", kernels.SpatialTiles, lambda: dict(tiles=kernels.Streaming(key_block=4)),
          (Param("tiles", bad=OBJECT),)),
    Entry("kernels.Exact", kernels.Exact, lambda: dict(layout=kernels.Dense()), (Param("layout", bad=OBJECT),)),
    Entry("kernels.bind_backend", lambda **kw: kernels.bind_backend(owner="SoftmaxAttention", **kw),
          lambda: dict(backend=kernels.Exact(), Q=I2.copy(), K=I2.copy(), beta=1.0), (Param("backend", bad=("str",)),)),
    *[Entry(f"kernels.{f.__name__}", f, _reduction_args, (Param("layout", bad=OBJECT),))
      for f in (kernels.lse_average, kernels.softmax_average, kernels.exp_kernel_sum)],
    Entry("kernels.sigmoid_kernel_sum", kernels.sigmoid_kernel_sum,
          lambda: dict(q=X.copy(), k=X.copy(), v=X.copy(), weights=W.copy()), (Param("layout", bad=OBJECT),)),
    Entry("kernels.log_weights", kernels.log_weights, lambda: dict(weights=W.copy()), (W_P,)),
    # --- runs
    Entry("runs.Checkpoint", tp.runs.Checkpoint, lambda: dict(directory="/nonexistent-fuzz", every=2),
          (Param("every", bad=INT_GE1), Param("directory", bad=("none", "huge")))),
    Entry("runs.lower_program", tp.runs.lower_program,
          lambda: dict(fn=_program_to_lower, static=(2.0,), args=(X.copy(),)),
          (Param("fn", bad=OBJECT), Param("static", bad=OBJECT), Param("args", bad=OBJECT + ("shape",)),
           Param("compiler_options", bad=("str",))), covers=("runs.program_key",)),
    Entry("runs.compile_program", tp.runs.compile_program,
          lambda: dict(fn=_program_to_lower, static=(2.0,), args=(X.copy(),)),
          (Param("fn", bad=OBJECT), Param("static", bad=OBJECT), Param("args", bad=OBJECT + ("shape",)),
           Param("compiler_options", bad=("str",)))),
    Entry("runs.cache_contents", tp.runs.cache_contents, lambda: dict(directory="/nonexistent-fuzz"),
          (Param("directory", bad=("none", "huge")),)),
    Entry("runs.clear_compile_cache", tp.runs.clear_compile_cache, lambda: dict(directory="/nonexistent-fuzz"),
          (Param("directory", bad=("none", "huge")),)),
    Entry("runs.call_kept", tp.runs.call_kept, lambda: dict(fn=_program_to_lower, args=(2.0, X.copy())),
          (Param("fn", bad=OBJECT), Param("args", bad=OBJECT))),
    Entry("runs.kept", tp.runs.kept, lambda: dict(fn=_program_to_lower), (Param("fn", bad=OBJECT),),
          covers=("runs.Kept",)),
    Entry("runs.carry_checks", tp.runs.carry_checks, lambda: dict(transform=jax.vmap, fn=_program_to_lower),
          (Param("transform", bad=OBJECT), Param("fn", bad=OBJECT))),
    Entry("runs.finite_by_construction", tp.runs.finite_by_construction, lambda: dict(arrays=[X.copy()]),
          (Param("arrays", bad=OBJECT),)),
    Entry("runs.raise_if_nonfinite", tp.runs.raise_if_nonfinite,
          lambda: dict(where="fuzz", nonfinite_time=np.full(3, np.inf), axes={"beta": W.copy()}, advice="none"),
          (Param("axes", bad=OBJECT),)),
    # refused before the directory is made (issue 37 item 3): the path below is never created
    Entry("runs.run_experiment", tp.runs.run_experiment, _clustering_run,
          (Param("exp", bad=OBJECT), Param("config", bad=OBJECT), Param("out_dir", bad=("none",)),
           Param("resume", bad=OBJECT), Param("replace", bad=OBJECT),
           Param("checkpoint_every", bad=("zero", "neg", "frac", "str")))),
]


EXEMPT: dict[str, str] = {}
"""Public names with no value a user chooses for it to fuzz, by reason."""


def _exempt(reason: str, *names: str) -> None:
    for n in names:
        EXEMPT[n] = reason


_exempt("abstract base: users subclass it; its concrete classes are registered",
        *[n for n in tp._NAMES if n.startswith("Abstract")],
        "diagnostics.AbstractClusterMetric", "kernels.AbstractBackend", "kernels.AbstractLayout",
        "solvers.AbstractDensity",
        "solvers.AbstractBlowUp", "solvers.AbstractBrownian", "solvers.AbstractNoisyState", "solvers.AbstractODE", "measures.AbstractRule", "solvers.AbstractState",
        "convergence.AbstractMeanFieldReference", "convergence.AbstractStudyDistance", "diagnostics.AbstractStudyDistance",
        "convergence.AbstractLaw",
        "theory.equiangular.AbstractReducedODE", "theory.noisy_sphere.AbstractNoisyAttention")
_exempt("a module (its public names are registered one by one)",
        "sharding", "kernels.backends", "kernels.binding", "kernels.fast", "kernels.exact", "kernels.spatial", "kernels.platforms",
        "kernels.point_clouds", "kernels.random_partition", "kernels.reduction", "solvers.circle",
        "solvers.sphere", "solvers.sphere_harmonics", "solvers.zonal",
        "stationary.zonal", "stationary.continuation",
        "stationary.circle", "solvers.random_transformer", *(f"theory.{m}" for m in theory.__all__))
_exempt("marks a traced array for the library's trace-time checks (returns it; any array is valid)",
        "runs.unit_rows_by_construction")
_exempt("a tolerance of a dtype (fuzzed through the sphere's unit-row check, which uses it)", "runs.unit_row_tolerance")
_exempt("a context manager taking nothing (what it changes is fuzzed through runs.call_kept)",
        "runs.kept_programs")
_exempt("a constant", "measures.MAX_NODES",
        "kernels.PLAN_MEMORY_BUDGET", "kernels.DENSE_MAX_PAIRS", "runs.DEFAULT_EVERY")
_exempt("an exception the library raises", "NonFiniteStateError", "kernels.PlanTooLarge", "solvers.UnderResolvedError",
        "stationary.ContinuationError",
        "runs.FailedRun", "runs.InterruptedRun", "runs.NonFiniteRun", "runs.SignalReceived")
_exempt("a result the library builds (users read it, never construct it)",
        "Solution", "GaussianSolution", "solvers.DensitySolution", "FitResult", "Result", "kernels.KernelReport",
        "SinkhornPotentials", "runs.CacheContents", "convergence.ConvergenceResult", "convergence.QuadratureReference",
        "convergence.StationaryReference", "convergence.GaussianClosureReference", "convergence.ParticleReference",
        "statistics.RateFit", "statistics.LogLawFit", "stationary.Branch", "stationary.ZonalBranch", "stationary.Fold", "kernels.ScoreBox", "kernels.SoftmaxReduction", "solvers.ODEState", "RandomHeadsField")
_exempt("takes no parameter (nothing to fuzz)", "BrownianIncrements", "ResidualLayer", "ReLU", "Softplus", "UnitSphere",
        "PostLN", "diagnostics.Cosine", "diagnostics.Euclidean", "kernels.Dense", "kernels.automatic",
        "kernels.fast_platforms", "convergence.ExactCircle", "convergence.ExactLine", "diagnostics.ExactCircle",
        "diagnostics.ExactLine")
_exempt("run-directory machinery: driven by the CLI fuzz (tests/fuzz/test_fuzz_cli.py) and tests/runs/",
        "runs.grid", "runs.load_run", "runs.redraw", "runs.run_fingerprint", "runs.run_info",
        "runs.stop_on_signals", "runs.solve_checkpointed")
_exempt("how a study runs, built by convergence_study from its checked arguments", "convergence.StudySpec")
_exempt("plotting of a finished sweep (draws, validates through xarray)", "heatmap")


def public_names() -> set[str]:
    """Every public name: the package's ``_NAMES`` (top level) and each subpackage's ``__all__``
    (``diagnostics.cluster_count``; a theory module's names as ``theory.lost_in_the_middle.bessel_i``)."""
    import importlib
    import types

    out = set(tp._NAMES)
    for sub in ("diagnostics", "kernels", "solvers", "measures", "stationary", "runs", "convergence", "sweeps",
                "statistics", "theory"):
        mod = importlib.import_module(f"transformer_pde.{sub}")
        for n in mod.__all__:
            obj = getattr(mod, n)
            if sub == "theory" and isinstance(obj, types.ModuleType):
                out |= {f"theory.{n}.{m}" for m in obj.__all__}
            if n in tp._NAMES and getattr(tp, n) is obj:
                continue  # the top-level name covers it
            out.add(f"{sub}.{n}")
    return out


def registered_names() -> set[str]:
    return {e.name for e in REGISTRY} | {c for e in REGISTRY for c in e.covers}


# ----------------------------------------------------------------------------- making values

def bad_value(kind: str, valid, param: Param, index: int = 0, magnitude: float = 1.0):
    """A value of ``kind`` for a parameter whose valid value is ``valid``: for an array, one
    element (at ``index`` mod its size) is replaced; ``magnitude`` scales negative and huge values."""
    if kind == "str":
        return "abc"
    if kind == "none":
        return None
    is_array = isinstance(valid, (np.ndarray, jax.Array, list)) and np.ndim(valid) >= 1
    is_int = isinstance(valid, (int, np.integer)) and not isinstance(valid, bool)
    if kind == "vector":
        return np.full(3, valid if not is_array else 1.0, dtype=float)
    if kind == "shape":
        if is_array:  # a matrix flattened, a vector given two more axes
            a = np.asarray(valid)
            return a.reshape(-1) if a.ndim > 1 else a[None, None]
        return np.ones((2, 2))
    if kind == "dtype":
        a = np.asarray(valid) if is_array else np.asarray(1.0)
        return np.full(a.shape, "a") if index % 2 == 0 else a.astype(complex) + 1j
    if kind == "frac":
        base = valid if is_int else 3
        return float(base) + 0.5
    scalar = {
        "nan": math.nan,
        "inf": math.inf if index % 2 == 0 else -math.inf,
        "neg": -abs(magnitude),
        "zero": 0 if is_int else 0.0,
        "huge": (2 ** 40, 2 ** 63)[index % 2] if is_int else (1e300, 2.0 ** 70)[index % 2],
        "big": param.big,
    }[kind]
    if not is_array:
        return scalar
    a = np.array(valid, dtype=np.result_type(np.asarray(valid).dtype, float) if kind != "zero" else None)
    flat = a.reshape(-1)
    if kind == "neg":
        flat[index % flat.size] = -abs(magnitude) * max(1.0, abs(flat[index % flat.size]))
    elif kind == "zero":
        flat[:] = 0
    else:
        flat[index % flat.size] = scalar
    return flat.reshape(a.shape)


# ----------------------------------------------------------------------------- running one case

ALLOWED = (ValueError, TypeError, eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)


@dataclasses.dataclass
class Outcome:
    kind: str  # "refused" | "returned"
    message: str = ""
    error: str = ""


def _finite_leaves(out) -> bool:
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(eqx.filter(out, eqx.is_inexact_array))]
    leaves += [leaf for leaf in jax.tree_util.tree_leaves(out)
               if isinstance(leaf, (float, np.floating, np.ndarray)) and np.issubdtype(np.asarray(leaf).dtype, np.inexact)]
    return all(bool(np.all(np.isfinite(np.asarray(leaf)))) for leaf in leaves)


_JITTED: dict[tuple[str, str], Callable] = {}


def call(entry: Entry, param: Param, value, traced: bool = False):
    """Call ``entry`` with its valid arguments and ``value`` for ``param`` (traced: as the traced
    argument of a jitted function, compiled once per entry, parameter, shape and dtype)."""
    kwargs = entry.valid()
    if not traced:
        return entry.call(**{**kwargs, param.name: value})
    key = (entry.name, param.name)
    if key not in _JITTED:
        _JITTED[key] = eqx.filter_jit(lambda v, kw: entry.call(**{**kw, param.name: v}))
    out = _JITTED[key](jnp.asarray(value), kwargs)
    return jax.block_until_ready(out)


def first_line_naming(message: str, words) -> str:
    """The line of a (possibly long, jit-wrapped) message that names the parameter."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for ln in lines:
        if names_param(ln, words):
            return ln
    return lines[0] if lines else ""


def names_param(message: str, words) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9_])", message) for w in words)


def error_message(e: BaseException) -> str:
    """The message of an error: for ``eqx.error_if`` under jit, the message it was given (the
    text around it is a traceback, whose source lines would name any parameter)."""
    text = str(e)
    found = re.findall(r"EquinoxRuntimeError: (.*)", text)
    return found[-1].strip() if found else text


def run_case(entry: Entry, param: Param, value, traced: bool = False) -> Outcome:
    try:
        out = call(entry, param, value, traced)
    except ALLOWED as e:
        msg = error_message(e)
        return Outcome("refused", first_line_naming(msg, param.words), f"{type(e).__name__}: {msg}")
    if not _finite_leaves(out):
        return Outcome("returned", "a non-finite result", "")
    return Outcome("returned")


def check_case(entry: Entry, param: Param, kind: str, value, traced: bool) -> None:
    """Raise AssertionError unless a bad kind is refused naming the parameter, and an ok kind
    returns a finite answer."""
    where = f"{entry.name}({param.name}={value!r}){' under jit' if traced else ''}"
    try:
        outcome = run_case(entry, param, value, traced)
    except Exception as e:  # any other exception: an obscure error from the wrong layer
        raise AssertionError(f"{where}: {type(e).__name__}: {str(e)[:400]}") from e
    if kind in param.ok:
        assert outcome.kind == "returned", f"{where}: a meaningful value was refused: {outcome.error[:400]}"
        assert not outcome.message, f"{where}: returned {outcome.message}"
        return
    assert outcome.kind == "refused", f"{where}: accepted ({outcome.message or 'a finite result'})"
    assert names_param(outcome.error, param.words), f"{where}: the message does not name {param.name}: {outcome.error[:400]}"
