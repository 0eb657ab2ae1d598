"""Bipodal metastability on S¹ (Menon–Murray): the escape rate λ = 2/(e^{2γ}+1) against the
Jacobian of the library's field and against the growth of the antipodality defect, and the
phase length C ln n + D fitted over seeds against C = 1/(2λ(max(a, b)))."""

import dataclasses

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.experiments import bipodal

meta = tp.theory.metastability


def _attention(a, b):
    return tp.Sphere(tp.SoftmaxAttention(jnp.eye(2), jnp.diag(jnp.asarray([a, b])), jnp.eye(2), 1.0))


@pytest.mark.parametrize("a, b, phi", [(0.7, 1.6, 0.3), (0.0, 2.0, np.pi / 2), (1.2, -0.5, 2.0)])
def test_escape_rate_is_the_one_positive_jacobian_eigenvalue(a, b, phi):
    """Three tokens at u, three at −u: the Jacobian of dθ/dt (by autodiff through tp's field)
    has one positive eigenvalue, λ(γ(φ)); the others are a zero (rotation) and negatives."""
    dyn = _attention(a, b)

    def angular(theta):
        x = jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=1)
        v = dyn.velocity(x, jnp.full(6, 1 / 6))
        return -jnp.sin(theta) * v[:, 0] + jnp.cos(theta) * v[:, 1]

    theta = jnp.asarray([phi] * 3 + [phi + np.pi] * 3)
    eig = np.sort(np.linalg.eigvals(np.asarray(jax.jacfwd(angular)(theta))).real)
    lam = meta.bipodal_escape_rate(meta.bipodal_gamma(a, b, phi))
    np.testing.assert_allclose(eig[-1], lam, rtol=1e-10)
    gamma = meta.bipodal_gamma(a, b, phi)
    if gamma > 0:  # the clusters are tight: every other mode is neutral or stable
        assert np.all(eig[:-1] < 1e-12)


def test_the_antipodality_defect_grows_at_the_predicted_rate():
    """Two tight clusters at ±e₂ (the dominant axis, γ = b) a small defect apart: ln|δ| grows
    with slope λ(b), measured by the experiment's own order parameter and fit."""
    a, b = 0.0, 2.0
    rng = np.random.default_rng(0)
    theta = np.concatenate([np.pi / 2 + 1e-3 * rng.normal(size=4), -np.pi / 2 + 2e-4 + 1e-3 * rng.normal(size=4)])
    x0 = jnp.asarray(np.stack([np.cos(theta), np.sin(theta)], axis=1))
    ts = jnp.linspace(0.0, 100.0, 201)
    sol = tp.solve(_attention(a, b), x0, t1=100.0, dt0=0.1,
                   stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12),
                   saveat=diffrax.SaveAt(ts=ts, fn=bipodal.order_parameters))
    stats = np.asarray(sol.stats)
    # the clusters tighten at rate tanh γ first; the defect then grows alone
    rate = bipodal.growth_rate(np.asarray(ts), stats, 20.0, 100.0)
    np.testing.assert_allclose(rate, meta.bipodal_escape_rate(b), rtol=1e-2)
    assert np.all(stats[:, 1] > 0.99)  # still bipodal at t = 100 (|δ| ~ 2e-4 e^{3.6})


def test_phase_detection_on_a_written_trace():
    ts = np.arange(6.0)
    stats = np.array([[0.1, 0.5, 0], [0.1, 0.97, 0], [0.2, 0.99, 0], [0.1, 0.9, 0], [1.0, 1.0, 0], [1.0, 1.0, 0]])
    assert bipodal.phase(ts, stats, 0.05) == (1.0, 3.0, False)
    assert bipodal.phase(ts[:3], stats[:3], 0.05) == (1.0, 2.0, True)
    start, end, _ = bipodal.phase(ts, stats[[0, 4, 5]], 0.05)  # straight to consensus: never bipodal
    assert np.isnan(start) and np.isnan(end)


def test_log_slope_is_half_the_inverse_rate_at_the_dominant_axis():
    assert meta.bipodal_log_slope(0.5, 2.0) == pytest.approx((np.exp(4.0) + 1) / 4, rel=1e-14)
    assert meta.bipodal_log_slope(2.0, 0.5) == meta.bipodal_log_slope(0.5, 2.0)
    with pytest.raises(ValueError, match="a ≠ b"):
        meta.bipodal_log_slope(1.0, 1.0)


@pytest.mark.slow
def test_bipodal_phase_length_follows_c_ln_n_plus_d():
    """n = 32 … 256, 10 seeds each: the fitted C within 35 % of 1/(2λ(b)) and inside its own
    bootstrap interval's reach, and the median defect growth rate within 15 % of λ (measured:
    C = 14.4 against 13.9 at n = 16 … 256 with 12 seeds; rate 0.0387 against 0.0360)."""
    cfg = bipodal.BipodalConfig(ns=(32, 64, 128, 256), seeds=10, t1=250.0, saves=1001)
    res = bipodal.compute(cfg)
    C, Cp = float(res["C"]), float(res["C_predicted"])
    assert abs(C - Cp) <= 0.35 * Cp
    lo, hi = res["C_ci"]
    assert lo - 0.1 * Cp <= Cp <= hi + 0.1 * Cp
    assert abs(float(res["rate_measured"]) / float(res["rate_predicted"]) - 1) <= 0.15
    assert not res["censored"].any()


def test_the_fast_kernel_gives_the_exact_kernels_phase():
    """n = 64 with the NUFFT kernel (fast_from = 4) against the exact kernel (fast_from above n),
    the same seeds: the order parameters agree to the plan's error grown by the dynamics (measured
    2e-8), and the detected phase (start, end, censored) is the same save for save (seed 0 is
    bipodal on [3, 56.75], seed 1 never)."""
    cfg = bipodal.BipodalConfig(ns=(16, 64), seeds=2, t1=100.0, saves=401, fast_tol=1e-9)
    ts = np.linspace(0.0, cfg.t1, cfg.saves)
    assert isinstance(bipodal.backend(dataclasses.replace(cfg, fast_from=4), 64), tp.kernels.Fast)
    assert isinstance(bipodal.backend(cfg, 64), tp.kernels.Exact)  # default fast_from = 2048
    fast, exact = (bipodal.run_size(dataclasses.replace(cfg, fast_from=f), 64) for f in (4, 10**6))
    np.testing.assert_allclose(fast[..., :2], exact[..., :2], atol=1e-6)
    for s in range(cfg.seeds):  # NaN (never bipodal) equals NaN here
        np.testing.assert_array_equal(bipodal.phase(ts, fast[s], cfg.eps), bipodal.phase(ts, exact[s], cfg.eps))


@pytest.mark.parametrize("bad, match", [(dict(fast_tol=0.0), "fast_tol"), (dict(fast_tol=-1e-3), "fast_tol"),
                                        (dict(fast_from=2), "fast_from"), (dict(a=2.0, b=1.0), "b > a")])
def test_bad_options_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        bipodal.BipodalConfig(**bad)
