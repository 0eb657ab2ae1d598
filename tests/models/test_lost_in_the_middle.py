"""Lost in the middle: the particle model (tp.LostInTheMiddle), its closed forms and mean field
(tp.theory.lost_in_the_middle) and the experiment (docs: math/causal.md#lost-in-the-middle)."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.theory import lost_in_the_middle


def test_bessel_matches_scipy():
    n = np.arange(0, 8)
    for beta in (0.3, 1.0, 5.0):
        np.testing.assert_allclose(np.asarray(lost_in_the_middle.bessel_i(jnp.asarray(n), jnp.asarray(beta))),
                                   scipy.special.iv(n, beta), rtol=1e-10, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("lam", [0.0, 1.0, 3.0])
def test_volterra_closed_form_solves_the_equation(lam):
    # direct solve (quadrature + matrix exponential, no Bessel function) vs the Bessel form
    a, t, s0 = 0.7, 1.8, 0.15
    s, g_num = lost_in_the_middle.volterra_numerical(a, t, s0, lam, num_points=101)
    g_cf = np.asarray(lost_in_the_middle.volterra_closed_form(a, t, s[1:], s0, lam))
    np.testing.assert_allclose(g_num[1:], g_cf, rtol=2e-4)  # trapezoid, h = 0.0085
    # right limit at σ0: at·k_λ(σ0, σ0)
    np.testing.assert_allclose(g_num[0], a * t * (lam / -np.expm1(-lam * s0) if lam else 1 / s0))
    # second order in the grid: halving h divides the error by ~4
    s2, g2 = lost_in_the_middle.volterra_numerical(a, t, s0, lam, num_points=201)
    e1 = np.abs(g_num[1:] - g_cf).max()
    e2 = np.abs(g2[1:] - np.asarray(lost_in_the_middle.volterra_closed_form(a, t, s2[1:], s0, lam))).max()
    assert 3.0 < e1 / e2 < 5.0


def test_kernel_integrates_to_one():
    sp = np.linspace(0, 0.7, 20001)
    for lam in (0.0, 2.0):
        k = np.asarray(lost_in_the_middle.litm_kernel(0.7, sp, lam))
        np.testing.assert_allclose(np.trapezoid(k[:-1], sp[:-1]) if lam == 0 else np.trapezoid(k, sp), 1.0,
                                   rtol=1e-3)


@pytest.mark.slow
def test_finite_n_linearization_converges_to_closed_form():
    errs = []
    for n in (48, 192):  # n_max = 5: a_n < 1e-3 beyond, and both sides use the same truncation
        s, Sd = lost_in_the_middle.retrieval_discrete(1.0, n, 1.0, 1.0, n_max=5)
        Sc = np.asarray(lost_in_the_middle.retrieval_profile(1.0, s, 1.0, 1.0, n_max=5))
        mid = s >= 0.25
        errs.append(np.abs(Sd[mid] / Sc[mid] - 1).max())
    assert errs[1] < 0.02 and errs[0] / errs[1] > 3  # O(1/N)


@pytest.mark.slow
def test_u_shape_under_smallness():
    t, beta, lam = 2.0, 1.0, 1.0
    assert lost_in_the_middle.smallness_holds(t, beta, lam)
    assert not lost_in_the_middle.smallness_holds(3.0, beta, lam)
    s = np.linspace(0.002, 0.998, 500)
    S = np.asarray(lost_in_the_middle.retrieval_profile(t, s, beta, lam))
    shape = lost_in_the_middle.u_shape(S)
    assert shape["primacy"] and shape["recency"] and shape["unique_min"]
    # primacy: S → ∞ as σ0 → 0
    assert float(lost_in_the_middle.retrieval_profile(t, 1e-6, beta, lam)) > 3 * S.min()


def test_litm_velocity_matches_numpy_loop():
    rng = np.random.default_rng(0)
    th = rng.uniform(0, 2 * np.pi, 9)
    beta, lam = 1.3, 0.7
    v = np.asarray(tp.LostInTheMiddle(beta, lam).velocity(th[:, None]))[:, 0]
    N = len(th)
    ref = np.zeros(N)
    for j in range(N):
        w = np.array([np.exp(-lam * (j - k) / N) for k in range(j)])
        f = np.array([-beta * np.sin(th[j] - th[k]) * np.exp(beta * np.cos(th[j] - th[k])) for k in range(j)])
        ref[j] = (w @ f) / w.sum() if j else 0.0
    np.testing.assert_allclose(v, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_experiment_lost_in_the_middle_tiny(tmp_path_factory):
    res, cfg, _ = tiny_run("lost-in-the-middle", tmp_path_factory)
    assert res["smallness"] and res["primacy"] and res["recency"] and res["unique_min"]
    # the published particle demo (sphere.md §10.6), reproduced exactly
    np.testing.assert_array_equal(res["demo_counts"], [39, 29, 22, 14, 1])
    assert float(res["demo_final_spread"]) < 0.01
    # Monte Carlo agrees with the finite-N linearization and the closed form (z-scores);
    # the closed form differs from the finite-N one by O(1/N), added to the tolerance
    assert np.all(np.abs(res["z_discrete"]) < 4)
    gap = np.abs(res["discrete_bin"] - res["closed_bin"])
    assert np.all(np.abs(res["mc_bin"] - res["closed_bin"]) < 4 * res["mc_bin_se"] + gap)
    # the finite-N linearization (matrix exponential, independent of the Bessel form) is
    # U-shaped too
    d = lost_in_the_middle.u_shape(res["discrete"])
    assert d["primacy"] and d["recency"] and d["unique_min"]


@pytest.mark.slow
def test_litm_mean_field_linear_response_and_invariants():
    S, M, beta, lam = 16, 32, 1.0, 1.0
    mf = lost_in_the_middle.LostInTheMiddleMeanField(beta, lam, S, M)
    uniform = jnp.full((S, M), 1 / (2 * jnp.pi))
    np.testing.assert_allclose(mf.rhs(0.0, uniform), 0.0, atol=1e-13)  # uniform is stationary
    # a small cos(nθ) bump in cell i0 propagates to later cells by expm(a_n t K) (Volterra)
    eps, i0, n, t = 1e-6, 3, 2, 1.0
    th = np.asarray(mf.theta)
    f0 = np.full((S, M), 1 / (2 * np.pi))
    f0[i0] += eps * np.cos(n * th) / np.pi
    f = np.asarray(mf.solve(jnp.asarray(f0), t)[-1])
    np.testing.assert_allclose(np.trapezoid(np.c_[f, f[:, :1]], np.r_[th, 2 * np.pi], axis=1), 1.0,
                               rtol=1e-10)  # mass per cell
    coef = (f - 1 / (2 * np.pi)) @ np.cos(n * th) * (2 / M) * np.pi / eps  # cos coefficient / initial
    import scipy.linalg

    K = np.asarray(tp.LostInTheMiddle(beta, lam).position_weights(S))
    a_n = n**2 * scipy.special.iv(n, beta)
    ref = scipy.linalg.expm(a_n * t * K)[:, i0]
    np.testing.assert_allclose(coef, ref, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_float32_velocity():
    th = jnp.linspace(0, 6, 8, dtype=jnp.float32)[:, None]
    w = tp.LostInTheMiddle(1.0, 1.0).velocity(th)
    assert w.dtype == jnp.float32 and float(w[0, 0]) == 0.0


def test_monte_carlo_runs_raise_what_solve_raises_after_the_program():
    """The Monte Carlo program returns each run's result code and blow-up time (throw=False, no host
    callback); the first failure is raised after it (tp.raise_if_failed), with diffrax's message
    or the blow-up time."""
    import diffrax
    import equinox as eqx
    import jax

    def codes(pred, other):  # a vmapped run's result codes
        return jax.vmap(lambda p: diffrax.RESULTS.where(p, diffrax.RESULTS.successful, other))(jnp.array(pred))

    ok = codes([True, False], diffrax.RESULTS.event_occurred)
    tp.raise_if_failed(ok, jnp.array([jnp.inf, jnp.inf]))  # success and a watch that found nothing
    steps = codes([True, False], diffrax.RESULTS.max_steps_reached)
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver steps"):
        tp.raise_if_failed(steps, jnp.array([jnp.inf, jnp.inf]))
    with pytest.raises(tp.NonFiniteStateError, match="lost-in-the-middle: .* at t = 0.25 in run 1 .*; lower dt"):
        tp.raise_if_failed(ok, jnp.array([jnp.inf, 0.25]), where="lost-in-the-middle", advice="lower dt")