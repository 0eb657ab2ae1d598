"""Mean-field convergence: the distances, the rate fit, the coupled runs and the experiment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde import convergence as cv
from transformer_pde import diagnostics as dg
from transformer_pde.statistics import fit_rate


def _models(d, key):
    kq, kk, kv = jax.random.split(key, 3)
    Q = jax.random.normal(kq, (d, d)) / np.sqrt(d)
    K = jax.random.normal(kk, (d, d)) / np.sqrt(d)
    V = jax.random.normal(kv, (d, d)) / np.sqrt(d)
    return {
        "softmax": tp.SoftmaxAttention(Q, K, V, 0.7),
        "multihead": tp.MultiHeadAttention.split(Q, K, V, 2, 0.7),
        "l2": tp.L2Attention(Q, K, V, 0.7),
        "sinkhorn": tp.SinkhornAttention(Q, K, V, 0.7, epsilon=1.3),
    }


@pytest.mark.parametrize("name", ["softmax", "multihead", "l2", "sinkhorn"])
def test_affine_field_matches_moment_odes(name):
    """Jα + c = α' and JΣ + ΣJᵀ = Σ' (euclidean.md §4, "Mechanism")."""
    d = 4
    attn = _models(d, jax.random.key(1))[name]
    A = jax.random.normal(jax.random.key(2), (d, d))
    mean, cov = jnp.linspace(-0.5, 0.5, d), A @ A.T / d + 0.3 * jnp.eye(d)
    J, c = cv.gaussian_affine_field(attn, mean, cov)
    dm, dS = attn.gaussian_velocity(mean, cov)
    np.testing.assert_allclose(J @ mean + c, dm, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(J @ cov + cov @ J.T, dS, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["softmax", "l2"])
def test_affine_field_matches_particle_field(name):
    """Γ_μ(x) of Gauss–Hermite weighted particles for μ = N(α, Σ) is the affine field Jx + c."""
    d = 2
    attn = _models(d, jax.random.key(3))[name]
    g = tp.Gaussian(jnp.array([0.3, -0.2]), jnp.array([[0.4, 0.1], [0.1, 0.3]]))
    pts, w = g.gauss_hermite(40)
    queries = jnp.array([[0.0, 0.0], [0.5, -0.4], [-0.3, 0.8]])
    J, c = cv.gaussian_affine_field(attn, g.mean, g.cov)
    np.testing.assert_allclose(attn.field(queries, pts, w), queries @ J.T + c[None, :], rtol=1e-9, atol=1e-10)


def test_no_closure_is_a_clear_error():
    attn = tp.Causal(tp.SoftmaxAttention.identity(2, 1.0))
    with pytest.raises(ValueError, match="no Gaussian closure"):
        cv.gaussian_affine_field(attn, jnp.zeros(2), jnp.eye(2))
    with pytest.raises(ValueError, match="law must be"):
        cv.convergence_study(tp.SoftmaxAttention.identity(2), "gauss", [4, 8], t1=1.0, dt0=0.1)


def test_bures_wasserstein_closed_forms():
    m1, m2 = jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, -1.0, 0.5])
    a, b = jnp.array([1.0, 4.0, 0.25]), jnp.array([9.0, 1.0, 1.0])
    # commuting covariances: |Δm|² + Σ (√a − √b)²
    expect = np.sqrt(np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    np.testing.assert_allclose(dg.bures_wasserstein(m1, jnp.diag(a), m2, jnp.diag(b)), expect, rtol=1e-12)
    # rotation invariance and symmetry on a non-commuting pair
    R = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (3, 3)))[0]
    S1, S2 = R @ jnp.diag(a) @ R.T, jnp.diag(b)
    d12 = dg.bures_wasserstein(m1, S1, m2, S2)
    np.testing.assert_allclose(d12, dg.bures_wasserstein(m2, S2, m1, S1), rtol=1e-10)
    np.testing.assert_allclose(dg.bures_wasserstein(R @ m1, R @ S1 @ R.T, R @ m2, R @ S2 @ R.T), d12,
                               rtol=1e-10)


@pytest.mark.slow
def test_sinkhorn_w2_of_a_translation_is_the_shift():
    """S_ε(μ, τ_a μ) = |a|² for every ε: the cross terms of |x − y − a|² are separable. At
    ε = 0.05 the cross problem does not reach the marginal threshold 1e-7 in 2000 iterations
    (it would raise), but its value already equals the closed form: throw=False asks for it."""
    x = jax.random.normal(jax.random.key(0), (40, 3))
    a = jnp.array([0.3, -0.4, 0.1])
    np.testing.assert_allclose(dg.sinkhorn_wasserstein(x, x + a[None, :], epsilon=0.05, threshold=1e-7, throw=False),
                               jnp.linalg.norm(a), rtol=1e-4)
    # the streamed cost (blocks of 16 points, never the 40 x 40 matrix) gives the same number
    np.testing.assert_allclose(dg.sinkhorn_wasserstein(x, x + a[None, :], epsilon=0.05, threshold=1e-7, batch_size=16,
                                                       throw=False),
                               jnp.linalg.norm(a), rtol=1e-4)


@pytest.mark.slow
def test_streamed_sinkhorn_divergence_matches_dense_with_gradients():
    from transformer_pde.diagnostics import sinkhorn_divergence

    x = jax.random.normal(jax.random.key(1), (70, 3))
    y = 0.8 * jax.random.normal(jax.random.key(2), (55, 3)) + 0.3
    b = jax.random.uniform(jax.random.key(3), (55,)) + 0.1
    b = b / b.sum()
    f = lambda bs: lambda x: sinkhorn_divergence(x, y, b=b, epsilon=0.3, threshold=1e-10, max_iterations=1000,
                                                  batch_size=bs)
    np.testing.assert_allclose(f(16)(x), f(None)(x), rtol=1e-10)
    with jax.numpy_rank_promotion("allow"):  # ott's Sinkhorn VJP broadcasts implicitly
        np.testing.assert_allclose(jax.grad(f(16))(x), jax.grad(f(None))(x), rtol=1e-7, atol=1e-12)
    with pytest.raises(ValueError, match="batch_size"):
        f(0)(x)


def test_fit_rate_recovers_a_known_slope():
    rng = np.random.default_rng(0)
    ns = 2 ** np.arange(4, 14)
    errors = 3.0 * ns[:, None] ** -0.7 * np.exp(0.2 * rng.normal(size=(ns.size, 8)))
    fit = fit_rate(ns, errors)
    assert abs(fit.slope + 0.7) < 0.05
    assert fit.slope_ci[0] < -0.7 < fit.slope_ci[1]
    lo, hi = fit.band(ns)
    assert np.all(lo < fit.predict(ns)) and np.all(fit.predict(ns) < hi)
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_rate(ns, np.where(errors > 0.1, 0.0, errors))


@pytest.mark.slow
def test_reference_run_of_the_reference_itself_has_zero_error():
    """With n = n_ref and the same samples, particles, reference and tracers coincide."""
    X = tp.uniform_sphere(jax.random.key(5), 24, 3)
    sampler = lambda key, n: X[:n]
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0))
    res = cv.convergence_study(dyn, sampler, [24], n_ref=24, t1=0.6, dt0=0.2, ts=[0.0, 0.6],
                               seeds=[0], w2_max_n=0)
    assert isinstance(res.reference, cv.ParticleReference) and res.reference.n_ref == 24
    assert str(res.reference) == "particles(24)"
    for k in ("mean", "cov", "bw", "coupling", "flow_bw"):
        np.testing.assert_allclose(res.errors[k], 0.0, atol=1e-6)
    assert np.isnan(res.errors["w2"]).all()


@pytest.mark.slow
def test_uniform_law_on_the_sphere_has_a_vanishing_field():
    """uniform_sphere_law's claim, Γ_σ = 0 under Sphere(SA): the field of an n-sample is a Monte
    Carlo error, RMS ∝ n^{-1/2} (not O(1)), for β = 1 and 4."""
    for beta in (1.0, 4.0):
        dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, beta))
        ns = np.array([256, 1024, 4096])
        speed = lambda x: float(jnp.sqrt(jnp.mean(jnp.sum(dyn.velocity(x) ** 2, axis=-1))))  # noqa: E731
        rms = [np.mean([speed(tp.uniform_sphere(jax.random.key(s), int(n), 3)) for s in range(6)]) for n in ns]
        slope = np.polyfit(np.log(ns), np.log(rms), 1)[0]
        assert -0.6 < slope < -0.4, (beta, rms)


@pytest.mark.slow
def test_stationary_reference_agrees_with_the_particle_reference():
    """Same trajectories, two references: the exact moments of σ (0, I/3) and a 4096-particle system.
    Their moment errors differ by at most the reference system's own distance to (0, I/3)."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    kw = dict(t1=0.4, dt0=0.2, ts=[0.0, 0.4], seeds=[0, 1], w2_max_n=0)
    exact = cv.convergence_study(dyn, cv.uniform_sphere_law(3), [64], **kw)
    sampler = lambda key, n: tp.uniform_sphere(key, n, 3)  # noqa: E731
    approx = cv.convergence_study(dyn, sampler, [64], n_ref=4096, **kw)
    assert isinstance(exact.reference, cv.StationaryReference)
    assert isinstance(approx.reference, cv.ParticleReference) and approx.reference.n_ref == 4096
    # the reference's own moments (it starts from jax.random.key(2**31 - 1), as the study does)
    xr = np.asarray(tp.uniform_sphere(jax.random.key(2**31 - 1), 4096, 3))
    floor_mean = np.linalg.norm(xr.mean(0))
    floor_cov = np.linalg.norm(np.cov(xr.T, bias=True) - np.eye(3) / 3)
    gap_mean = np.abs(exact.errors["mean"][..., 0] - approx.errors["mean"][..., 0])
    gap_cov = np.abs(exact.errors["cov"][..., 0] - approx.errors["cov"][..., 0])
    assert np.all(gap_mean <= floor_mean + 1e-12) and np.all(gap_cov <= floor_cov + 1e-12)
    assert np.all(exact.errors["coupling"][..., 0] < 1e-15)  # tracers start on the particles
    # later the field of σ is 0: the stationary coupling is the particles' own displacement
    assert np.all(exact.errors["coupling"][..., 1] > 0)
    np.testing.assert_allclose(exact.errors["mean"][..., 1], approx.errors["mean"][..., 1], atol=3 * floor_mean)


