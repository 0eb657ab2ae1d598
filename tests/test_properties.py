"""Property-based tests (hypothesis): invariants of the mean-field dynamics, and bad inputs.

Invariants (spec README "Conventions"; euclidean.md §1): the velocity Γ_μ depends on the
tokens only through the measure μ = Σ_j w_j δ_{x_j}, hence

* permutation equivariance: relabelling tokens (with their weights) relabels velocities;
* weight splitting: a token of weight a + b and two coincident tokens of weights a and b give
  the same μ, hence the same velocity, and (mass conservation: each token carries its mass
  along the flow) the same trajectory for all times;
* the sphere: Sphere velocities are tangent, and solved tokens stay on S^{d-1};
* weights are never changed by a solve (Σ w = 1 at every time).

Shapes are fixed per strategy so every example reuses one compilation; values (tokens,
weights, β, ε, permutations) vary. ``deadline=None`` because the first example compiles.

Cases run per property (``pytest tests/test_properties.py --hypothesis-show-statistics``,
measured when this file was written): permutation 25 × 6 variants, splitting 25 × 6,
sphere tangency 25, sphere solve 10, trajectory splitting 8, weights preserved 10, bad weights
40, bad covariances 40, non-finite tokens 40, wrong-rank tokens 30, float32 large-β/large-norm
25 × 5 variants. Every test also counts its examples in ``EXAMPLES`` and asserts a minimum,
so a property that silently ran zero cases fails.
"""

from __future__ import annotations

import collections
import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import transformer_pde as tp

EXAMPLES: collections.Counter = collections.Counter()


def ran_at_least(key: str, minimum: int):
    """Each property asserts its own number of examples right after running them, so the check
    holds whatever the test order or the xdist worker (no shared last test)."""

    def decorate(test):
        @functools.wraps(test)
        def wrapper(*args, **kwargs):
            name = key.format(**kwargs)
            EXAMPLES[name] = 0
            test(*args, **kwargs)
            assert EXAMPLES[name] >= minimum, (name, EXAMPLES[name])

        return wrapper

    return decorate
FAST = settings(deadline=None, max_examples=25, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

N, D = 6, 4
finite = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False)
tokens = hnp.arrays(np.float64, (N, D), elements=finite)
raw_weights = hnp.arrays(np.float64, (N,), elements=st.floats(0.05, 1.0))
betas = st.floats(0.1, 4.0)


def normalized(w):
    return w / w.sum()


def _rng_matrix(seed, shape, dtype, scale=0.5):
    return jnp.asarray(np.random.default_rng(seed).normal(scale=scale, size=shape), dtype)


def make_attention(kind: str, beta: float, seed: int = 0, dtype=jnp.float64):
    """One instance per variant; random Q, K, V (fixed seed), β from hypothesis."""
    Q, K, V = (_rng_matrix(seed + i, (D, D), dtype) for i in range(3))
    if kind == "softmax":
        return tp.SoftmaxAttention(Q, K, V, beta)
    if kind == "l2":
        return tp.L2Attention(Q, K, V, beta)
    if kind == "sigmoid":
        return tp.SigmoidAttention(Q, K, V, beta, -0.5)
    if kind == "usa":
        return tp.UnnormalizedAttention(Q, K, V, beta, shift=1.0)
    if kind == "multihead":
        return tp.MultiHeadAttention.split(Q, K, V, 2, beta)
    if kind == "sinkhorn":
        return tp.SinkhornAttention(Q, K, V, beta, epsilon=1.0, threshold=1e-10,
                                    max_iterations=5000)
    raise AssertionError(kind)


KINDS = ["softmax", "l2", "sigmoid", "usa", "multihead", "sinkhorn"]
potentials = eqx.filter_jit(lambda attn, x: attn.potentials(x))


@eqx.filter_jit
def velocity(attn, x, w):
    """Jitted once per variant and shape: β and the matrices are array leaves, so new
    hypothesis values do not recompile (ott's Sinkhorn loop would retrace eagerly)."""
    return attn.velocity(x, w)


