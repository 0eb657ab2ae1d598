"""The pseudo-spectral Fokker–Planck solver on S² (sphere.md §12, §14): transforms against scipy,
growth rates against Funk–Hecke, the heat kernel, mass, the right-hand side against a plain
quadrature of the attention field, refinement, bad input."""

import json
import os
import subprocess
import sys

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import transformer_pde as tp
from transformer_pde.solvers import sphere_harmonics as sh
from transformer_pde.theory.noisy_sphere import NoisySA, NoisyUSA, funk_hecke

L = 6
TIGHT = diffrax.PIDController(rtol=1e-12, atol=1e-20)


def usa(beta, K=1.0, **kw):
    return tp.Sphere(tp.UnnormalizedAttention(jnp.eye(3), jnp.eye(3), K * jnp.eye(3), beta, **kw))


def sa(beta, K=1.0):
    return tp.Sphere(tp.SoftmaxAttention(jnp.eye(3), jnp.eye(3), K * jnp.eye(3), beta))


def uniform_plus(l, m, eps, degree=L):
    c = np.zeros((degree + 1, degree + 1), complex)
    c[0, 0] = 1.0
    c[l, m] += eps * (1 + 0.5j if m else 1)
    return c


def test_transform_round_trip_and_scipy_harmonics():
    rng = np.random.default_rng(0)
    T = sh.SphereTransform(32)
    c = np.tril(rng.normal(size=(33, 33)) + 1j * rng.normal(size=(33, 33)))
    c[:, 0] = c[:, 0].real
    np.testing.assert_allclose(T.analysis(T.synthesis(jnp.asarray(c))), c, rtol=0, atol=1e-12)
    # Y_lm(x) = p_l^m(cos ϑ) e^{imφ}, orthonormal against the uniform probability: scipy's without
    # the Condon–Shortley phase, times sqrt(4π)
    x = rng.normal(size=(7, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = rng.random(7)
    got = np.asarray(sh.empirical_coefficients(jnp.asarray(x), 5, jnp.asarray(w), chunk=3))
    th, ph = np.arccos(x[:, 2]), np.arctan2(x[:, 1], x[:, 0])
    for l in range(6):
        for m in range(l + 1):
            Y = special.sph_harm_y(l, m, th, ph) * np.sqrt(4 * np.pi) * (-1) ** m
            assert abs(np.sum(w * np.conj(Y)) - got[l, m]) < 1e-12, (l, m)
    assert np.all(got[np.triu_indices(6, 1)] == 0)
    # a grid density's coefficients: e^{κu} has c_l0 = funk_hecke(l, κ, 3)·sqrt(2l+1) (Funk–Hecke at the pole)
    nlat, nlon = sh.grid_shape(24)
    vals = np.exp(2.0 * sh.grid_points(nlat, nlon)[..., 2])
    c = np.asarray(sh.grid_coefficients(jnp.asarray(vals), 8))
    np.testing.assert_allclose(c[:, 0].real, funk_hecke(np.arange(9), 2.0, 3) * np.sqrt(2 * np.arange(9) + 1),
                               rtol=0, atol=1e-13)
    # a degree-16 density shown on the degree-6 grid (what solve_density compares): its values there
    f = lambda x: np.exp(0.7 * x[..., 0] - 0.4 * x[..., 1] + 0.2 * x[..., 2])  # noqa: E731
    fine, coarse = tp.SphereDensity(f, degree=16), tp.SphereDensity(uniform_plus(0, 0, 0.0))
    got = np.asarray(fine.grid_values(fine.coefficients[None], coarse))[0]
    ref = f(coarse.points)
    np.testing.assert_allclose(got / np.mean(got), ref / np.mean(ref), rtol=1e-12)


def test_negative_sobolev_of_a_dirac_and_of_a_sample():
    # a Dirac at the north pole against σ: μ̂_l0 = sqrt(2l+1) (the rest 0), so the square is
    # Σ_{1<=l<=L} (2l+1)(1 + l(l+1))^{-s}, written plainly; a sample's square has mean ≈ that /n
    L, s = 6, 2.0
    dirac = sh.empirical_coefficients(jnp.asarray([[0.0, 0.0, 1.0]]), L)
    uniform = jnp.zeros((L + 1, L + 1), complex).at[0, 0].set(1.0)
    ref = sum((2 * l + 1) * (1 + l * (l + 1)) ** -s for l in range(1, L + 1))
    assert float(sh.negative_sobolev(dirac, uniform, s)) ** 2 == pytest.approx(ref, rel=1e-12)
    x = jax.random.normal(jax.random.key(0), (32, 2000, 3))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    d2 = np.asarray(jax.vmap(lambda p: sh.negative_sobolev(sh.empirical_coefficients(p, L), uniform, s))(x)) ** 2
    assert np.mean(d2) * 2000 == pytest.approx(ref, rel=0.25)  # 32 samples: ~9 % standard error


@pytest.mark.parametrize("model,dyn", [(NoisyUSA, usa), (NoisySA, sa)], ids=["USA", "SA"])
def test_linear_growth_rates_match_funk_hecke(model, dyn):
    # the right-hand side linearized at the uniform law (a jvp, no time stepping): Y_lm is an
    # eigenvector with λ_l = l(l+1)(K g_l − σ²/2), every l <= 4, every m, both parts, to 1e-6
    beta, K = 2.0, 1.5
    for sigma in (0.0, 0.8):
        th = model(beta=beta, d=3, sigma=sigma)
        u = tp.SphereDensity(uniform_plus(0, 0, 0.0), sigma).prepare(dyn(beta, K))
        jvp = eqx.filter_jit(lambda u, e: jax.jvp(lambda y: u.vector_field(None, 0.0, y), (u.y,), (e,))[1])
        for l in range(1, 5):
            for m in range(l + 1):
                for part in (0, 1) if m else (0,):
                    e = jnp.zeros_like(u.y).at[part, l, m].set(1.0)
                    Je = jvp(u, e)
                    assert float(Je[part, l, m]) == pytest.approx(th.growth_rate(l, K), abs=1e-6), (sigma, l, m)
                    assert float(jnp.max(jnp.abs(Je.at[part, l, m].set(0.0)))) < 1e-10


def test_growth_heat_kernel_and_mass_by_time_stepping():
    # one compiled solve (USA, degree 6): (a) ρ0 = 1 + εY_lm grows at λ_l (noiseless and noisy,
    # to 1e-6); (b) K = 0: the heat equation, degree l decays as e^{−σ²l(l+1)t/2} (l = 1:
    # E⟨X_t, X_0⟩ = e^{−(d−1)σ²t/2}); (c) the mass stays 1 to round-off
    beta, K, eps, (t1, t2) = 2.0, 1.5, 1e-7, (0.1, 0.2)
    for sigma in (0.0, 0.8):
        th = NoisyUSA(beta=beta, d=3, sigma=sigma)
        for l in (1, 3):
            sol = tp.solve(usa(beta, K), tp.SphereDensity(uniform_plus(l, 1, eps), sigma), t1=t2,
                           saveat=jnp.array([t1, t2]), stepsize_controller=TIGHT)
            C = np.asarray(sol.xs)
            a = np.hypot(C[:, 0, l, 1], C[:, 1, l, 1])
            assert np.log(a[1] / a[0]) / (t2 - t1) == pytest.approx(th.growth_rate(l, K), abs=1e-6), (sigma, l)
    sigma, ts = 0.7, np.array([0.1, 0.2])
    rho0 = tp.SphereDensity(lambda x: np.exp(0.5 * x[..., 0] + 0.3 * x[..., 2] ** 3), sigma, degree=L)
    sol = tp.solve(usa(beta, 0.0), rho0, t1=0.2, saveat=jnp.asarray(ts), stepsize_controller=TIGHT)
    C0, C = np.asarray(rho0.coefficients), np.asarray(sol.xs)
    for l in range(1, L + 1):
        np.testing.assert_allclose(C[:, :, l], np.exp(-sigma**2 * l * (l + 1) * ts / 2)[:, None, None] * C0[None, :, l],
                                   rtol=1e-8, atol=1e-13)
    np.testing.assert_allclose(C[:, 0, 0, 0], 1.0, rtol=0, atol=1e-14)
    corr = np.asarray(rho0.order_parameter(sol.xs)) / float(rho0.order_parameter(rho0.coefficients))
    np.testing.assert_allclose(corr, np.exp(-sigma**2 * ts), rtol=1e-8)


@pytest.mark.parametrize("normalized", [False, True], ids=["USA", "SA"])
def test_right_hand_side_against_plain_quadrature(normalized):
    # d/dt ∫fρ dσ = ∫⟨∇f, Γ_ρ⟩ρ dσ (σ = 0, weak form) with Γ the projected attention field written
    # plainly, k·P⊥∫e^{a⟨x,y⟩} y ρ(y)dσ(y) (÷ ∫e^{a⟨x,y⟩}ρ dσ for SA), both integrals by Gauss
    # quadrature on a fine grid; f = ⟨b, x⟩ + xᵀBx
    a, k, degree = 1.7, 0.6, 8
    attn = (tp.SoftmaxAttention if normalized else tp.UnnormalizedAttention)(np.eye(3), np.eye(3), k * np.eye(3), a)
    rho0 = tp.SphereDensity(lambda x: np.exp(0.8 * x[..., 0] - 0.5 * x[..., 1] * x[..., 2] + 0.3 * x[..., 2]), 0.0,
                            degree=degree)
    state = rho0.prepare(tp.Sphere(attn))
    rate = state.grid_values(eqx.filter_jit(lambda s: s.vector_field(None, 0.0, s.y))(state)[None], state)[0]
    x = rho0.points.reshape(-1, 3)
    nlat, nlon = rho0.transform.nlat, rho0.transform.nlon
    wq = np.repeat(np.polynomial.legendre.leggauss(nlat)[1] / 2, nlon) / nlon
    # the density on a finer grid (its coefficients synthesized there) for the field's integral
    T = sh.SphereTransform(degree, 40, 80)
    y = sh.grid_points(40, 80).reshape(-1, 3)
    wy = np.repeat(np.polynomial.legendre.leggauss(40)[1] / 2, 80) / 80
    rho_y = np.asarray(T.synthesis(jax.lax.complex(rho0.coefficients[0], rho0.coefficients[1]))).reshape(-1)
    E = np.exp(a * x @ y.T) * (wy * rho_y)[None]
    F = k * (E @ y)
    if normalized:
        F = F / E.sum(1, keepdims=True)
    F = F - np.sum(F * x, 1, keepdims=True) * x
    rho_x = np.asarray(rho0.grid_values(rho0.coefficients[None], rho0))[0].reshape(-1)
    rng = np.random.default_rng(1)
    for _ in range(3):
        b, B = rng.normal(size=3), rng.normal(size=(3, 3))
        B = B + B.T
        f = x @ b + np.einsum("ni,ij,nj->n", x, B, x)
        grad = b[None] + 2 * x @ B
        ref = np.sum(wq * rho_x * np.sum(grad * F, 1))
        got = np.sum(wq * f * np.asarray(rate).reshape(-1))
        assert got == pytest.approx(ref, rel=1e-10, abs=1e-12)


def test_bad_input():
    with pytest.raises(ValueError, match=r"the density must be positive, got -?\d.* at x = \["):
        tp.SphereDensity(lambda x: x[..., 2] + 0.5, 0.1, degree=4)
    with pytest.raises(ValueError, match="density at degree 4 must be positive"):
        tp.SphereDensity(uniform_plus(1, 0, 2.0, degree=4))
    with pytest.raises(ValueError, match="mass 0: it is not normalizable"):
        tp.SphereDensity(np.zeros((5, 5)))
    with pytest.raises(ValueError, match="sigma"):
        tp.SphereDensity(uniform_plus(0, 0, 0.0), -1.0)
    with pytest.raises(ValueError, match="needs degree="):
        tp.SphereDensity(lambda x: 1 + 0 * x[..., 0])
    with pytest.raises(ValueError, match="m > l must be 0"):
        tp.SphereDensity(uniform_plus(0, 0, 0.0) + np.triu(np.ones((L + 1, L + 1)), 1))
    rho = tp.SphereDensity(uniform_plus(1, 0, 0.1), 0.5)
    with pytest.raises(ValueError, match=r"degree 6 is too low for beta = 40: .* use degree >= 24"):
        tp.solve(usa(40.0), rho, t1=0.1)
    with pytest.raises(ValueError, match="d = 3"):
        tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(2)), rho, t1=0.1)
    with pytest.raises(ValueError, match=r"V = c·I"):
        tp.solve(tp.Sphere(tp.SoftmaxAttention(np.eye(3), np.eye(3), np.diag([1.0, 2.0, 1.0]))), rho, t1=0.1)
    with pytest.raises(ValueError, match="Sphere"):
        tp.solve(tp.SoftmaxAttention.identity(3), rho, t1=0.1)
    with pytest.raises(ValueError, match="must be concrete"):
        jax.jit(lambda b: tp.solve(usa(b), rho, t1=0.1).xs)(1.0)


