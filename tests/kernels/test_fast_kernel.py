"""The fast (NUFFT) kernel against plain dense references: values, bounds, gradients, transforms.

Oracles: a NumPy dense softmax written plainly (exp of the logits, normalize), the dense JAX
formula for gradients, the exact kernel's contract, and direct numerics for the plan's
aliasing / truncation bounds (transformer_pde/kernels/fast.py, euclidean.md §7, issue 13).
"""

import jax

jax.config.update("jax_enable_x64", True)

import math  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("jax_finufft")

from transformer_pde.kernels.fast import (  # noqa: E402
    FastSumInfo,
    GaussianSumPlan,
    fast_lse_average,
    fast_lse_average_with_info,
    plan_gaussian_sum,
)


def dense_numpy(a, b, v, bias, gamma):
    """avg_i = Σ_j p_ij v_j, lse_i = log Σ_j exp(γ a_i·b_j + bias_j), loop-free and plain."""
    logits = gamma * a @ b.T + bias[None, :]
    shift = logits.max(axis=1, keepdims=True)
    p = np.exp(logits - shift)
    total = p.sum(axis=1)
    return (p @ v) / total[:, None], shift[:, 0] + np.log(total)


def dense_jax(a, b, v, bias, gamma):
    logits = gamma * a @ b.T + bias[None, :]
    lse = jax.nn.logsumexp(logits, axis=1)
    return jnp.exp(logits - lse[:, None]) @ v, lse