def _tol(kind):
    return 1e-6 if kind == "sinkhorn" else 1e-10  # Sinkhorn: to its convergence threshold


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@ran_at_least("perm-{kind}", 5)
@FAST
@given(x=tokens, w=raw_weights, beta=betas, perm=st.permutations(range(N)))
def test_permutation_equivariance(kind, x, w, beta, perm):
    EXAMPLES[f"perm-{kind}"] += 1
    attn = make_attention(kind, beta)
    w = normalized(w)
    p = np.asarray(perm)
    v = velocity(attn, x, w)
    vp = velocity(attn, x[p], w[p])
    np.testing.assert_allclose(vp, v[p], atol=_tol(kind) * (1 + np.abs(v).max()))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@ran_at_least("split-{kind}", 5)
@FAST
@given(x=tokens, w=raw_weights, beta=betas, j=st.integers(0, N - 1), a=st.floats(0.05, 0.95))
def test_weight_splitting(kind, x, w, beta, j, a):
    """Γ depends only on μ: split token j into two coincident copies of weights a·w_j, (1-a)·w_j."""
    EXAMPLES[f"split-{kind}"] += 1
    attn = make_attention(kind, beta)
    w = normalized(w)
    x2 = np.concatenate([x, x[j:j + 1]])
    w2 = np.concatenate([w, [(1 - a) * w[j]]])
    w2[j] = a * w[j]
    v = velocity(attn, x, w)
    v2 = velocity(attn, x2, w2)
    np.testing.assert_allclose(v2[:N], v, atol=_tol(kind) * (1 + np.abs(v).max()))
    np.testing.assert_allclose(v2[N], v[j], atol=_tol(kind) * (1 + np.abs(v).max()))


@ran_at_least("sphere-tangent", 5)
@FAST
@given(x=tokens.filter(lambda a: np.linalg.norm(a, axis=1).min() > 1e-3), w=raw_weights,
       beta=betas, kind=st.sampled_from(["softmax", "l2", "multihead", "usa"]))
@pytest.mark.slow
def test_sphere_velocity_is_tangent(x, w, beta, kind):
    EXAMPLES["sphere-tangent"] += 1
    xs = np.asarray(tp.normalize(jnp.asarray(x)))
    v = velocity(tp.Sphere(make_attention(kind, beta)), xs, normalized(w))
    np.testing.assert_allclose(np.sum(v * xs, axis=1), 0.0, atol=1e-12 * (1 + np.abs(v).max()))


SAVE = jnp.linspace(0.0, 1.0, 5)


@ran_at_least("sphere-solve", 5)
@settings(FAST, max_examples=10)
@given(x=tokens.filter(lambda a: np.linalg.norm(a, axis=1).min() > 1e-3), w=raw_weights,
       beta=betas)
@pytest.mark.slow
def test_retracted_sphere_solve_follows_the_projected_flow(x, w, beta):
    """The retraction after each step changes the flow by no more than the solver's error: the
    retracted Tsit5 solve agrees with an unretracted solve of dx/dt = P⊥_x Γ(x) in R^d (whose
    norms the flow keeps only up to the solver's tolerance), for any weights."""
    EXAMPLES["sphere-solve"] += 1
    xs = tp.normalize(jnp.asarray(x))
    w = normalized(w)
    dyn = tp.Sphere(make_attention("softmax", beta))
    ctrl = diffrax.PIDController(rtol=1e-10, atol=1e-12)
    sol = tp.solve(dyn, tp.Particles(xs, w), t1=1.0, dt0=0.1, saveat=SAVE, stepsize_controller=ctrl)
    free = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, args: dyn.vector_field(y, w, t)),
                               diffrax.Tsit5(), 0.0, 1.0, 0.1, xs, saveat=diffrax.SaveAt(ts=SAVE),
                               stepsize_controller=ctrl, max_steps=10_000)
    np.testing.assert_allclose(sol.xs, free.ys, atol=1e-7)