@pytest.mark.slow
def test_convergence_experiment_tiny(tmp_path_factory):
    """Moment errors decay at the Monte Carlo rate n^{-1/2}, with the Monte Carlo constants."""
    from transformer_pde.experiments.convergence import setup

    res, cfg, run_dir = tiny_run("convergence", tmp_path_factory)
    assert (run_dir / "convergence.png").exists() and (run_dir / "rates.csv").exists()
    assert (run_dir / "errors.csv").exists()
    metrics = list(res["metrics"])
    # t = 0: n i.i.d. samples of N(α, Σ) have E|x̄ − α|² = tr Σ / n and
    # E‖S − Σ‖²_F = (tr(Σ)² + tr(Σ²))/n + O(1/n²); averaged over all n and seeds
    _, law = setup(cfg)
    S = np.asarray(law.cov)
    ns = res["ns"][:, None]
    mean_ratio = np.mean(ns * res["err_mean"][:, :, 0] ** 2) / np.trace(S)
    cov_ratio = np.mean(ns * res["err_cov"][:, :, 0] ** 2) / (np.trace(S) ** 2 + np.trace(S @ S))
    assert abs(mean_ratio - 1) < 0.45 and abs(cov_ratio - 1) < 0.45, (mean_ratio, cov_ratio)
    grid = res.grids["errors"]
    np.testing.assert_array_equal(grid["error"].sel(metric="bw").values, res["err_bw"])
    for k in ("cov", "bw", "flow_bw"):
        for t_i in range(res["ts"].size):
            slope = res["slopes"][metrics.index(k), t_i, 0]
            assert abs(slope + 0.5) < 0.15, (k, t_i, slope)
    # the interaction adds an error of the same order n^{-1/2} (propagation of chaos)
    slope = res["slopes"][metrics.index("coupling"), -1, 0]
    assert abs(slope + 0.5) < 0.2, slope