def cloud(n, k, seed, r_min=0.8):
    """Tokens in the shell r_min <= |x| <= 1 (off the sphere: the general identity is needed)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x * rng.uniform(r_min, 1.0, (n, 1))


def problem(n, m, k, weighted, seed):
    rng = np.random.default_rng(seed + 1000)
    x = cloud(n, k, seed)
    v = rng.standard_normal((n, 2)) + 3.0
    if weighted:
        bias = np.log(rng.dirichlet(np.full(n, 0.5)))
        bias[:3] = -np.inf  # zero-weight keys
    else:
        bias = np.full(n, -math.log(n))
    return x[:m], x, v, bias


# ------------------------------------------------------------------------------------------
# the plan


def test_plan_bounds_hold_numerically():
    """ε_A and ε_T are true bounds: the truncated periodized kernel is within ε_A + ε_T of g on
    every difference |t| <= 2R, checked by direct summation of images and modes."""
    for gamma, radius, tol in [(1.0, 1.0, 1e-6), (9.0, 1.0, 1e-10), (100.0, 0.5, 1e-8)]:
        plan = plan_gaussian_sum(gamma, radius, 1, tol)
        P, h = plan.period, plan.modes // 2
        t = np.linspace(-2 * radius, 2 * radius, 2001)
        g = np.exp(-gamma * t**2 / 2)
        images = np.arange(-50, 51)
        g_per = np.exp(-gamma * (t[:, None] + P * images[None, :]) ** 2 / 2).sum(axis=1)
        assert np.all(g_per - g >= -1e-16)
        assert np.max(g_per - g) <= plan.aliasing_error
        w = 2 * np.pi * np.arange(-h, h + 1) / P
        coef = np.sqrt(2 * np.pi / gamma) * np.exp(-(w**2) / (2 * gamma)) / P
        g_trunc = (coef[None, :] * np.cos(w[None, :] * t[:, None])).sum(axis=1)
        assert np.max(np.abs(g_trunc - g_per)) <= plan.truncation_error + 1e-15
        assert np.max(np.abs(g_trunc - g)) <= plan.aliasing_error + plan.truncation_error + 1e-15


def test_plan_choice_and_cost():
    plan = plan_gaussian_sum(9.0, 1.0, 3, 1e-8)
    assert isinstance(plan, GaussianSumPlan)
    assert plan.eta <= plan.tol
    assert plan.modes % 2 == 1 and plan.total_modes == plan.modes**3
    # half-period R + reach/2, not issue 13's 2R + reach (which aliases no less but costs 2^k x)
    reach = math.sqrt(2 * math.log(1 / 1e-8) / 9.0)
    assert plan.half_period < 2 * 1.0 + reach
    assert plan.period - 2 * plan.radius == pytest.approx(reach, rel=0.5)
    # the fast cost is linear in n; the exact one quadratic
    assert plan.predicted_flops(10**6, e=3) < 20 * plan.predicted_flops(10**5, e=3)
    assert plan.predicted_speedup(10**6, e=3) > 100
    assert plan.exact_flops(100, 50, 3) == 100 * 50 * (2 * 3 + 10 + 2 * 4)
    # smaller tol: more modes and a smaller bound
    finer = plan_gaussian_sum(9.0, 1.0, 3, 1e-12)
    assert finer.modes > plan.modes and finer.eta < plan.eta


def test_plan_rejects_bad_input():
    with pytest.raises(ValueError, match="k in"):
        plan_gaussian_sum(1.0, 1.0, 4, 1e-6)
    with pytest.raises(ValueError, match="gamma"):
        plan_gaussian_sum(-1.0, 1.0, 2, 1e-6)
    with pytest.raises(ValueError, match="radius"):
        plan_gaussian_sum(1.0, 0.0, 2, 1e-6)
    with pytest.raises(ValueError, match="tol"):
        plan_gaussian_sum(1.0, 1.0, 2, 2.0)
    with pytest.warns(UserWarning, match="float32"):
        plan_gaussian_sum(1.0, 1.0, 2, 1e-9, dtype=jnp.float32)


def test_nufft_error_model():
    """The bound's NUFFT model: every output is within eps times the input's l1 norm."""
    from jax_finufft import nufft1, nufft2

    rng = np.random.default_rng(0)
    x = rng.uniform(-np.pi, np.pi, (2, 300))
    c = rng.uniform(size=300) + 1j * rng.uniform(size=300)
    ell = np.arange(-7, 8)
    phase = np.exp(-1j * (ell[:, None, None] * x[0] + ell[None, :, None] * x[1]))  # (15, 15, n)
    f = rng.standard_normal((15, 15)) + 1j * rng.standard_normal((15, 15))
    for eps in [1e-4, 1e-8, 1e-12]:
        f1 = np.asarray(nufft1((15, 15), jnp.asarray(c), *map(jnp.asarray, x), eps=eps, iflag=-1))
        assert np.abs(f1 - (phase * c).sum(-1)).max() <= eps * np.abs(c).sum()
        c2 = np.asarray(nufft2(jnp.asarray(f), *map(jnp.asarray, x), eps=eps, iflag=1))
        direct = (np.conj(phase) * f[:, :, None]).sum((0, 1))
        assert np.abs(c2 - direct).max() <= eps * np.abs(f).sum()


# ------------------------------------------------------------------------------------------
# values and bounds against the NumPy reference


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("gamma", [1.0, 9.0, 100.0])
@pytest.mark.parametrize("tol", [1e-6, 1e-10])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_dense_within_bound(k, gamma, tol, weighted):
    a, b, v, bias = problem(400, 300, k, weighted, seed=10 * k + weighted)
    plan = plan_gaussian_sum(gamma, 1.0, k, tol)
    assert plan.eta <= tol
    avg, lse, info = fast_lse_average_with_info(*map(jnp.asarray, (a, b, v, bias)), gamma, plan)
    ref_avg, ref_lse = dense_numpy(a, b, v, bias, gamma)
    err_avg = np.abs(np.asarray(avg) - ref_avg).max(axis=1)
    err_lse = np.abs(np.asarray(lse) - ref_lse)
    lse_b, avg_b, ratio = map(np.asarray, (info.lse_bound, info.avg_bound, info.mass_ratio))
    assert bool(info.in_box) and np.all(np.isfinite(avg)) and np.all(np.isfinite(lse))
    # the a-posteriori bound holds on every query ...
    assert np.all(err_lse <= lse_b) and np.all(err_avg <= avg_b)
    # ... and is the stated one, tol · ρ_i to first order (plus rounding)
    finite = np.isfinite(lse_b)
    r = plan.eta * ratio[finite]
    assert np.all(lse_b[finite] <= 1.01 * -np.log1p(-r) + 1e-12)
    # the true ρ_i = U / D_i gives the a-priori bound, which holds as well
    logits = gamma * a @ b.T + bias[None, :]
    log_u = bias + gamma * (b**2).sum(1) / 2
    rho = np.exp(log_u - log_u.max()).sum() / np.exp(logits - gamma * (a**2).sum(1)[:, None] / 2
                                                      - log_u.max()).sum(1)
    ok = plan.eta * rho < 0.5
    assert np.all(err_lse[ok] <= -np.log1p(-plan.eta * rho[ok]) + 1e-12)
    half_range = ((v.max(0) - v.min(0)) / 2).max()
    r = plan.eta * rho[ok]
    assert np.all(err_avg[ok] <= 2 * half_range * r / (1 - r) + 1e-12)
    if gamma <= 9.0:  # moderate ρ: every row certified to a small multiple of tol
        assert finite.all() and lse_b.max() <= 200 * tol
        assert err_lse.max() <= 200 * tol and err_avg.max() <= 200 * tol * 3


def test_matches_exact_kernel_contract():
    """Same contract as exact.lse_average with q = γ a, k = b (m != n, e = 3)."""
    from transformer_pde.kernels.exact import lse_average

    a, b, v, bias = problem(500, 120, 3, True, seed=1)
    v = np.random.default_rng(2).standard_normal((500, 3))
    plan = plan_gaussian_sum(4.0, 1.0, 3, 1e-10)
    args = tuple(map(jnp.asarray, (a, b, v, bias)))
    avg, lse = fast_lse_average(*args, 4.0, plan)
    ref_avg, ref_lse = lse_average(4.0 * args[0], *args[1:])
    assert avg.shape == (120, 3) and lse.shape == (120,)
    np.testing.assert_allclose(avg, ref_avg, atol=1e-8)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-8)


def test_weights_split_and_removed_keys():
    """Splitting a particle in two halves changes nothing; -inf keys are ignored (wherever they
    sit, whatever their value), with no NaN; with every key removed, avg 0 and lse -inf."""
    a, b, v, bias = problem(201, 150, 2, False, seed=3)
    plan = plan_gaussian_sum(9.0, 1.0, 2, 1e-10)

    def run(b, v, bias):
        return fast_lse_average_with_info(*map(jnp.asarray, (a, b, v, bias)), 9.0, plan)

    # key 200 removed, sitting far outside the box with a huge value
    b[200], v[200], bias[200] = [50.0, -50.0], [1e6, -1e6], -np.inf
    avg, lse, _ = run(b, v, bias)
    ref_avg, ref_lse = dense_numpy(a, b[:200], v[:200], bias[:200], 9.0)
    np.testing.assert_allclose(avg, ref_avg, atol=1e-9)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-9)
    # key 200 becomes a copy of key 0, each with half of key 0's weight
    b2, v2, bias2 = b.copy(), v.copy(), bias.copy()
    b2[200], v2[200] = b[0], v[0]
    bias2[0] = bias2[200] = bias[0] - math.log(2)
    avg2, lse2, _ = run(b2, v2, bias2)
    np.testing.assert_allclose(avg2, avg, atol=1e-9)
    np.testing.assert_allclose(lse2, lse, atol=1e-9)
    # every key removed: average 0, lse -inf (the exact kernel's convention), bounds 0
    avg3, lse3, info3 = run(b2, v2, np.full(201, -np.inf))
    assert np.all(np.asarray(avg3) == 0) and np.all(np.asarray(lse3) == -np.inf)
    assert np.all(np.asarray(info3.lse_bound) == 0)


def test_far_query_is_flagged():
    """A query far from all mass (ρ huge) gets an infinite bound: the cue to fall back."""
    b = cloud(300, 2, 5) * 0.2 + np.array([0.7, 0.0])
    a = np.array([[-0.9, 0.0], [0.7, 0.0]])
    v = np.random.default_rng(6).standard_normal((300, 2))
    plan = plan_gaussian_sum(100.0, 1.0, 2, 1e-6)
    avg, lse, info = fast_lse_average_with_info(
        *map(jnp.asarray, (a, b, v, np.zeros(300))), 100.0, plan)
    assert isinstance(info, FastSumInfo)
    assert np.asarray(info.mass_ratio)[0] > 1e20 and np.isinf(np.asarray(info.lse_bound)[0])
    assert np.asarray(info.reliable(1e-4)).tolist() == [False, True]
    assert np.all(np.isfinite(avg)) and np.abs(np.asarray(avg)[0]).max() <= 3 * np.abs(v).max() + 1


@pytest.mark.slow
def test_float32():
    a, b, v, bias = (x.astype(np.float32) for x in problem(300, 200, 3, True, seed=7))
    plan = plan_gaussian_sum(9.0, 1.0, 3, 1e-5, dtype=jnp.float32)
    avg, lse, info = fast_lse_average_with_info(*map(jnp.asarray, (a, b, v, bias)),
                                                np.float32(9.0), plan)
    assert avg.dtype == jnp.float32 and lse.dtype == jnp.float32
    ref_avg, ref_lse = dense_numpy(*(x.astype(np.float64) for x in (a, b, v, bias)), 9.0)
    assert np.all(np.abs(np.asarray(lse, np.float64) - ref_lse) <= np.asarray(info.lse_bound))
    assert np.all(np.abs(np.asarray(avg, np.float64) - ref_avg).max(1)
                  <= np.asarray(info.avg_bound))
    assert np.asarray(info.lse_bound).max() < 1e-2
    with pytest.raises(ValueError, match="plan is for float32"):
        fast_lse_average(*map(jnp.asarray, problem(50, 50, 3, False, 0)), 9.0, plan)


# ------------------------------------------------------------------------------------------
# gradients against the dense JAX formula


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3])
def test_gradients_match_dense(k):
    a, b, v, bias = map(jnp.asarray, problem(200, 150, k, True, seed=11))
    gamma = jnp.asarray(9.0)
    plan = plan_gaussian_sum(9.0, 1.0, k, 1e-10)
    rng = np.random.default_rng(12)
    w_avg = jnp.asarray(rng.standard_normal((150, 2)))
    w_lse = jnp.asarray(rng.standard_normal(150))

    def loss(fn, *args):
        avg, lse = fn(*args)
        return jnp.sum(w_avg * avg) + jnp.sum(w_lse * lse)

    def fast(a, b, v, bias, gamma):
        return fast_lse_average(a, b, v, bias, gamma, plan)

    args = (a, b, v, bias, gamma)
    got = jax.jit(jax.grad(lambda *z: loss(fast, *z), argnums=range(5)))(*args)
    want = jax.grad(lambda *z: loss(dense_jax, *z), argnums=range(5))(*args)
    for name, g, w in zip("a b v bias gamma".split(), got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert np.all(np.isfinite(g)), name  # -inf biases give no NaN
        np.testing.assert_allclose(g, w, atol=1e-7 * np.abs(w).max(), err_msg=name)
    if k != 3:
        return
    # forward mode, along a random direction in (a, b)
    ta, tb = (jnp.asarray(rng.standard_normal(x.shape)) for x in (a, b))
    jf = jax.jvp(lambda a, b: fast(a, b, v, bias, gamma), (a, b), (ta, tb))[1]
    jd = jax.jvp(lambda a, b: dense_jax(a, b, v, bias, gamma), (a, b), (ta, tb))[1]
    for x, y in zip(jf, jd):
        np.testing.assert_allclose(x, y, atol=1e-7 * np.abs(y).max())


def test_gamma_window():
    """A plan for a window of γ holds for every γ in it; γ outside the window is refused."""
    plan = plan_gaussian_sum((4.0, 16.0), 1.0, 2, 1e-8)
    a, b, v, bias = problem(300, 100, 2, False, seed=13)
    for gamma in (4.0, 7.0, 16.0):
        avg, lse, info = fast_lse_average_with_info(*map(jnp.asarray, (a, b, v, bias)), gamma, plan)
        ref_avg, ref_lse = dense_numpy(a, b, v, bias, gamma)
        assert np.all(np.abs(np.asarray(lse) - ref_lse) <= np.asarray(info.lse_bound))
    with pytest.raises(ValueError, match="window"):
        fast_lse_average(*map(jnp.asarray, (a, b, v, bias)), 20.0, plan)
    with pytest.raises(Exception, match="window"):
        jax.jit(lambda g: fast_lse_average(*map(jnp.asarray, (a, b, v, bias)), g, plan))(20.0)


# ------------------------------------------------------------------------------------------
# the box, jit and vmap


def test_outside_box_raises():
    a, b, v, bias = map(jnp.asarray, problem(100, 100, 2, False, seed=17))
    plan = plan_gaussian_sum(9.0, 1.0, 2, 1e-8)
    out = b.at[7, 0].set(1.25)
    with pytest.raises(ValueError, match=r"b\[7\].*radius = 1.0"):
        fast_lse_average(a, out, v, bias, 9.0, plan)
    with pytest.raises(ValueError, match=r"query a\[7\].*radius = 1.0"):
        fast_lse_average(out, b, v, bias, 9.0, plan)
    with pytest.raises(Exception, match="radius = 1.0"):
        jax.jit(lambda b: fast_lse_average(a, b, v, bias, 9.0, plan))(out)
    info = fast_lse_average_with_info(a, out, v, bias, 9.0, plan, throw=False)[2]
    assert not bool(info.in_box) and not np.asarray(info.reliable(1.0)).any()


@pytest.mark.slow
def test_jit_and_vmap():
    plan = plan_gaussian_sum(9.0, 1.0, 3, 1e-10)
    states = np.stack([cloud(150, 3, s) for s in range(3)])
    bias = jnp.full((150,), -math.log(150))

    def field(x):
        return fast_lse_average(x, x, x, bias, 9.0, plan)

    eager = field(jnp.asarray(states[1]))
    batched = jax.jit(jax.vmap(field))(jnp.asarray(states))
    np.testing.assert_allclose(batched[0][1], eager[0], atol=1e-12)
    np.testing.assert_allclose(batched[1][1], eager[1], atol=1e-12)
    for i in range(3):
        ref = dense_numpy(states[i], states[i], states[i], np.asarray(bias), 9.0)
        np.testing.assert_allclose(batched[0][i], ref[0], atol=1e-8)
        np.testing.assert_allclose(batched[1][i], ref[1], atol=1e-8)
    # per-state gradients: vmap of grad
    def energy(x):
        return jnp.sum(fast_lse_average(x, x, x, bias, 9.0, plan)[1])

    def energy_dense(x):
        return jnp.sum(dense_jax(x, x, x, bias, 9.0)[1])

    grads = jax.jit(jax.vmap(jax.grad(energy)))(jnp.asarray(states))
    want = jax.vmap(jax.grad(energy_dense))(jnp.asarray(states))
    np.testing.assert_allclose(grads, want, atol=1e-7 * np.abs(want).max())