@ran_at_least("split-trajectory", 4)
@settings(FAST, max_examples=8)
@given(x=tokens, w=raw_weights, beta=st.floats(0.1, 2.0), j=st.integers(0, N - 1),
       a=st.floats(0.05, 0.95))
@pytest.mark.slow
def test_mass_conservation_along_trajectories(x, w, beta, j, a):
    """Each token carries its mass: splitting one token into two coincident ones of the same
    total weight leaves the whole trajectory unchanged (both copies move together)."""
    EXAMPLES["split-trajectory"] += 1
    attn = make_attention("l2", beta)
    w = normalized(w)
    x2 = jnp.asarray(np.concatenate([x, x[j:j + 1]]))
    w2 = np.concatenate([w, [(1 - a) * w[j]]])
    w2[j] = a * w[j]
    sol = tp.solve(attn, tp.Particles(jnp.asarray(x), w), t1=1.0, dt0=0.1, saveat=SAVE)
    sol2 = tp.solve(attn, tp.Particles(x2, w2), t1=1.0, dt0=0.1, saveat=SAVE)
    scale = 1 + float(jnp.abs(sol.xs).max())
    np.testing.assert_allclose(sol2.xs[:, :N], sol.xs, atol=1e-10 * scale)
    np.testing.assert_allclose(sol2.xs[:, N], sol.xs[:, j], atol=1e-10 * scale)
    # Σ_i w_i is conserved: the weights of the solution are the initial ones
    np.testing.assert_array_equal(sol2.weights, w2)


# --- the bad-input list, randomized -----------------------------------------------------------

SA = tp.SoftmaxAttention.identity(D, 1.0)


@ran_at_least("bad-weights", 20)
@settings(FAST, max_examples=40)
@given(w=hnp.arrays(np.float64, (N,), elements=st.floats(-1.0, 1.0)))
def test_random_bad_weights_are_rejected(w):
    x = np.ones((N, D))
    bad_sign = (w < 0).any()
    bad_sum = abs(w.sum() - 1.0) > 1e-7
    EXAMPLES["bad-weights"] += 1
    if not (bad_sign or bad_sum):
        SA.velocity(x, w)  # a valid probability vector passes
        return
    with pytest.raises(ValueError, match=r"weights must (be non-negative|sum to 1)"):
        SA.velocity(x, w)


@ran_at_least("bad-cov", 20)
@settings(FAST, max_examples=40)
@given(m=hnp.arrays(np.float64, (3, 3), elements=st.floats(-2.0, 2.0)),
       shift=st.floats(0.0, 3.0))
def test_random_non_spd_covariances_are_rejected(m, shift):
    """cov = S - (λ_min(S) + shift) I with S symmetric has λ_min = -shift <= 0."""
    EXAMPLES["bad-cov"] += 1
    s = (m + m.T) / 2
    cov = s - (np.linalg.eigvalsh(s)[0] + shift) * np.eye(3)
    with pytest.raises(ValueError, match=r"Gaussian.cov must be positive definite, but its "
                                         r"smallest eigenvalue is"):
        tp.Gaussian(np.zeros(3), cov)
    # and a non-symmetric perturbation of an SPD matrix is named as such
    spd = s @ s.T + np.eye(3)
    spd[0, 2] += 0.1 + shift
    with pytest.raises(ValueError, match="Gaussian.cov must be symmetric"):
        tp.Gaussian(np.zeros(3), spd)


