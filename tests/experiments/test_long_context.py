"""The long-context experiment: the streamed statistics against a plain NumPy softmax, the key
sampler against Archimedes, the finite-n weights against the limits of arXiv 2605.08505
(Gaussian normaliser below criticality, the Poisson limit at it) and the exponent 2/(d−1)."""

import jax
import numpy as np
import pytest
from _runs import tiny_run
from scipy import stats

from transformer_pde.experiments import long_context as lc
from transformer_pde.theory import long_context as theory


def test_streamed_statistics_match_a_plain_softmax():
    """n = 3000 keys in chunks of 1024 (the last one masked): entropy, max weight, e^H, the
    normaliser and the nearest distances against NumPy on the same keys."""
    key, n, d, chunk = jax.random.key(3), 3000, 3, 1024
    betas = np.array([0.0, 0.5, 5.0, 50.0, 500.0, 5000.0])
    st = lc.fixed_query_statistics(key, n, d, betas, chunk=chunk, top=5, seeds=2)
    for seed, sub in enumerate(jax.random.split(key, 2)):
        keys = np.concatenate([np.asarray(lc.chunk_keys(sub, i, chunk, d)[0]) for i in range(3)])[:n]
        s = keys @ np.eye(d)[0]  # the query e_1
        for j, beta in enumerate(betas):
            z = beta * s
            w = np.exp(z - z.max())
            w /= w.sum()
            nz = w > 0
            entropy = -np.sum(w[nz] * np.log(w[nz]))
            assert st["entropy"][seed, j] == pytest.approx(entropy, rel=1e-9, abs=1e-12)
            assert np.exp(st["entropy"][seed, j]) == pytest.approx(np.exp(entropy), rel=1e-9)
            assert st["max_weight"][seed, j] == pytest.approx(w.max(), rel=1e-9)
            assert st["log_partition"][seed, j] == pytest.approx(z.max() + np.log(np.sum(np.exp(z - z.max()))) - beta,
                                                                 rel=1e-9, abs=1e-9)
        np.testing.assert_allclose(st["nearest"][seed], np.sort(1 - s)[:5], rtol=1e-9, atol=1e-15)


def test_key_distances_are_archimedes_uniform_and_free_of_cancellation():
    """On S², ⟨q, k⟩ is uniform on [−1, 1] (Archimedes); u = 1 − k_1 is kept to relative
    precision however small (float32 keys: u agrees with the float64 1 − k_1 of the same normals)."""
    keys, u = lc.chunk_keys(jax.random.key(0), 0, 20000, 3)
    assert stats.kstest(1 - np.asarray(u), stats.uniform(-1, 2).cdf).pvalue > 1e-3
    np.testing.assert_allclose(np.asarray(u), 1 - np.asarray(keys)[:, 0], atol=1e-14)
    key = jax.random.key(1)
    _, u32 = lc.chunk_keys(key, 0, 2**16, 2, dtype=np.float32)
    g = np.asarray(lc.fine_normal(jax.random.fold_in(key, 0), (2**16, 2), np.float32), dtype=np.float64)
    exact = 1 - g[:, 0] / np.linalg.norm(g, axis=1)  # the same normals, in float64
    small = exact < 1e-5  # where float32's 1 − k_1 would be off by 1e-2 relative
    assert small.sum() > 50
    np.testing.assert_allclose(np.asarray(u32)[small], exact[small], rtol=1e-4)


def test_fine_normals_are_normal_and_not_on_a_grid_near_zero():
    """jax.random.normal's float32 values near 0 lie on a grid of ~3e-7 (2^20 draws put ~10 pairs
    of the ~80 below 1e-4 on one point); these have no ties there, and are N(0, 1)."""
    g = np.asarray(lc.fine_normal(jax.random.key(4), (2**20,), np.float32), dtype=np.float64)
    small = g[np.abs(g) < 1e-4]
    assert small.size > 40 and np.unique(small).size == small.size
    assert stats.kstest(g[:20000], "norm").pvalue > 1e-3
    plain = np.asarray(jax.random.normal(jax.random.key(4), (2**20,), np.float32), dtype=np.float64)
    tiny = plain[np.abs(plain) < 1e-4]
    assert np.unique(tiny).size < tiny.size  # the grid this sampler avoids


def test_below_criticality_the_normaliser_is_gaussian_and_the_entropy_is_mean_field():
    """λ = 0.01, d = 3, n = 2^12 over 400 draws: (Z/(n m) − 1)/sqrt(v/n) is N(0, 1) and the mean
    entropy is the law-of-large-numbers value; at λ = 5 the normaliser is skewed (a few keys)."""
    n, d, seeds = 2**12, 3, 400
    lams = np.array([0.01, 5.0])
    betas = lams * theory.critical_scale(n, d)
    st = lc.fixed_query_statistics(jax.random.key(7), n, d, betas, chunk=n, seeds=seeds)
    ratio = np.exp(st["log_partition"] - np.log(n * theory.mean_partition(betas, d)))
    z = (ratio - 1) / np.sqrt(theory.partition_variance(betas, d) / n)
    assert stats.kstest(z[:, 0], "norm").pvalue > 1e-3
    assert stats.skew(z[:, 1]) > 1.0 and stats.kstest(z[:, 1], "norm").pvalue < 1e-6
    h = st["entropy"][:, 0]
    assert abs(h.mean() - theory.mean_field_entropy(n, betas[0], d)) < 4 * h.std() / np.sqrt(seeds)


