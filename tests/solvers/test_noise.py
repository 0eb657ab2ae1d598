"""Independent noise on every token (sphere.md §12): tp.Noise with tp.solve and tp.layers.

Checked against independent facts: the degree-1 and degree-2 heat-kernel identities on S²
(E⟨X_t, X_0⟩ = e^{-(d-1)σ²t/2}, E[X Xᵀ] - I/d decaying as e^{-dσ²t}), the law of an
Ornstein–Uhlenbeck process (one token: softmax attention to itself is Vx), the strong and weak
orders of the solvers, the moment ODE Σ' += σ²I, finite differences on a fixed Brownian path.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.kernels import Fast


class Still(tp.models.AbstractDynamics):
    """Γ = 0: the tokens move by their noise alone (independent Brownian motions)."""

    d: int = eqx.field(static=True)

    @property
    def dim(self):
        return self.d

    def vector_field(self, x, weights, t):
        return jnp.zeros_like(x)


E3 = jnp.asarray([0.0, 0.0, 1.0])


def order(hs, errs):
    return float(np.polyfit(np.log(hs), np.log(errs), 1)[0])


def at_pole(n):
    return jnp.tile(E3, (n, 1))


# ---------------------------------------------------------------------------- the sphere


def _euler_heat_kernel(h, t=1.0):
    """E⟨X_t, X_0⟩ of the Euler scheme x ← N(x + P⊥ΔB) on S² (σ = 1), by quadrature: by isotropy
    every step multiplies it by E[(1 + |P⊥ΔB|²)^{-1/2}] = ∫ e^{-u}(1 + 2hu)^{-1/2} du (|P⊥ΔB|² ~ h·χ²₂)."""
    from scipy.integrate import quad

    rho = quad(lambda u: np.exp(-u) / np.sqrt(1 + 2 * h * u), 0, np.inf)[0]
    return rho ** (t / h)


@pytest.mark.slow
def test_heat_kernel_weak_order_sphere():
    """Brownian motion on S² (Γ = 0, σ = 1): E⟨X_t, X_0⟩ = e^{-(d-1)σ²t/2} = e^{-1} at t = 1. Over
    20 000 independent tokens (Monte Carlo error ~ 0.004) the Euler scheme (the noisy layer
    x ← N(x + σP⊥ΔB)) has the weak error of its one-step law (quadrature, independent of the
    solver: 0.084, 0.048, 0.026 at h = 1/8, 1/16, 1/32) and weak order → 1 (0.71, 0.81, 0.88
    between successive h: pre-asymptotic)."""
    n, dyn, x0 = 20_000, tp.Sphere(Still(3)), at_pole(20_000)
    exact = np.exp(-1.0)
    hs = [1 / 8, 1 / 16, 1 / 32]
    errs = []
    for h in hs:
        sol = tp.solve(dyn, x0, t1=1.0, dt0=h, noise=tp.Noise(1.0), key=jax.random.key(0), max_steps=64)
        mean = float(jnp.mean(sol.xs[-1] @ E3))
        assert abs(mean - _euler_heat_kernel(h)) < 0.012, (h, mean, _euler_heat_kernel(h))
        errs.append(abs(mean - exact))
    p = order(hs, errs)
    assert 0.6 < p < 1.2, (errs, p)


@pytest.mark.slow
def test_degree_two_mode_and_time_dependent_sigma():
    """Heat kernels of degree 1 and 2 on S² with σ(t) = 0.5 + 0.5t (∫_0^1 σ² = 7/12), Heun:
    E X_3 = e^{-∫σ²}, E[X_3²] - 1/3 = (2/3) e^{-3∫σ²} (eigenvalues l(l+d-2) = 2, 6 of -Δ, times
    σ²/2). The weak error is O(h) (measured 0.017, 0.011 at h = 1/32, 1/64 for degree 1, as for
    Euler and EulerHeun); its Richardson extrapolation 2E(h/2) - E(h) is within the sampling
    error (~0.007) of the identity."""
    sigma = lambda t: 0.5 + 0.5 * t  # noqa: E731
    n, s2 = 20_000, 7 / 12
    moments = []
    for h in (1 / 32, 1 / 64):
        sol = tp.solve(tp.Sphere(Still(3)), at_pole(n), t1=1.0, dt0=h, solver=diffrax.Heun(),
                       noise=tp.Noise(sigma), key=jax.random.key(2), max_steps=64)
        x = sol.xs[-1]
        np.testing.assert_allclose(jnp.linalg.norm(x, axis=-1), 1.0, atol=1e-12)
        moments.append(np.asarray([jnp.mean(x @ E3), jnp.mean(x[:, 2] ** 2)]))
    exact = np.asarray([np.exp(-s2), 1 / 3 + (2 / 3) * np.exp(-3 * s2)])
    assert np.all(np.abs(moments[1] - exact) < 0.02), moments
    assert np.all(np.abs(2 * moments[1] - moments[0] - exact) < 0.015), moments


def test_heun_with_increments_on_the_sphere():
    """Heun driven by one draw per step (``BrownianIncrements``, whose default adjoint is
    DirectAdjoint) on S²: E⟨X_1, X_0⟩ = e^{-1} (σ = 1, degree-1 heat kernel). Its Richardson
    extrapolation 2E(h/2) - E(h) over 20 000 tokens is within the sampling error (~0.007)."""
    n = 20_000
    means = []
    for h in (1 / 16, 1 / 32):
        sol = tp.solve(tp.Sphere(Still(3)), at_pole(n), t1=1.0, dt0=h, solver=diffrax.Heun(),
                       noise=tp.Noise(1.0, path=tp.BrownianIncrements()), key=jax.random.key(3))
        x = sol.xs[-1]
        np.testing.assert_allclose(jnp.linalg.norm(x, axis=-1), 1.0, atol=1e-12)
        means.append(float(jnp.mean(x @ E3)))
    assert abs(means[1] - np.exp(-1.0)) < 0.04, means
    assert abs(2 * means[1] - means[0] - np.exp(-1.0)) < 0.025, means


@pytest.mark.slow
def test_strong_order_sphere():
    """Strong order ½ of Euler on S² (the noise σP⊥_x dB does not commute) against a fine solution
    on the same Brownian path (the same key: one virtual Brownian tree), interacting tokens."""
    attn = tp.SoftmaxAttention.identity(3, 2.0)
    dyn = tp.Sphere(attn)
    x0 = tp.uniform_sphere(jax.random.key(3), 64, 3)
    run = lambda h: tp.solve(dyn, x0, t1=1.0, dt0=h, noise=tp.Noise(0.8, path=tp.BrownianTree(tol=2**-14)),  # noqa: E731
                             key=jax.random.key(4), max_steps=2048).xs[-1]
    ref = run(2.0**-10)
    hs = [2.0**-3, 2.0**-4, 2.0**-5, 2.0**-6]
    errs = [float(jnp.sqrt(jnp.mean(jnp.sum((run(h) - ref) ** 2, axis=-1)))) for h in hs]
    p = order(hs, errs)
    assert 0.35 < p < 0.75, (errs, p)


def test_noisy_layers_are_the_spherical_brownian_motion():
    """tp.layers with noise is x ← N(x + hΓ + σ√h ξ): on S² (the tangent part of ξ) and with
    Post-LN (the full ξ, the normalization removing its radial part) the heat kernel
    E⟨X_t, X_0⟩ = e^{-σ²t} holds to O(h) + sampling error."""
    n, h = 20_000, 1 / 64
    for dyn in (tp.Sphere(Still(3)), tp.PostLN(Still(3))):
        sol = tp.layers(dyn, at_pole(n), 64, h, noise=tp.Noise(1.0), key=jax.random.key(5), save_every=64)
        assert abs(float(jnp.mean(sol.xs[-1] @ E3)) - np.exp(-1.0)) < 0.02
        np.testing.assert_allclose(jnp.linalg.norm(sol.xs[-1], axis=-1), 1.0, atol=1e-12)


@pytest.mark.slow
def test_uniform_law_stays_uniform_fast_kernel():
    """Softmax attention on S² through the fast kernel, with noise strong enough that the uniform
    law is stable: mean and second moments of 2000 tokens stay those of the uniform law
    (E X = 0, E XXᵀ = I/3) within the sampling error."""
    n = 2000
    attn = tp.SoftmaxAttention.identity(3, 1.0, backend=Fast(tol=1e-10))
    x0 = tp.uniform_sphere(jax.random.key(6), n, 3)
    sol = tp.solve(tp.Sphere(attn), x0, t1=1.0, dt0=0.1, noise=tp.Noise(1.5), key=jax.random.key(7))
    x = sol.xs[-1]
    assert float(jnp.max(jnp.abs(jnp.mean(x, axis=0)))) < 4 / np.sqrt(3 * n)
    assert float(jnp.max(jnp.abs(x.T @ x / n - jnp.eye(3) / 3))) < 4 / np.sqrt(n)


@pytest.mark.slow  # ~10 s on a quiet machine (compiles several solves)
def test_fast_and_random_batch_follow_the_same_path():
    """The noise does not depend on how the field is computed: on one Brownian path, the fast
    kernel agrees with the exact one to its tolerance, and random batches of the whole system
    (batch_size = n) are the exact field."""
    n = 24
    x0 = tp.uniform_sphere(jax.random.key(8), n, 3)
    exact = tp.SoftmaxAttention.identity(3, 2.0)
    kw = dict(t1=0.5, dt0=0.05, noise=tp.Noise(0.7), key=jax.random.key(9))
    ref = tp.solve(tp.Sphere(exact), x0, **kw).xs[-1]
    fast = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0, backend=Fast(tol=1e-11))), x0, **kw).xs[-1]
    assert float(jnp.max(jnp.abs(fast - ref))) < 1e-8
    rbm = tp.Sphere(tp.RandomBatch(exact, batch_size=n, step=0.05, key=jax.random.key(10)))
    assert float(jnp.max(jnp.abs(tp.solve(rbm, x0, **kw).xs[-1] - ref))) < 1e-12
    small = tp.Sphere(tp.RandomBatch(exact, batch_size=4, step=0.05, key=jax.random.key(10)))
    xs = tp.solve(small, x0, **kw).xs[-1]
    np.testing.assert_allclose(jnp.linalg.norm(xs, axis=-1), 1.0, atol=1e-12)
    assert 0 < float(jnp.max(jnp.abs(xs - ref))) < 1.0


# ---------------------------------------------------------------------------- R^d


@pytest.mark.slow  # ~10 s on a quiet machine (compiles several solves)
def test_strong_order_additive_noise():
    """Additive noise in R²: Euler has strong order 1 and ShARK 1.5 (Lévy area from the tree),
    against a fine ShARK solution on the same path."""
    attn = tp.SoftmaxAttention(jnp.eye(2), jnp.eye(2), -0.5 * jnp.eye(2), 1.0)
    x0 = jax.random.normal(jax.random.key(11), (8, 2))
    noise = tp.Noise(0.5, path=tp.BrownianTree(tol=2**-13))

    def run(h, solver):
        return tp.solve(attn, x0, t1=1.0, dt0=h, solver=solver, noise=noise, key=jax.random.key(12),
                        max_steps=1024).xs[-1]

    hs = [2.0**-2, 2.0**-3, 2.0**-4, 2.0**-5]
    # the SRK solvers draw a tree with space-time Lévy area: each is compared on its own path
    for solver, lo, hi in ((diffrax.Euler(), 0.8, 1.25), (diffrax.ShARK(), 1.25, 1.9)):
        ref = run(2.0**-9, solver)
        errs = [float(jnp.sqrt(jnp.mean((run(h, solver) - ref) ** 2))) for h in hs]
        p = order(hs, errs)
        assert lo < p < hi, (type(solver).__name__, errs, p)


@pytest.mark.slow
def test_weak_order_ornstein_uhlenbeck():
    """One token: softmax attention to itself is Γ(x) = Vx, so dX = VX dt + σdB (V = -I) is an
    Ornstein–Uhlenbeck process: E|X_1|² = e^{-2}|x0|² + d σ²(1 - e^{-2})/2. Euler's weak order 1
    over 20 000 paths (vmap over keys)."""
    d, sigma = 2, 1.0
    attn = tp.SoftmaxAttention(jnp.eye(d), jnp.eye(d), -jnp.eye(d), 1.0)
    x0 = jnp.asarray([[1.0, 0.5]])
    exact = np.exp(-2) * 1.25 + d * sigma**2 * (1 - np.exp(-2)) / 2
    keys = jax.random.split(jax.random.key(13), 20_000)

    @jax.jit
    def second_moment(h):
        run = lambda k: tp.solve(attn, x0, t1=1.0, dt0=h, noise=tp.Noise(sigma), key=k,  # noqa: E731
                                 max_steps=16, event=None).xs[-1, 0]
        return jnp.mean(jnp.sum(jax.vmap(run)(keys) ** 2, axis=-1))

    hs = [1 / 2, 1 / 4, 1 / 8]
    errs = [abs(float(second_moment(h)) - exact) for h in hs]
    p = order(hs, errs)
    assert 0.7 < p < 1.3, (errs, p)


@pytest.mark.slow  # ~10 s on a quiet machine (compiles several solves)
def test_gaussian_closure_under_noise():
    """A Gaussian under isotropic additive noise: Σ' = JΣ + ΣJᵀ + σ²I. At β = 0 the field is the
    mean (J = 0, c = α): α(t) = e^t α0, Σ(t) = Σ0 + σ²t I (closed form). At β = 0.5, tracers of
    the noisy Gaussian, each with its own noise, are i.i.d. samples of the McKean–Vlasov law: their
    moments agree with the closure's at the sampling error (4000 tracers, Heun h = 1/40, the same
    step for the carrier's moment ODE)."""
    g0 = tp.Gaussian(jnp.asarray([0.3, -0.2]), jnp.asarray([[1.0, 0.2], [0.2, 0.5]]))
    sol = tp.solve(tp.SoftmaxAttention.identity(2, 0.0), g0, t1=1.0, dt0=0.05, noise=tp.Noise(0.6))
    np.testing.assert_allclose(sol.means[-1], np.e * g0.mean, rtol=1e-6)
    np.testing.assert_allclose(sol.covs[-1], g0.cov + 0.36 * np.eye(2), atol=1e-10)
    attn = tp.SoftmaxAttention.identity(2, 0.5)
    n, h = 4000, 1 / 40
    tracers = tp.Tracers(g0, g0.sample(jax.random.key(14), n))
    (means, covs), z = tp.solve(attn, tracers, t1=0.5, dt0=h, solver=diffrax.Heun(),
                                   noise=tp.Noise(0.6), key=jax.random.key(15)).xs
    ref = tp.solve(attn, g0, t1=0.5, dt0=0.05, noise=tp.Noise(0.6))
    np.testing.assert_allclose(covs[-1], ref.covs[-1], rtol=2e-3)  # the carrier: Heun vs Tsit5
    z = np.asarray(z[-1])
    np.testing.assert_allclose(z.mean(axis=0), means[-1], atol=4 * np.sqrt(2.6 / n))
    np.testing.assert_allclose(np.cov(z.T), covs[-1], atol=4 * 2.6 * np.sqrt(2 / n))