@ran_at_least("bad-tokens", 20)
@settings(FAST, max_examples=40)
@given(i=st.integers(0, N - 1), k=st.integers(0, D - 1),
       bad=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_random_nonfinite_tokens_are_named(i, k, bad):
    EXAMPLES["bad-tokens"] += 1
    x = np.ones((N, D))
    x[i, k] = bad
    with pytest.raises(ValueError, match=rf"x must be finite, but x\[{i}, {k}\] = "):
        SA.velocity(x)


@pytest.mark.package_errors
@ran_at_least("bad-rank", 10)
@settings(FAST, max_examples=30)
@given(shape=st.lists(st.integers(1, 3), min_size=0, max_size=4).filter(lambda s: len(s) != 2))
def test_random_wrong_rank_tokens_are_rejected(shape):
    EXAMPLES["bad-rank"] += 1
    with pytest.raises(ValueError, match=r"x must have shape \(n, d\)"):
        SA.velocity(np.ones(shape))


# --- numerical robustness in float32 ----------------------------------------------------------

ROBUST_KINDS = ["softmax", "l2", "multihead", "sigmoid", "sinkhorn"]


@pytest.mark.parametrize("kind", ROBUST_KINDS)
@ran_at_least("f32-{kind}", 5)
@settings(FAST, max_examples=25)
@given(x=hnp.arrays(np.float32, (N, D), elements=st.floats(-1.0, 1.0, width=32)),
       log_beta=st.floats(-1.0, 3.0), log_norm=st.floats(-1.0, 2.0))
@pytest.mark.slow
def test_float32_large_beta_and_norms_stay_finite(kind, x, log_beta, log_norm):
    """β up to 1e3 and token norms up to 1e2 (logits up to ~1e7): every variant stays finite
    in float32, softmax-type outputs stay in the convex hull of the values V x_j."""
    EXAMPLES[f"f32-{kind}"] += 1
    beta = float(10.0**log_beta)
    x = jnp.asarray(x, jnp.float32)
    norms = jnp.linalg.norm(x, axis=1, keepdims=True)
    x = jnp.where(norms > 1e-3, x / norms, jnp.ones_like(x) / 2) * jnp.float32(10.0**log_norm)
    attn = make_attention(kind, beta, dtype=jnp.float32)
    if kind == "sinkhorn":  # cost scale ~β|x|²: non-convergence is reported, not NaN
        attn = tp.SinkhornAttention(attn.Q, attn.K, attn.V, beta, epsilon=1.0, max_iterations=200,
                                    throw=False)
        pot = potentials(attn, x)
        assert np.isfinite(np.asarray(pot.g)).all() and pot.converged.dtype == bool
    v = np.asarray(velocity(attn, x, jnp.full((N,), 1.0 / N, jnp.float32)))
    assert v.dtype == np.float32 and np.isfinite(v).all(), (kind, beta, v)
    if kind in ("softmax", "l2", "sinkhorn"):  # a convex combination of the rows V x_j
        vx = np.asarray(x @ attn.V.T, np.float64)
        lo, hi = vx.min(0), vx.max(0)
        # float32 logits ℓ carry absolute error ~eps·|ℓ|, so the weights e^ℓ/Σe^ℓ carry that
        # relative error: the hull holds up to it
        xs = np.asarray(x, np.float64)
        logit = beta * np.abs(xs @ np.asarray(attn.Q, np.float64).T).max() * np.abs(
            xs @ np.asarray(attn.K, np.float64).T).max() * (2 if kind == "l2" else 1)
        slack = (1e-5 + 8 * np.finfo(np.float32).eps * logit) * (1 + np.abs(vx).max())
        assert (v >= lo - slack).all() and (v <= hi + slack).all()


def test_float32_sphere_solve_at_beta_1e3_stays_finite_and_normalized():
    x0 = tp.uniform_sphere(jax.random.key(3), 32, 3, dtype=jnp.float32)
    for attn in (tp.SoftmaxAttention.identity(3, 1e3), tp.L2Attention(jnp.eye(3), jnp.eye(3),
                                                                       jnp.eye(3), 1e3)):
        sol = tp.solve(tp.Sphere(attn), x0, t1=1.0, dt0=0.01, saveat=SAVE,
                       solver=diffrax.Euler())
        assert sol.xs.dtype == jnp.float32 and np.isfinite(sol.xs).all()
        np.testing.assert_allclose(np.linalg.norm(sol.xs, axis=-1), 1.0, atol=1e-5)