@pytest.mark.parametrize("d", [3, pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_at_criticality_the_weights_follow_the_poisson_limit(d):
    """β = λ (A_d n)^{2/(d−1)}, λ = 0.5, 1, 3, n = 2^12, 200 draws: mean entropy and mean largest weight
    against the n → ∞ Poisson limit (Monte Carlo of the limit law, 8000 draws)."""
    n, seeds = 2**12, 200
    lams = np.array([0.5, 1.0, 3.0])
    st = lc.fixed_query_statistics(jax.random.key(11), n, d, lams * theory.critical_scale(n, d), chunk=n, seeds=seeds)
    ent, wmax = theory.critical_limit(lams, d, samples=8000, points=300, seed=5)
    for mine, lim in ((st["entropy"], ent), (st["max_weight"], wmax)):
        se = np.sqrt(mine.var(axis=0) / seeds + lim.var(axis=0) / lim.shape[0])
        assert np.all(np.abs(mine.mean(axis=0) - lim.mean(axis=0)) < 4 * se + 0.01), (mine.mean(0), lim.mean(0), se)


@pytest.mark.slow
@pytest.mark.parametrize("d", [3, 4])
def test_the_collapse_point_grows_like_n_to_the_two_over_d_minus_one(d):
    """β_n* (e^H = 2) over n = 2^8 … 2^14, 64 draws: the fitted exponent is 2/(d−1) to 0.1, far from
    the local slope 1/log n of a log n law."""
    from transformer_pde.statistics import fit_rate

    ns = 2 ** np.arange(8, 15)
    lams = np.geomspace(0.05, 1000, 25)
    bstar = []
    for n in ns:
        betas = lams * theory.critical_scale(n, d)
        st = lc.fixed_query_statistics(jax.random.key(int(n)), int(n), d, betas, chunk=2**14, seeds=64)
        b, clipped = lc.collapse_point(betas, st["entropy"], np.log(2.0))
        assert clipped == 0
        bstar.append(b)
    fit = fit_rate(ns, np.stack(bstar))
    assert abs(fit.slope - 2 / (d - 1)) < 0.1, fit.slope
    assert fit.slope - 1 / np.log(ns).mean() > 0.4


def test_collapse_point_interpolates_in_log_beta():
    betas = np.array([1.0, 10.0, 100.0])
    h = np.array([[3.0, 1.0, 0.0], [0.5, 0.2, 0.1], [5.0, 4.0, 3.0]])
    out, clipped = lc.collapse_point(betas, h, 2.0)
    assert out[0] == pytest.approx(10**0.5) and out[1] == 1.0 and out[2] == pytest.approx(100.0) and clipped == 2


def test_gap_counting_scale_is_the_largest_log_count_over_gap():
    u = np.array([0.1, 0.2, 0.25, 0.9])  # gaps 0.1, 0.15, 0.8: log2/0.1, log3/0.15, log4/0.8
    assert lc.gap_counting_scale(u) == pytest.approx(max(np.log(2) / 0.1, np.log(3) / 0.15, np.log(4) / 0.8))


@pytest.mark.slow
def test_tiny_run_measures_exponents_with_intervals(tmp_path_factory):
    res, cfg, run_dir = tiny_run("long-context", tmp_path_factory)
    assert res["beta_star"].shape == (len(cfg.dims), len(cfg.ns), cfg.seeds)
    assert np.all(res["exponent_lo"] <= res["exponent"]) and np.all(res["exponent"] <= res["exponent_hi"])
    assert np.all(np.isfinite(res["entropy"])) and np.all(np.diff(res["entropy"], axis=-1) <= 1e-5)
    assert "| 3 | 1.000 |" in lc.exponent_table(res)
    assert (run_dir / "long-context.png").stat().st_size > 10_000


def test_layer_rows_match_a_plain_softmax():
    """Every row of the self-attention of 512 tokens (blocks of 128 rows), its own token included,
    against the dense softmax of the Gram matrix in NumPy."""
    betas = np.array([0.0, 3.0, 300.0, 3e4])
    st = lc.layer_statistics(jax.random.key(2), 512, 3, betas, block=128)
    x = st["tokens"]
    for j, beta in enumerate(betas):
        z = beta * (x @ x.T)
        w = np.exp(z - z.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        ent = -np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), axis=1)
        np.testing.assert_allclose(st["entropy"][:, j], ent, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(st["max_weight"][:, j], w.max(axis=1), rtol=1e-8)


@pytest.mark.parametrize("d", [4, pytest.param(2, marks=pytest.mark.slow)])
def test_layer_rows_at_criticality_follow_the_poisson_limit_with_the_query_as_a_key(d):
    """A row of self-attention is a fixed query (the token) against n − 1 uniform keys plus
    itself at distance 0: its mean entropy at λ = 0.5, 1, 3 is the Poisson limit with one more
    point at 0 (n = 2^11, 2 draws of the tokens), not the limit without it. (At d = 3 the two
    limits are one law: a unit-rate Poisson process seen from its first point is again one.)"""
    n = 2**11
    lams = np.array([0.5, 1.0, 3.0])
    ent = np.concatenate([lc.layer_statistics(jax.random.key(s), n, d, lams * theory.critical_scale(n, d))["entropy"]
                          for s in range(2)])
    lim, _ = theory.critical_limit(lams, d, samples=8000, points=300, seed=3, self_key=True)
    se = np.sqrt(ent.var(axis=0) / ent.shape[0] + lim.var(axis=0) / lim.shape[0])
    assert np.all(np.abs(ent.mean(axis=0) - lim.mean(axis=0)) < 4 * se + 0.01), (ent.mean(0), lim.mean(0), se)
    free, _ = theory.critical_limit(lams, d, samples=8000, points=300, seed=3)
    assert np.all(np.abs(ent.mean(axis=0) - free.mean(axis=0)) > 0.1)  # the self key matters
