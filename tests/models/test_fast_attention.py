"""Attention on the fast (NUFFT) kernel backends against the exact kernel (issue 13, items 1-3).

Oracle: the same attention with the default ``Exact`` backend (itself tested against NumPy in
tests/models/test_attention.py and tests/kernels/test_kernels.py). Each variant (weighted, time-dependent, on
the sphere, multi-head, ℓ², USA, Sinkhorn, float32) must agree to the backend's tolerance;
``Auto`` must choose with a stated reason and fall back where the a-posteriori bound misses
tol; gradients through ``tp.solve`` must match the exact kernel's; sharded runs (4 host devices,
a subprocess) must give the one-device numbers.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("jax_finufft")

import transformer_pde as tp  # noqa: E402
from transformer_pde.kernels import Auto, Exact, Fast, backends  # noqa: E402

RUNTIME_ERRORS = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fast_sharding_worker.py")
# Auto with no cost threshold: takes the fast path at test sizes (the choice is tested apart)
AUTO = dict(min_speedup=0.0)


def ball(n, d, seed, r_min=0.5, r_max=1.0):
    """Tokens with r_min <= |x| <= r_max (off the sphere: the general identity is needed)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return jnp.asarray(x * rng.uniform(r_min, r_max, (n, 1)))


def weights(n, seed):
    w = np.random.default_rng(seed + 7).dirichlet(np.full(n, 0.7))
    w[:3] = 0.0  # zero-weight tokens are ignored
    return jnp.asarray(w / w.sum())


def mats(d, seed, k=None, scale=0.4):
    rng = np.random.default_rng(seed)
    k = d if k is None else k
    Q = np.eye(k, d) + scale * rng.standard_normal((k, d)) / np.sqrt(d)
    K = np.eye(k, d) + scale * rng.standard_normal((k, d)) / np.sqrt(d)
    V = np.eye(d) + scale * rng.standard_normal((d, d)) / np.sqrt(d)
    return Q, K, V


def variant(name, backend, d=3):
    Q, K, V = mats(d, 1)
    if name == "softmax":
        return tp.SoftmaxAttention(Q, K, V, 2.0, backend=backend)
    if name == "l2":
        return tp.L2Attention(Q, K, V, 0.8, backend=backend)
    if name == "unnormalized":
        return tp.UnnormalizedAttention(Q, K, V, 1.5, shift=1.0, backend=backend)
    if name == "multihead":  # d = 6, three heads with scores in R^2
        rng = np.random.default_rng(2)
        Qh, Kh, Vh = (np.eye(6).reshape(3, 2, 6) + 0.3 * rng.standard_normal((3, 2, 6)) / 3
                      for _ in range(3))
        W = rng.standard_normal((3, 6, 2)) / 3
        return tp.MultiHeadAttention(Qh, Kh, Vh, W, 1.5, backend=backend)
    raise AssertionError(name)


def exact_twin(attn):
    """The same attention on the exact kernel (the backend is a static field: a copy with it
    replaced, every parameter shared)."""
    twin = copy.copy(attn)
    object.__setattr__(twin, "backend", Exact())
    return twin


def max_err(a, b):
    return float(jnp.max(jnp.abs(jnp.asarray(a) - jnp.asarray(b))))


# ------------------------------------------------------------------------------------------
# the backends compute the reduction they are handed


def numpy_lse_average(q, k, v, bias, causal=False, query_offset=0):
    """Written plainly, row by row: (avg, lse) of the logits q_i·k_j + bias_j."""
    q, k, v, bias = (np.asarray(z, np.float64) for z in (q, k, v, bias))
    avg, lse = np.zeros((q.shape[0], v.shape[1])), np.full(q.shape[0], -np.inf)
    for i in range(q.shape[0]):
        seen = np.isfinite(bias) & ((np.arange(k.shape[0]) <= query_offset + i) if causal else True)
        s = q[i] @ k[seen].T + bias[seen]
        p = np.exp(s - s.max())
        avg[i], lse[i] = p @ v[seen] / p.sum(), s.max() + np.log(p.sum())
    return avg, lse


