"""The Gaussian closure (euclidean.md §4–5) against particles, closed forms and bounds."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.theory import gaussian as G

S0 = np.array([[0.8, 0.2], [0.2, 0.5]])
M0 = np.array([0.3, -0.5])


def _mats(seed, d=2, scale=0.5):
    rng = np.random.default_rng(seed)
    return (scale * rng.normal(size=(d, d)), scale * rng.normal(size=(d, d)), rng.normal(size=(d, d)))


def _attention(kind, d=2, seed=1):
    Q, K, V = _mats(seed, d)
    if kind == "softmax":
        return tp.SoftmaxAttention(Q, K, V, 1.0)
    if kind == "multihead":
        rng = np.random.default_rng(seed + 100)
        return tp.MultiHeadAttention(0.5 * rng.normal(size=(2, 1, d)), 0.5 * rng.normal(size=(2, 1, d)),
                                     rng.normal(size=(2, 2, d)), rng.normal(size=(2, d, 2)), 0.8)
    if kind == "l2":
        return tp.L2Attention(Q, K, V, 0.7)
    if kind == "sinkhorn":
        return tp.SinkhornAttention(Q, K, V, 1.0, epsilon=0.5, threshold=1e-14, max_iterations=5000)
    if kind == "sinkhorn-singular":  # rank-one A: the P-form needs no inverse of Ã
        return tp.SinkhornAttention(Q[:1], K[:1], V, 1.0, epsilon=0.3, threshold=1e-14,
                                    max_iterations=5000)
    raise AssertionError(kind)


def _particle_moments(xs, w):
    m = jnp.einsum("n,...nd->...d", w, xs)
    c = xs - m[..., None, :]
    return m, jnp.einsum("n,...nd,...ne->...de", w, c, c)


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


# ---------------------------------------------------------------- particles against the closure

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["softmax", "multihead", "l2", "sinkhorn", "sinkhorn-singular"])
def test_instantaneous_moments_match_gauss_hermite_particles(kind):
    # d/dt ∫x dμ = ∫Γ dμ and d/dt Cov = ∫(x−α)Γᵀ + Γ(x−α)ᵀ dμ, evaluated on the particles
    attn = _attention(kind)
    g0 = tp.Gaussian(M0, S0)
    x, w = g0.gauss_hermite(16)
    v = attn.velocity(x, w)
    c = x - g0.mean[None, :]
    dm_ref = w @ v
    dc_ref = jnp.einsum("n,nd,ne->de", w, c, v)
    dm, dc = attn.gaussian_velocity(g0.mean, g0.cov)
    assert _rel(dm, dm_ref) < 1e-10 and _rel(dc, dc_ref + dc_ref.T) < 1e-10
    # the field itself is affine, Γ(x) = Jx + c, at every node
    J, c0 = attn.affine_field(g0.mean, g0.cov)
    assert float(jnp.sum(w * jnp.max(jnp.abs(v - (x @ J.T + c0[None, :])), axis=1))) < 1e-10


def test_wrong_variants_miss():
    # the test above can fail: transposed A, softmax in place of Sinkhorn, a halved ℓ² exponent
    Q, K, V = _mats(1)
    g0 = tp.Gaussian(M0, S0)
    x, w = g0.gauss_hermite(16)

    def dcov_particles(attn):
        v = attn.velocity(x, w)
        m = jnp.einsum("n,nd,ne->de", w, x - g0.mean[None, :], v)
        return m + m.T

    pairs = [(tp.SoftmaxAttention(Q, K, V), tp.SoftmaxAttention(K, Q, V)),
             (tp.SinkhornAttention(Q, K, V, epsilon=1.0, threshold=1e-12), tp.SoftmaxAttention(Q, K, V)),
             (tp.L2Attention(Q, K, V, 1.0), tp.L2Attention(Q, K, V, 0.5))]
    for true, wrong in pairs:
        assert _rel(wrong.gaussian_velocity(g0.mean, g0.cov)[1], dcov_particles(true)) > 1e-3


@pytest.mark.parametrize("kind", [
    "softmax", "sinkhorn",
    # each costs two compilations; their fields are checked above at every node by default
    pytest.param("multihead", marks=pytest.mark.slow), pytest.param("l2", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_closure_solve_matches_gauss_hermite_particles(kind):
    """Done-when criterion of the issue: 1e-8 relative, float64, through ``tp.solve``."""
    attn = _attention(kind)
    g0 = tp.Gaussian(M0, S0)
    x, w = g0.gauss_hermite(16)
    ts = jnp.linspace(0.0, 1.0, 3)
    part = tp.solve(attn, tp.Particles(x, w), t1=1.0, dt0=0.05, saveat=ts)
    gs = tp.solve(attn, g0, t1=1.0, dt0=0.05, saveat=ts)
    m, c = _particle_moments(part.xs, w)
    assert _rel(gs.means, m) < 1e-8 and _rel(gs.covs, c) < 1e-8
    assert not bool(gs.blew_up) and bool(jnp.all(gs.reached))
    # the covariance stays exactly symmetric
    assert float(jnp.max(jnp.abs(gs.covs - jnp.swapaxes(gs.covs, 1, 2)))) == 0.0


@pytest.mark.slow
def test_closure_d3_and_time_dependent_parameters():
    # d = 3 with V(t) varying in time (every formula holds pointwise in t, euclidean.md §1)
    # (Gauss–Hermite converges slowly for strong tilts e^{yᵀAx}: keep ‖A‖ moderate)
    Q, K, V = _mats(3, d=3, scale=0.25)
    attn = tp.SoftmaxAttention(Q, K, lambda t: (1.0 - 0.5 * t) * V)
    cov = np.array([[0.6, 0.1, 0.0], [0.1, 0.5, 0.1], [0.0, 0.1, 0.4]])
    g0 = tp.Gaussian(np.array([0.2, 0.0, -0.3]), cov)
    x, w = g0.gauss_hermite(10)
    part = tp.solve(attn, tp.Particles(x, w), t1=0.6, dt0=0.05)
    gs = tp.solve(attn, g0, t1=0.6, dt0=0.05)
    m, c = _particle_moments(part.xs, w)
    assert _rel(gs.means, m) < 1e-8 and _rel(gs.covs, c) < 1e-8


@pytest.mark.slow
def test_sampling_error_decays_like_inverse_sqrt_n():
    attn = _attention("softmax")
    g0 = tp.Gaussian(M0, S0)
    # Euler (one field evaluation per step) for both: the discretization mismatch between the
    # particle and the moment schemes is far below the sampling error at these n
    euler = diffrax.Euler()
    ref = tp.solve(attn, g0, t1=0.5, dt0=0.125, solver=euler).covs[-1]
    ns, seeds, N = [32, 128, 512, 2048], 8, 2048
    # n samples padded to N with zero-weight tokens (ignored: log 0 = −inf), so that a single
    # compiled solve, vmapped over seeds, serves every n
    def err(key, n):
        x = g0.sample(key, N)
        w = jnp.where(jnp.arange(N) < n, 1.0 / n, 0.0)
        sol = tp.solve(attn, tp.Particles(x, w), t1=0.5, dt0=0.125, solver=euler)
        _, c = _particle_moments(sol.xs[-1], w)
        return jnp.sum((c - ref) ** 2)

    keys = jax.random.split(jax.random.key(0), seeds)
    errs = [float(jnp.sqrt(jnp.mean(jax.vmap(err, in_axes=(0, None))(keys, n)))) for n in ns]
    slope = np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert -0.65 < slope < -0.35, (slope, errs)


# ---------------------------------------------------------------- V = I: closed form and blow-up

def _identity_value(seed, d, sign):
    """V = I with A + Aᵀ positive definite (sign=+1) or negative semi-definite of kernel 1."""
    rng = np.random.default_rng(seed)
    if sign > 0:
        while True:
            Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
            if np.linalg.eigvalsh(K.T @ Q + Q.T @ K)[0] > 0.1:
                return Q, K
    Q = rng.normal(size=(d - 1, d))  # K = −Q: A + Aᵀ = −2QᵀQ ⪯ 0 with a kernel of dimension 1
    return Q, -Q


@pytest.mark.slow
def test_identity_value_closed_form_and_blowup_time():
    d = 3
    Q, K = _identity_value(0, d, +1)
    A = K.T @ Q
    rng = np.random.default_rng(1)
    B = rng.normal(size=(d, d))
    cov0 = B @ B.T / d + 0.2 * np.eye(d)
    g0 = tp.Gaussian(np.zeros(d), cov0)
    tstar = float(G.identity_value_blowup_time(cov0, A))
    R = np.real(np.linalg.cholesky(cov0))
    np.testing.assert_allclose(tstar, 1 / np.linalg.eigvalsh(R.T @ (A + A.T) @ R)[-1], rtol=1e-12)
    attn = tp.SoftmaxAttention(Q, K, np.eye(d))
    ts = jnp.asarray([0.25, 0.5, 0.9, 1.5]) * tstar
    pid = diffrax.PIDController(rtol=1e-11, atol=1e-12)
    sol = tp.solve(attn, g0, t1=2 * tstar, dt0=tstar / 100, saveat=ts, stepsize_controller=pid,
                   max_steps=20000)
    # before t*: Σ(t) = (Σ0⁻¹ − t(A + Aᵀ))⁻¹
    ref = jax.vmap(lambda t: G.identity_value_cov(cov0, A, t))(ts[:3])
    assert _rel(sol.covs[:3], ref) < 1e-8
    # the solve stopped at the blow-up, reports its time, and returns inf (not NaN) afterwards
    assert bool(sol.blew_up) and sol.result == diffrax.RESULTS.event_occurred
    np.testing.assert_allclose(sol.blowup_time, tstar, rtol=1e-6)
    assert sol.blowup_time <= tstar
    assert np.all(np.isinf(np.asarray(sol.covs[3]))) and not np.isnan(np.asarray(sol.covs)).any()
    np.testing.assert_array_equal(sol.reached, [True, True, True, False])
    assert float(jnp.trace(sol.final_cov)) >= float(sol.threshold)
    # Σ/tr Σ tends to rank one (euclidean.md §5.1)
    lam = np.linalg.eigvalsh(np.asarray(sol.final_cov))
    assert lam[-2] / lam[-1] < 1e-6


def test_blowup_with_constant_steps_multihead():
    # two heads of width 1, Q_h = K_h = 2e_hᵀ, V_h = e_hᵀ, W_h = e_h: A_h = 4e_he_hᵀ and
    # W_hV_h = e_he_hᵀ, so a diagonal Σ stays diagonal with Σ_hh' = 8Σ_hh²:
    # Σ_hh(t) = 1/(1/0.5 − 8t), blow-up at t* = 1/4
    g0 = tp.Gaussian(np.zeros(2), 0.5 * np.eye(2))
    mh = tp.MultiHeadAttention.split(2.0 * np.eye(2), 2.0 * np.eye(2), np.eye(2), 2)
    ts = jnp.linspace(0, 5, 11)
    sol = tp.solve(mh, g0, t1=5.0, dt0=0.01, saveat=ts)
    assert bool(sol.blew_up)
    assert abs(float(sol.blowup_time) - 0.25) <= 0.02   # constant steps: about one step
    np.testing.assert_allclose(sol.covs[0], 0.5 * np.eye(2))
    assert not np.isnan(np.asarray(sol.covs)).any()
    assert np.isfinite(np.asarray(sol.covs[:1])).all() and np.isinf(np.asarray(sol.covs[1:])).all()


def test_identity_value_convergence_to_rank_of_kernel():
    # A + Aᵀ ⪯ 0 with r = dim ker = 1: Σ(t) → Π(ΠᵀΣ0⁻¹Π)⁻¹Πᵀ at rate O(1/t) (euclidean.md §5.1)
    d = 3
    Q, K = _identity_value(2, d, -1)
    cov0 = np.array([[1.0, 0.2, 0.1], [0.2, 0.7, 0.0], [0.1, 0.0, 0.5]])
    A = K.T @ Q
    lam, U = np.linalg.eigh(A + A.T)
    Pi = U[:, np.abs(lam) < 1e-10]
    assert Pi.shape[1] == 1
    limit = Pi @ np.linalg.inv(Pi.T @ np.linalg.inv(cov0) @ Pi) @ Pi.T
    # the contracting directions are stiff near the start: adaptive steps
    sol = tp.solve(tp.SoftmaxAttention(Q, K, np.eye(d)), tp.Gaussian(np.zeros(d), cov0), t1=200.0,
                   dt0=0.01, saveat=jnp.asarray([50.0, 200.0]),
                   stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12))
    err = [np.linalg.norm(np.asarray(c) - limit) for c in sol.covs]
    assert err[1] < 0.3 * err[0] and err[1] < 0.02   # O(1/t): a factor 4 in t gives ~1/4
    np.testing.assert_allclose(sol.covs[-1], G.identity_value_cov(cov0, A, 200.0), atol=1e-8)
    assert not bool(sol.blew_up)


# ---------------------------------------------------------------- bounded growth: ℓ² and Sinkhorn

@pytest.mark.slow
def test_l2_and_sinkhorn_do_not_blow_up_where_softmax_does():
    d = 2
    Q, K = _identity_value(5, d, +1)
    g0 = tp.Gaussian(np.zeros(d), np.array([[0.6, 0.1], [0.1, 0.4]]))
    tstar = float(G.identity_value_blowup_time(g0.cov, K.T @ Q))
    t1 = 4 * tstar
    ts = jnp.linspace(0, t1, 9)
    soft = tp.solve(tp.SoftmaxAttention(Q, K, np.eye(d)), g0, t1=t1, dt0=tstar / 200, saveat=ts)
    assert bool(soft.blew_up)
    V = np.array([[1.0, 0.3], [-0.2, 0.8]])  # ‖V‖ > 1: the bound uses its operator norm
    nv = np.linalg.norm(V, 2)
    norm0 = np.linalg.norm(np.asarray(g0.cov), 2)
    for eps in (0.5, 2.0):
        sk = tp.solve(tp.SinkhornAttention(Q, K, V, epsilon=eps), g0, t1=t1, dt0=tstar / 200,
                      saveat=ts)
        assert not bool(sk.blew_up)
        norms = np.linalg.norm(np.asarray(sk.covs), 2, axis=(1, 2))
        # ‖Σ(t)‖ ≤ ‖Σ0‖ e^{2∫‖V‖} (euclidean.md §5.4)
        assert np.all(norms <= norm0 * np.exp(2 * nv * np.asarray(ts)) * (1 + 1e-10))
        assert norms[-1] > norms[0]   # it does grow: A + Aᵀ ≻ 0
    l2 = tp.solve(tp.L2Attention(Q, K, V), g0, t1=t1, dt0=tstar / 200, saveat=ts)
    assert not bool(l2.blew_up)
    # K invertible: ‖J‖ ≤ ‖V‖‖K⁻¹Q‖, so ‖Σ(t)‖ ≤ ‖Σ0‖ e^{2‖V‖‖K⁻¹Q‖t}
    rate = nv * np.linalg.norm(np.linalg.solve(K, Q), 2)
    norms = np.linalg.norm(np.asarray(l2.covs), 2, axis=(1, 2))
    assert np.all(norms <= norm0 * np.exp(2 * rate * np.asarray(ts)) * (1 + 1e-10))


def test_sinkhorn_p_form_equals_inverse_form():
    # authors' form (euclidean.md §4d) for invertible Ã: Σ' = VÃ⁻ᵀCᵀ + CÃ⁻¹Vᵀ
    Q, K, V = _mats(7, d=3, scale=0.8)
    cov = np.array([[1.0, 0.3, 0.0], [0.3, 0.8, 0.2], [0.0, 0.2, 0.6]])
    eps = 0.7
    At = K.T @ Q / eps
    w, U = np.linalg.eigh(cov)
    R, Ri = U @ np.diag(np.sqrt(w)) @ U.T, U @ np.diag(1 / np.sqrt(w)) @ U.T
    inner = R @ At.T @ cov @ At @ R
    lw, LU = np.linalg.eigh(4 * inner + np.eye(3))
    C = 0.5 * (R @ (LU @ np.diag(np.sqrt(lw)) @ LU.T) @ Ri - np.eye(3))
    ref = V @ np.linalg.inv(At).T @ C.T + C @ np.linalg.inv(At) @ V.T
    _, dc = tp.SinkhornAttention(Q, K, V, epsilon=eps).gaussian_velocity(np.zeros(3), cov)
    np.testing.assert_allclose(dc, ref, rtol=1e-10, atol=1e-12)
    # P solves P + PÃΣÃᵀP = Σ
    P = G.sinkhorn_conditional_cov(jnp.asarray(cov), jnp.asarray(At))
    np.testing.assert_allclose(P + P @ At @ cov @ At.T @ P, cov, atol=1e-12)


# ---------------------------------------------------------------- no closure, inputs, float32

def test_no_closure_raises_with_reason():
    Q, K, V = _mats(0)
    g0 = tp.Gaussian(M0, S0)
    cases = [
        (tp.SigmoidAttention(Q, K, V), "not affine"),
        (tp.UnnormalizedAttention(Q, K, V), "not affine"),
        (tp.Causal(tp.SoftmaxAttention(Q, K, V)), "no Gaussian closure"),
        (tp.Causal(tp.L2Attention(Q, K, V)), "no Gaussian closure"),
        (tp.Causal(tp.MultiHeadAttention.split(Q, K, V, 2)), "no Gaussian closure"),
        (tp.Sphere(tp.SoftmaxAttention(Q, K, V)), "sphere"),
    ]
    for dyn, why in cases:
        with pytest.raises((ValueError, NotImplementedError), match=why):
            tp.solve(dyn, g0, t1=1.0, dt0=0.1)
        # the capability is a type: a dynamics has the moment ODEs exactly when it is a closure
        # (causal attention is not one: euclidean.md §4f)
        assert not isinstance(dyn, tp.AbstractGaussianClosure)


def test_gaussian_input_validation():
    with pytest.raises(ValueError, match="symmetric"):
        tp.Gaussian(np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive definite"):
        tp.Gaussian(np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        tp.Gaussian(np.zeros(2), np.eye(3))
    with pytest.raises(ValueError, match="finite"):
        tp.Gaussian(np.array([0.0, np.nan]), np.eye(2))
    g = tp.Gaussian(np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="order"):
        g.gauss_hermite(0)
    attn = tp.SoftmaxAttention.identity(3)
    with pytest.raises(ValueError, match="dimension"):
        tp.solve(attn, g, t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match="statistics apply to particles"):
        tp.solve(tp.SoftmaxAttention.identity(2), g, t1=1.0, dt0=0.1,
                 saveat=diffrax.SaveAt(t1=True, fn=lambda t, y, args: y))
    with pytest.raises(ValueError, match=r"BlowUp threshold=1.0 must exceed tr Σ0 = 2.0"):
        tp.solve(tp.SoftmaxAttention.identity(2), g, t1=1.0, dt0=0.1, event=tp.BlowUp(1.0))


def test_gauss_hermite_and_sampling_moments():
    g = tp.Gaussian(M0, S0)
    x, w = g.gauss_hermite(5)
    m, c = _particle_moments(x, w)
    np.testing.assert_allclose(m, M0, atol=1e-14)
    np.testing.assert_allclose(c, S0, atol=1e-14)
    # fourth moment along coordinate 0: E(x−m)⁴ = 3Σ00² (exact for order >= 3)
    np.testing.assert_allclose(w @ (x[:, 0] - M0[0]) ** 4, 3 * S0[0, 0] ** 2, rtol=1e-13)
    xs = g.sample(jax.random.key(0), 20000)
    ms, cs = _particle_moments(xs, jnp.full(20000, 1 / 20000))
    np.testing.assert_allclose(ms, M0, atol=0.03)
    np.testing.assert_allclose(cs, S0, atol=0.03)


@pytest.mark.slow
def test_float32_closure_solve():
    attn = _attention("l2")
    g64 = tp.Gaussian(M0, S0)
    g32 = tp.Gaussian(M0.astype(np.float32), S0.astype(np.float32))
    s64 = tp.solve(attn, g64, t1=1.0, dt0=0.05)
    s32 = tp.solve(attn, g32, t1=1.0, dt0=0.05)
    assert s32.covs.dtype == jnp.float32 and s32.means.dtype == jnp.float32
    np.testing.assert_allclose(s32.covs, s64.covs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s32.means, s64.means, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_gaussian_velocity_refuses_a_negative_definite_covariance(jit):
    """-I is symmetric and finite but no covariance: refused naming cov (it was used silently);
    a degenerate (rank-one) covariance is a state and is accepted."""
    attn = tp.SoftmaxAttention.identity(2, 1.0)
    f = eqx.filter_jit(attn.gaussian_velocity) if jit else attn.gaussian_velocity
    with pytest.raises(Exception, match=r"cov must be positive semi-definite"):
        jax.block_until_ready(f(jnp.zeros(2), -jnp.eye(2)))
    dm, dc = f(jnp.zeros(2), jnp.array([[1.0, 0.0], [0.0, 0.0]]))
    assert np.all(np.isfinite(np.asarray(dc)))
