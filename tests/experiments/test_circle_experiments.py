"""Outcomes of the tiny `instability` and `noisy-transition` runs (sphere.md §8, §12)."""

import numpy as np
import pytest
from _runs import tiny_run

from transformer_pde.experiments import get


@pytest.mark.slow
def test_instability_rates_match_the_formula(tmp_path_factory):
    res, cfg, _ = tiny_run("instability", tmp_path_factory)
    assert res["pde"].shape == (2, cfg.k_max)
    assert float(res["max_rel_error"]) < 1e-2
    np.testing.assert_allclose(res["particles"], res["theory"][0], rtol=1e-3)
    # i.i.d. particles leave the uniform law at T_n ~ log(δ√n)/λ_max: slope 1/(2λ_max) in log n
    # (tiny: n = 128..512, 4 seeds; the slope's seed scatter is ~30 %)
    T = res["follow_times"]
    assert T.shape == (3, cfg.follow_seeds) and np.all(np.isfinite(T))
    assert np.all(np.diff(res["follow_mean"]) > 0)
    assert 0.5 < float(res["follow_slope"]) / float(res["follow_slope_theory"]) < 2.0


@pytest.mark.slow
def test_noisy_transition_fold_and_threshold(tmp_path_factory):
    res, cfg, _ = tiny_run("noisy-transition", tmp_path_factory)
    np.testing.assert_allclose(res["K_bifurcation"], res["K_sharp"], rtol=1e-8)
    below, above = res["betas"] < res["beta_star"], res["betas"] > res["beta_star"]
    assert below.any() and above.any()
    assert np.all(np.isnan(res["fold"][below]))
    assert np.all(res["fold"][above] < res["K_sharp_branches"][above])


@pytest.mark.slow
def test_noisy_transition_particle_curves(tmp_path_factory):
    res, cfg, _ = tiny_run("noisy-transition", tmp_path_factory)
    r = res["particle_K_ratio"]
    P = cfg.K_points
    np.testing.assert_allclose(r[:P], np.linspace(cfg.K_lo, cfg.K_factor, P))
    np.testing.assert_allclose(r[P:], r[:P][::-1])  # up, then down
    assert cfg.dims == (2,)  # the tiny run: S¹ only (S² is tests/solvers/test_noisy_stationary.py's)
    for d in cfg.dims:
        m = res[f"particle_order_d{d}"]
        assert m.shape == (len(cfg.betas), 2 * P)
        assert np.all((m > 0) & (m <= 1))
        assert res[f"particle_order_d{d}_seeds"].shape == (len(cfg.betas), cfg.seeds, 2 * P)
        assert np.all(res[f"K_sharp_d{d}"] > 0)
    assert np.all(res["K_sharp_d2"] == res["K_sharp_branches"])


def test_noisy_transition_sweep_range_is_checked():
    with pytest.raises(ValueError, match="K_lo"):
        get("noisy-transition").make_config(K_lo=2.0, K_factor=1.5)
    with pytest.raises(ValueError, match="dims"):
        get("noisy-transition").make_config(dims=(4,))


def test_particle_sweep_below_threshold_on_the_sphere():
    """Below K_# on S² the particles stay uniform with the linear-response fluctuation of the mean:
    m = (1/n)ΣX_i is Gaussian with covariance χ/(3n)·I, χ = 1/(1 − K/K_#) (the degree-1 mode is an
    Ornstein–Uhlenbeck process whose damping (d−1)σ²/2·(1 − K/K_#) shrinks with K while its forcing
    stays that of free diffusion), so E|m| = √(8χ/(3πn)); checked over seeds (4 SE). Measured at
    K = K_#/2, n = 128: 0.1154 ± 0.0054 against 0.1152."""
    import jax

    from transformer_pde.experiments import noisy_transition as nt

    cfg = get("noisy-transition").make_config(n=128, seeds=8, run_time=30.0, dt=0.02)
    K_sharp = nt._theory_d(cfg, 1.5, 3).critical_coupling()
    with jax.enable_x64(True):
        m = nt.particle_sweeps(cfg, 3, (1.5,), np.array([[0.5, 0.5]]) * K_sharp, jax.random.key(3))[0]
    per_seed = m.mean(axis=1)
    mu, se = per_seed.mean(), per_seed.std(ddof=1) / np.sqrt(cfg.seeds)
    expected = np.sqrt(8 * 2.0 / (3 * np.pi * cfg.n))
    assert abs(mu - expected) < 4 * se, (mu, se, expected)


@pytest.mark.slow
def test_noisy_transition_draws_the_s2_branch_with_the_particles(tmp_path):
    """On S² the figure carries the zonal PDE branch: its fold for β = 4 is the continuation's
    K_c = 0.309136 (docs/math/fold_table.md), none for β = 1.5 < β_*^(3)."""
    from transformer_pde.experiments import noisy_transition as nt

    exp = get("noisy-transition")
    cfg = exp.make_config(**dict(exp.tiny, dims=(3,), degree=48))
    res = nt.compute(cfg)
    i = list(cfg.betas).index(4.0)
    assert res["s2_fold"][i] == pytest.approx(0.309136, abs=1e-6)
    assert res["s2_fold_order"][i] == pytest.approx(0.72955, abs=1e-5)
    assert np.isnan(res["s2_fold"][list(cfg.betas).index(1.5)])
    ok = np.isfinite(res["s2_K"][i])
    np.testing.assert_allclose(res["s2_K"][i][ok][0], res["K_sharp_d3"][i], rtol=1e-10)
    paths = nt.figures(res, cfg, tmp_path)
    assert all(p.stat().st_size > 1000 for p in paths)