@pytest.mark.slow
def test_backends_compute_the_reduction_they_are_handed():
    """Each backend against the NumPy reduction of the same SoftmaxReduction value: Exact with
    either factorization and either layout, causal included; Fast and Auto (bound to a box of
    radius 1) to their tolerance, Auto's exact choice bitwise Exact's; heads mapped alike."""
    from transformer_pde.kernels import SoftmaxReduction, Streaming

    rng = np.random.default_rng(11)
    a, b = (ball(n, 3, s) for n, s in ((40, 1), (60, 2)))
    v = jnp.asarray(rng.normal(size=(60, 2)))
    bias = jnp.log(weights(60, 3))  # zero weights: bias -inf, ignored
    gamma = jnp.asarray(2.0)
    ref_avg, ref_lse = numpy_lse_average(2.0 * np.asarray(a), b, v, bias)
    red = SoftmaxReduction(a, b, v, bias, gamma, jnp.float64)
    M = jnp.asarray(rng.normal(size=(3, 3)))  # another factorization of the same logits
    other = SoftmaxReduction(a, b, v, bias, gamma, jnp.float64,
                             exact_scores=(a @ M, 2.0 * b @ jnp.linalg.inv(M).T))
    for backend, r in ((Exact(), red), (Exact(Streaming(16, query_block=8)), red), (Exact(), other)):
        avg, lse = backend.lse_average(r)
        assert max_err(avg, ref_avg) < 1e-12 and max_err(lse, ref_lse) < 1e-12
    causal = SoftmaxReduction(a, b, v, bias, gamma, jnp.float64, causal=True, query_offset=10)
    c_avg, c_lse = numpy_lse_average(2.0 * np.asarray(a), b, v, bias, causal=True, query_offset=10)
    avg, lse = Exact(Streaming(16)).lse_average(causal)
    assert max_err(avg, c_avg) < 1e-12 and max_err(lse[np.isfinite(c_lse)], c_lse[np.isfinite(c_lse)]) < 1e-12

    def bound(backend):
        return backend.bind("test", Q=np.eye(3), K=np.eye(3), beta=2.0)

    for backend in (bound(Fast(tol=1e-11)), bound(Auto(tol=1e-10, **AUTO))):
        avg, lse = backend.lse_average(red)
        assert max_err(avg, ref_avg) < 1e-8 and max_err(lse, ref_lse) < 1e-8
    small = bound(Auto(tol=1e-10))  # predicted slower at this size: the exact kernel
    assert not small.report([red]).fast
    for got, want in zip(small.lse_average(red), Exact().lse_average(red)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="causal mask is not a convolution"):
        bound(Fast()).lse_average(causal)
    # heads: Exact maps one vmapped kernel, Fast loops; the same numbers
    stack = jnp.stack([a, 0.5 * a])

    def head(ah):
        return bound(Fast(tol=1e-11)).lse_average(SoftmaxReduction(ah, b, v, bias, gamma, jnp.float64))[0]

    looped = bound(Fast(tol=1e-11)).over_heads(head, stack)
    mapped = Exact().over_heads(lambda ah: Exact().lse_average(
        SoftmaxReduction(ah, b, v, bias, gamma, jnp.float64))[0], stack)
    assert looped.shape == (2, 40, 2) and max_err(looped, mapped) < 1e-8


# ------------------------------------------------------------------------------------------
# every variant, fast against exact


VELOCITY = eqx.filter_jit(lambda a, x, w: a.velocity(x, w))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "l2", "unnormalized", "multihead"])
def test_fast_matches_exact_weighted_off_sphere(name):
    d = 6 if name == "multihead" else 3
    x, w = ball(200, d, 0), weights(200, 0)
    fast = variant(name, Fast(tol=1e-11), d)
    ref = VELOCITY(exact_twin(fast), x, w)
    scale = max(1.0, float(jnp.max(jnp.abs(ref))))
    assert max_err(VELOCITY(fast, x, w), ref) <= 1e-8 * scale
    if name != "softmax":
        return
    report = fast.kernel_report(x, w)
    assert report.path == "fast" and report.max_avg_bound < 1e-8
    # the field at arbitrary queries (the mean-field object) too
    q = ball(50, d, 5)
    assert max_err(fast.field(q, x, w), exact_twin(fast).field(q, x, w)) <= 1e-8 * scale