@pytest.mark.slow
def test_solve_density_reports_both_errors():
    # SA from a smooth bump, degree 12 (degree 8 is refused: 1.5e-5 from degree 16): resolved, mass
    # exact; the error estimate (spatial + time) is within a factor 2..100 of the error against a
    # reference at degree 24 with tight steps
    rho0 = tp.SphereDensity(lambda x: np.exp(x[..., 2] + 0.5 * x[..., 0]), 0.3, degree=12)
    sol = tp.solve_density(sa(3.0), rho0, t1=0.5)
    assert sol.resolved and sol.mass_error < 1e-13 and sol.min_density > 0
    ref = tp.solve(sa(3.0), rho0.refined(), t1=0.5, stepsize_controller=diffrax.PIDController(rtol=1e-11, atol=1e-13))
    true = float(jnp.max(jnp.abs(sol.densities - rho0.refined().grid_values(ref.xs, rho0))))
    assert true / 2 <= sol.resolution_error <= 100 * true
    assert sol.resolution_error == sol.spatial_error + sol.time_error
    assert sol.time_error > 0 and sol.spatial_error > 0
    with pytest.raises(tp.solvers.UnderResolvedError, match="tol=1e-12"):
        tp.solve_density(sa(3.0), rho0, t1=0.5, tol=1e-12)


_FLOAT32_RUN = """
import json, sys, numpy as np, transformer_pde as tp
sa = tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0))
rho0 = tp.SphereDensity(lambda x: np.exp(0.5 * x[..., 2]), 0.4, degree=8)
sol = tp.solve_density(sa, rho0, t1=0.5)
json.dump(dict(dtype=str(sol.densities.dtype), resolved=sol.resolved, tol=sol.tol,
               densities=np.asarray(sol.densities, np.float64).tolist()), sys.stdout)
"""


@pytest.mark.slow  # a fresh process compiles the solver three times
def test_sphere_density_in_float32():
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", _FLOAT32_RUN], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    ref = tp.solve_density(tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0)),
                           tp.SphereDensity(lambda x: np.exp(0.5 * x[..., 2]), 0.4, degree=8), t1=0.5)
    assert got["dtype"] == "float32" and got["resolved"] and ref.resolved
    np.testing.assert_allclose(np.asarray(got["densities"]), np.asarray(ref.densities), rtol=0, atol=got["tol"])