# ---------------------------------------------------------------------------- runs, gradients


@pytest.mark.slow
def test_reproducible_and_chunked():
    """Same key, same path (bitwise); another key, another path; a run chunked by the runs layer
    follows the unchunked run's path (one Brownian tree over [t0, t1])."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    x0 = tp.uniform_sphere(jax.random.key(16), 12, 3)
    ts = jnp.linspace(0, 1, 9)[1:]
    kw = dict(t1=1.0, dt0=1 / 32, saveat=ts, noise=tp.Noise(0.5))
    a = tp.solve(dyn, x0, key=jax.random.key(17), **kw).xs
    b = tp.solve(dyn, x0, key=jax.random.key(17), **kw).xs
    c = tp.solve(dyn, x0, key=jax.random.key(18), **kw).xs
    assert bool(jnp.all(a == b)) and float(jnp.max(jnp.abs(a - c))) > 1e-2
    chunked = tp.runs.solve_checkpointed(dyn, x0, every=3, key=jax.random.key(17), **kw).xs
    assert float(jnp.max(jnp.abs(chunked - a))) < 1e-12
    # one draw per step: reproducible for a key and a step grid, a different path from the tree's
    kw["noise"] = tp.Noise(0.5, path=tp.BrownianIncrements())
    d = tp.solve(dyn, x0, key=jax.random.key(17), **kw).xs
    assert bool(jnp.all(d == tp.solve(dyn, x0, key=jax.random.key(17), **kw).xs))
    assert float(jnp.max(jnp.abs(d - a))) > 1e-2


@pytest.mark.slow  # ~10 s on a quiet machine (compiles several solves)
def test_gradient_matches_finite_differences():
    """d/dβ of a statistic of a noisy run on a fixed Brownian path: jax.grad (through the
    Brownian tree, recursive checkpointing) against central differences."""
    x0 = tp.uniform_sphere(jax.random.key(19), 6, 3)

    @jax.jit
    def loss(beta):
        sol = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, beta)), x0, t1=1.0, dt0=0.1,
                       solver=diffrax.Heun(), noise=tp.Noise(0.5), key=jax.random.key(20))
        return jnp.sum(jnp.mean(sol.xs[-1], axis=0) ** 2)

    g = float(jax.grad(loss)(1.0))
    eps = 1e-5
    fd = (float(loss(1.0 + eps)) - float(loss(1.0 - eps))) / (2 * eps)
    assert np.isfinite(g) and abs(g - fd) < 1e-6 * max(1.0, abs(fd)), (g, fd)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.slow
def test_bad_input():
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    x0 = tp.uniform_sphere(jax.random.key(21), 5, 3)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="-0.5"):
        tp.Noise(-0.5)
    with pytest.raises(ValueError, match="nan"):
        tp.Noise(float("nan"))
    with pytest.raises(ValueError, match=r"sigma\(t=0\) = -1"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, noise=tp.Noise(lambda t: t - 1.0), key=key)
    with pytest.raises(ValueError, match="PRNG key"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, noise=tp.Noise(0.5))
    with pytest.raises(ValueError, match="noise=tp.Noise"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, key=key)
    with pytest.raises(ValueError, match="Tsit5"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, solver=diffrax.Tsit5(), noise=tp.Noise(0.5), key=key)
    with pytest.raises(ValueError, match="ShARK is for additive noise only"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, solver=diffrax.ShARK(), noise=tp.Noise(0.5), key=key)
    with pytest.raises(ValueError, match="Euler does not converge with adaptive"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-3),
                 noise=tp.Noise(0.5), key=key)
    with pytest.raises(ValueError, match="ODEState cannot take noise"):
        tp.solve(_Decay(), jnp.ones(2), t1=1.0, dt0=0.1,
                 noise=tp.Noise(0.5), key=key)
    with pytest.raises(ValueError, match="cannot serve adaptive steps"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, solver=diffrax.Heun(), noise=tp.Noise(0.5, path=tp.BrownianIncrements()),
                 stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-3), key=key)
    with pytest.raises(ValueError, match="BrownianTree.tol must be > 0, got -1"):
        tp.BrownianTree(tol=-1.0)
    with pytest.raises(ValueError, match="PRNG key"):
        tp.layers(dyn, x0, 4, 0.1, noise=tp.Noise(0.5))
    # a negative σ(t) met along the run (not at t0), and a traced negative σ, under jit
    with pytest.raises(Exception, match="must be finite and >= 0"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, noise=tp.Noise(lambda t: 0.5 - t), key=key).xs.block_until_ready()
    run = jax.jit(lambda s: tp.solve(dyn, x0, t1=1.0, dt0=0.1, noise=tp.Noise(s), key=key).xs)
    with pytest.raises(Exception, match="must be finite and >= 0"):
        run(-1.0).block_until_ready()


class _Decay(tp.solvers.AbstractODE):
    def rhs(self, t, y):
        return -y