@pytest.mark.slow
def test_time_dependent_parameters():
    """PiecewiseConstant layers (R over every layer's rows) and a callable with score_radius:
    the parameters are evaluated at t, and the plan covers all of them."""
    Q1, K1, V = mats(3, 3)
    Q2, K2, _ = mats(3, 4, scale=0.8)
    pc = lambda a, b: tp.PiecewiseConstant(values=jnp.stack([a, b]), dt=1.0)  # noqa: E731
    fast = tp.SoftmaxAttention(pc(Q1, Q2), pc(K1, K2), V, 2.0, backend=Fast(tol=1e-11))
    expected_R = max(np.linalg.norm(M, axis=1).max() for M in (Q1, Q2, K1, K2))
    assert fast.backend.box.radius == pytest.approx(expected_R)
    x, w = ball(200, 3, 1), weights(200, 1)
    vel = eqx.filter_jit(lambda a, x, w, t: a.velocity(x, w, t))
    for t in (0.5, 1.5):
        assert max_err(vel(fast, x, w, t), vel(exact_twin(fast), x, w, t)) < 1e-8
    # a callable has no norm before the run: Fast asks for score_radius, Auto says why it is exact
    rot = lambda t: jnp.array([[jnp.cos(t), -jnp.sin(t), 0.0], [jnp.sin(t), jnp.cos(t), 0.0],  # noqa: E731
                               [0.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match="callable parameter has no norm bound"):
        tp.SoftmaxAttention(rot, np.eye(3), V, 2.0, backend=Fast())
    auto = tp.SoftmaxAttention(rot, np.eye(3), V, 2.0, backend=Auto(**AUTO))
    assert auto.kernel_choice(10**6, 10**6, jnp.float64).path == "exact"
    assert "score_radius" in auto.kernel_choice(10**6, 10**6, jnp.float64).reason
    fast = tp.SoftmaxAttention(rot, np.eye(3), V, 2.0, backend=Fast(tol=1e-11, score_radius=1.0))
    assert max_err(vel(fast, x, w, 0.7), vel(exact_twin(fast), x, w, 0.7)) < 1e-8


def test_sphere_and_unit_tokens():
    """Under tp.Sphere the default radius = 1 is exact: R = max row norm of Q, K."""
    x = tp.uniform_sphere(jax.random.key(0), 400, 3)
    attn = tp.SoftmaxAttention.identity(3, 4.0, backend=Fast(tol=1e-11))
    assert attn.backend.box.radius == 1.0 and attn.backend.box.gamma == (4.0, 4.0)
    w = jnp.full(400, 1 / 400)
    assert max_err(VELOCITY(tp.Sphere(attn), x, w), VELOCITY(tp.Sphere(exact_twin(attn)), x, w)) < 1e-9
    # (solves on the sphere: test_gradients_through_solve_match_exact)


@pytest.mark.slow
def test_sinkhorn_through_the_fast_kernel():
    """Every Sinkhorn half-iteration and the final average on the NUFFT (FastDotCloud)."""
    x = ball(300, 3, 2, r_min=0.8)
    Q, K, V = mats(3, 5)
    kw = dict(epsilon=0.8, threshold=1e-11)
    dense = tp.SinkhornAttention(Q, K, V, 1.5, **kw)
    fast = tp.SinkhornAttention(Q, K, V, 1.5, backend=Fast(tol=1e-12), **kw)
    assert fast.backend.box.gamma == pytest.approx((1.5 / 0.8,) * 2)
    both = jax.jit(lambda a, x: (a.velocity(x), a.potentials(x).n_iters))
    (ref, it_ref), (out, it) = both(dense, x), both(fast, x)
    assert max_err(out, ref) < 1e-9 and int(it) == int(it_ref)
    with pytest.raises(ValueError, match="epsilon is traced"):
        jax.jit(lambda e: tp.SinkhornAttention(Q, K, V, 1.5, epsilon=e, backend=Fast()).beta)(0.8)


def test_float32():
    x = ball(300, 3, 3).astype(jnp.float32)
    Q, K, V = (m.astype(np.float32) for m in mats(3, 1))
    fast = tp.SoftmaxAttention(Q, K, V, 2.0, backend=Fast(tol=1e-5))
    out = fast.velocity(x)
    assert out.dtype == jnp.float32
    ref = exact_twin(fast).velocity(x.astype(jnp.float64))
    assert max_err(out, ref) < 2e-4
    # a tol float32 cannot reach: Auto keeps the exact kernel and says why
    auto = variant("softmax", Auto(tol=1e-9, **AUTO))
    report = auto.kernel_choice(10**6, 10**6, jnp.float32)
    assert report.path == "exact" and "out of reach in float32" in report.reason
    assert auto.kernel_choice(10**6, 10**6, jnp.float64).path == "fast"


# ------------------------------------------------------------------------------------------
# Auto: the choice, its reason, the fallback


def test_auto_choice_and_reason():
    auto = tp.SoftmaxAttention.identity(3, 1.0, backend=Auto(tol=1e-8))
    big, small = auto.kernel_choice(10**6, 10**6, jnp.float64), auto.kernel_choice(200, 200, jnp.float64)
    assert big.path == "fast" and "fewer flops" in big.reason
    assert big.predicted_speedup > backends.MIN_SPEEDUP["float64"] and big.predicted_error <= 1e-8
    assert big.plan.eta <= 1e-8 / (2 * big.mass_ratio)
    assert small.path == "exact" and "below min_speedup" in small.reason
    # causal, k > 3, traced beta without a window
    causal = tp.Causal(tp.SoftmaxAttention.identity(3, 1.0, backend=Auto()))
    assert "causal" in causal.kernel_choice(10**6, 10**6, jnp.float64).reason
    wide = tp.SoftmaxAttention.identity(4, 1.0, backend=Auto())
    assert "R^4" in wide.kernel_choice(10**6, 10**6, jnp.float64).reason
    reasons = []

    def build(beta):
        a = tp.SoftmaxAttention.identity(3, beta, backend=Auto())
        reasons.append(a.kernel_choice(10**6, 10**6, jnp.float64).reason)
        return a.beta

    jax.vmap(build)(jnp.array([1.0, 2.0]))
    assert "beta is traced" in reasons[0] and "beta=(lo, hi)" in reasons[0]
    # Fast refuses what it cannot plan, when the attention is built
    with pytest.raises(ValueError, match="k <= 3"):
        tp.SoftmaxAttention.identity(4, 1.0, backend=Fast())
    with pytest.raises(ValueError, match="non-causal"):
        tp.Causal(tp.SoftmaxAttention.identity(3, 1.0, backend=Fast()))


def unreliable_cloud():
    """Tokens off the sphere with a wide weight range u_j = w_j e^{β|b_j|²/2}: a shell at
    |x| = 1.5 (u ~ e^{4.5}) and a few near the origin, whose queries see a tiny share of the
    mass (ρ_i ~ 100 > the plan's budget): the a-posteriori bound misses tol there."""
    rng = np.random.default_rng(9)
    outer = rng.standard_normal((250, 3))
    outer *= 1.5 / np.linalg.norm(outer, axis=1, keepdims=True)
    inner = 0.1 * rng.standard_normal((12, 3))
    return jnp.asarray(np.concatenate([outer, inner]))


@pytest.mark.slow
def test_auto_falls_back_where_the_bound_misses_tol():
    x = unreliable_cloud()
    tol = 1e-9
    auto = tp.SoftmaxAttention.identity(3, 4.0, backend=Auto(tol=tol, radius=1.5, **AUTO))
    exact = exact_twin(auto)
    report = auto.kernel_report(x)
    assert report.path == "fast" and report.max_avg_bound > tol
    assert 0 < report.fallback_rows < x.shape[0]
    ref = exact.velocity(x)
    vel = jax.jit(lambda a, x: a.velocity(x))
    assert max_err(vel(auto, x), ref) <= tol * 10  # ‖V‖ = 1; rows fixed by the exact kernel
    # ℓ²: the kernel is the Gaussian itself; queries far from all keys (Q x far from K x)
    l2 = tp.L2Attention(2.0 * np.eye(3), np.eye(3), np.eye(3), 3.0,
                        backend=Auto(tol=tol, radius=1.0, **AUTO))
    y = ball(200, 3, 4)
    assert l2.kernel_report(y).fallback_rows > 0
    assert max_err(l2.velocity(y), exact_twin(l2).velocity(y)) <= 10 * tol


@pytest.mark.slow
def test_box_and_window_violations():
    """Fast raises (the box it was planned for is named); Auto recomputes exactly."""
    # |x| = 2 > radius = 1; more tokens than PATCH_ROWS, so Auto recomputes all of them at once
    n = backends.PATCH_ROWS + 76
    x = 2.0 * tp.uniform_sphere(jax.random.key(1), n, 3)
    fast = tp.SoftmaxAttention.identity(3, 1.0, backend=Fast(tol=1e-10))
    with pytest.raises(RUNTIME_ERRORS, match="left the box the fast kernel was planned for"):
        fast.velocity(x)
    auto = tp.SoftmaxAttention.identity(3, 1.0, backend=Auto(tol=1e-10, **AUTO))
    assert auto.kernel_report(x).fallback_rows == n
    assert max_err(auto.velocity(x), exact_twin(auto).velocity(x)) < 1e-14
    # β moved past the plan (a fit changing it): Fast raises, Auto goes exact
    y = tp.uniform_sphere(jax.random.key(2), 100, 3)
    moved = eqx.tree_at(lambda a: a.beta, fast, jnp.asarray(3.0))
    with pytest.raises(RUNTIME_ERRORS, match="declare Fast\\(beta=\\(lo, hi\\)\\)"):
        moved.velocity(y)
    moved = eqx.tree_at(lambda a: a.beta, auto, jnp.asarray(3.0))
    assert max_err(moved.velocity(y), exact_twin(moved).velocity(y)) < 1e-14


@pytest.mark.slow
def test_declared_beta_window_under_vmap():
    """A sweep builds the model under vmap (β traced): plan from the declared window."""
    x = tp.uniform_sphere(jax.random.key(3), 200, 3)
    betas = jnp.array([0.5, 1.0, 2.0])

    def vel(beta, backend):
        return tp.SoftmaxAttention.identity(3, beta, backend=backend).velocity(x)

    with pytest.raises(ValueError, match="declare its window"):
        jax.vmap(lambda b: vel(b, Fast()))(betas)
    out = jax.vmap(lambda b: vel(b, Fast(tol=1e-11, beta=(0.5, 2.0))))(betas)
    ref = jax.vmap(lambda b: vel(b, Exact()))(betas)
    assert max_err(out, ref) < 1e-9
    with pytest.raises(ValueError, match="outside the declared window"):
        tp.SoftmaxAttention.identity(3, 3.0, backend=Fast(beta=(0.5, 2.0)))


# ------------------------------------------------------------------------------------------
# gradients through solve


@pytest.mark.slow
def test_gradients_through_solve_match_exact():
    x0 = tp.uniform_sphere(jax.random.key(4), 48, 3)
    c = jax.random.normal(jax.random.key(5), (48, 3))
    fast = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.5, backend=Fast(tol=1e-12)))
    exact = tp.Sphere(exact_twin(fast.dynamics))

    def loss(beta, x0, dyn):
        dyn = eqx.tree_at(lambda d: d.dynamics.beta, dyn, beta)
        sol = tp.solve(dyn, x0, t1=0.6, dt0=0.2, solver=diffrax.Euler(), saveat=jnp.array([0.6]))
        return jnp.sum(sol.final * c)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    with jax.numpy_rank_promotion("allow"):  # jax-finufft's JVP broadcasts implicitly
        gb_f, gx_f = grad(jnp.asarray(1.5), x0, fast)
    gb_e, gx_e = grad(jnp.asarray(1.5), x0, exact)
    assert abs(float(gb_f - gb_e)) <= 1e-7 * max(1.0, abs(float(gb_e)))
    assert max_err(gx_f, gx_e) <= 1e-7 * max(1.0, float(jnp.max(jnp.abs(gx_e))))


# ------------------------------------------------------------------------------------------
# sharding: 4 host devices in a subprocess


@pytest.mark.slow
def test_sharded_fast_matches_one_device():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, str(WORKER), "4"], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert report["devices"] == 4
    assert set(report["errors"]) == {"softmax_fast", "multihead_fast", "unnormalized_fast",
                                     "auto_fallback"}
    for name, err in report["errors"].items():
        assert err < 1e-12, (name, err)
    # nothing of size n is gathered on the fast path: the compiled program has no all-gather
    assert report["fast_all_gathers"] == 0
    # one psum of ceil((1 + e)/2) = 2 complex mode arrays (e = d = 3), plus a few scalars
    assert report["fast_all_reduce_elems"] <= 2 * report["modes"] + 16
