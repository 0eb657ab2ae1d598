"""Diagnostics (energies, attention matrix, rank, clusters) and the solver facts of sphere.md §8."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

import transformer_pde as tp
from transformer_pde.diagnostics import (
    attention_matrix,
    cluster_count,
    cluster_masses,
    clustered_pair_fraction,
    interaction_energy,
    log_interaction_energy,
    mean_token,
    normalized_energy,
    numerical_rank,
)


def _tokens(n=7, d=3, seed=0):
    return tp.uniform_sphere(jax.random.key(seed), n, d)


def _weights(n, seed=1):
    w = np.random.default_rng(seed).uniform(0.2, 1.0, n)
    return w / w.sum()


def test_energy_against_numpy_double_loop():
    x, w = np.asarray(_tokens()), _weights(7)
    D = np.diag([1.0, -0.5, 2.0])
    beta = 1.7
    ref = sum(w[i] * w[j] * np.exp(beta * x[i] @ D @ x[j]) for i in range(7) for j in range(7))
    ref /= 2 * beta
    np.testing.assert_allclose(interaction_energy(jnp.asarray(x), beta, w, D=D), ref, rtol=1e-12)
    refI = sum(np.exp(beta * x[i] @ x[j]) for i in range(7) for j in range(7)) / (2 * beta * 49)
    np.testing.assert_allclose(interaction_energy(jnp.asarray(x), beta), refI, rtol=1e-12)
    # normalized form: 2β e^{-β} E (sphere.md §2 erratum), in (0, 1]
    phi = normalized_energy(jnp.asarray(x), beta, w)
    E = float(interaction_energy(jnp.asarray(x), beta, w))
    np.testing.assert_allclose(phi, 2 * beta * np.exp(-beta) * E, rtol=1e-12)
    assert 0 < float(phi) <= 1


def test_energy_large_beta_and_plateau_values():
    # clusters of masses 3/6, 2/6, 1/6 far apart: φ = Σ m_k² up to e^{-β} terms
    a, b, c = np.eye(3)
    x = jnp.asarray([a, a, a, b, b, -a])
    np.testing.assert_allclose(normalized_energy(x, 200.0), (9 + 4 + 1) / 36, rtol=1e-12)
    np.testing.assert_allclose(normalized_energy(jnp.tile(jnp.asarray([b]), (5, 1)), 4000.0), 1.0)
    # log energy stays finite where E itself overflows
    assert np.isfinite(float(log_interaction_energy(x, 5000.0)))
    np.testing.assert_allclose(log_interaction_energy(x, 5000.0),
                               5000.0 + np.log(14 / 36) - np.log(2 * 5000.0), rtol=1e-12)


def test_attention_matrix_rank_and_mean():
    x, w = _tokens(6, 3), _weights(6)
    Q = np.random.default_rng(0).normal(size=(3, 3))
    K = np.random.default_rng(1).normal(size=(3, 3))
    P = np.asarray(attention_matrix(x, 2.0, Q=Q, K=K, weights=w))
    xn = np.asarray(x)
    logits = 2.0 * (xn @ Q.T) @ (xn @ K.T).T + np.log(w)[None]
    ref = np.exp(logits - logits.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(P, ref, rtol=1e-12)
    Pc = np.asarray(attention_matrix(x, 1.0, causal=True))
    assert np.allclose(np.triu(Pc, 1), 0) and np.allclose(Pc.sum(1), 1)
    # rank: a Boolean matrix with two distinct rows has rank 2
    B = np.zeros((6, 6))
    B[:4, 0] = 1
    B[4:, 5] = 1
    assert int(numerical_rank(B)) == 2
    assert int(numerical_rank(np.eye(5))) == 5
    assert int(numerical_rank(np.zeros((3, 3)))) == 0
    np.testing.assert_allclose(mean_token(x, w), w @ xn, rtol=1e-12)


def test_cluster_masses_and_pair_fraction():
    a, b = np.eye(3)[:2]
    x = jnp.asarray([a, b, a, a, b])
    np.testing.assert_allclose(cluster_masses(x), [0.6, 0.4, 0, 0, 0])
    w = np.array([0.1, 0.2, 0.3, 0.1, 0.3])
    np.testing.assert_allclose(cluster_masses(x, weights=w), [0.5, 0.5, 0, 0, 0])
    assert int(cluster_count(x)) == 2
    # ordered pairs i != j inside clusters: 3*2 + 2*1 = 8 of 20
    np.testing.assert_allclose(clustered_pair_fraction(x), 8 / 20)
    with pytest.raises(ValueError, match="n >= 2"):
        clustered_pair_fraction(x[:1])


def test_euclidean_clusters_are_gaps_on_the_line():
    """Single linkage with |x_i − x_j| < δ on the line splits where sorted neighbours are δ apart
    (gap_clusters, plain NumPy)."""
    pts = np.random.default_rng(3).uniform(0, 5, 40)
    x = jnp.asarray(pts[:, None])
    for gap in (0.05, 0.2, 0.5):
        assert int(cluster_count(x, gap, metric=tp.diagnostics.Euclidean())) == tp.diagnostics.gap_clusters(pts, gap)


def test_bad_input_named():
    x = _tokens()
    with pytest.raises(ValueError, match="beta must be > 0"):
        interaction_energy(x, 0.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        normalized_energy(x, float("nan"))  # any finite β is a value: β < 0 is repulsive attention
    with pytest.raises(ValueError, match="metric must be"):
        cluster_masses(x, metric="euclidean")  # a value, not a name


def test_float32():
    x = _tokens().astype(jnp.float32)
    for f in (normalized_energy(x, 3.0), interaction_energy(x, 3.0)):
        assert f.dtype == jnp.float32 and np.isfinite(float(f))
    assert attention_matrix(x, 1.0).dtype == jnp.float32


# --------------------------------------------------------------- sphere.md §8: solver facts
@pytest.mark.parametrize("model", ["SA", "USA"])
def test_stationary_configurations(model):
    """n = 1, antipodal pairs and the regular simplex are stationary (sphere.md §8.1)."""
    cls = tp.SoftmaxAttention if model == "SA" else tp.UnnormalizedAttention
    dyn = tp.Sphere(cls.identity(3, 2.5))
    v = np.array([0.6, 0.0, 0.8])
    simplex = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) / np.sqrt(3)
    for x in (v[None], np.stack([v, -v]), simplex):
        np.testing.assert_allclose(dyn.velocity(jnp.asarray(x)), 0, atol=1e-13)
    # and a generic configuration is not
    assert float(jnp.abs(dyn.velocity(_tokens(4))).max()) > 1e-2


@pytest.mark.parametrize("model", ["SA", "USA"])
def test_energy_dissipation_identity(model):
    """dE/dt along the flow equals the dissipation identity (sphere.md §1, §8.2): the
    derivative of E along tp's velocity (autodiff) against the identity written out in NumPy
    (reference.energy_rate)."""
    beta = 1.3
    cls = tp.SoftmaxAttention if model == "SA" else tp.UnnormalizedAttention
    dyn = tp.Sphere(cls.identity(3, beta))
    x = _tokens(9)
    w = jnp.asarray(_weights(9))
    v = dyn.velocity(x, w)
    _, dE = jax.jvp(lambda y: interaction_energy(y, beta, w), (x,), (v,))
    np.testing.assert_allclose(dE, ref.energy_rate(x, beta, w, normalized=model == "SA"), rtol=1e-10)
    assert float(dE) > 0


@pytest.mark.slow
def test_energy_monotone_along_solution_and_stats():
    """E non-decreasing along SA (sphere.md §8.2); diagnostics inside solve(saveat=SaveAt(fn=...)) equal
    the same functions applied to the saved states."""
    beta = 2.0
    x0 = _tokens(12)
    ts = jnp.linspace(0, 6, 25)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, beta))
    sol = tp.solve(dyn, x0, t1=6.0, dt0=0.05, saveat=diffrax.SaveAt(
        ts=ts, fn=lambda t, x, args: {"E": interaction_energy(x, beta), "phi": normalized_energy(x, beta),
                                      "m": mean_token(x)}))
    E = np.asarray(sol.stats["E"])
    assert np.all(np.diff(E) >= -1e-12) and E[-1] > E[0], E
    ref = tp.solve(dyn, x0, t1=6.0, dt0=0.05, saveat=ts)
    np.testing.assert_allclose(sol.stats["phi"], jax.vmap(lambda x: normalized_energy(x, beta))(ref.xs),
                               rtol=1e-10)
    np.testing.assert_allclose(sol.stats["m"], ref.xs.mean(axis=1), rtol=1e-10, atol=1e-14)


def test_empirical_moments_float32_at_a_million_tokens():
    """Compiled float32 moments of n = 2^20 tokens agree with float64 NumPy to 1e-6 (a single
    compiled dot over the n axis was off by 1.4e-4 here, and by 1.3e-3 at n = 2^22 inside the
    convergence study: a floor above the Monte Carlo error being measured)."""
    from transformer_pde.diagnostics.moments import empirical_moments

    x = tp.uniform_sphere(jax.random.key(0), 2**20, 3).astype(jnp.float32)
    w = jax.random.uniform(jax.random.key(1), (2**20,), jnp.float32)
    w = w / jnp.sum(w)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    for weights, ww in ((None, np.full(2**20, 2.0**-20)), (w, w64)):
        m, S = jax.jit(empirical_moments)(x, weights)
        m64 = ww @ x64
        S64 = ((x64 - m64) * ww[:, None]).T @ (x64 - m64)
        assert m.dtype == S.dtype == jnp.float32
        np.testing.assert_allclose(m, m64, atol=1e-7)
        np.testing.assert_allclose(S, S64, atol=1e-6)
