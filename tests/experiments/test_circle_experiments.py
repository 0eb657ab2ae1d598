"""Outcomes of the tiny `instability` and `noisy-transition` runs (sphere.md §8, §12)."""

import numpy as np
import pytest
from _runs import tiny_run

from transformer_pde.experiments import get


def test_instability_rates_match_the_formula(tmp_path_factory):
    res, cfg, _ = tiny_run("instability", tmp_path_factory)
    assert res["pde"].shape == (2, cfg.k_max)
    assert float(res["max_rel_error"]) < 1e-2
    np.testing.assert_allclose(res["particles"], res["theory"][0], rtol=1e-3)


def test_noisy_transition_fold_and_threshold(tmp_path_factory):
    res, cfg, _ = tiny_run("noisy-transition", tmp_path_factory)
    np.testing.assert_allclose(res["K_bifurcation"], res["K_sharp"], rtol=1e-8)
    below, above = res["betas"] < res["beta_star"], res["betas"] > res["beta_star"]
    assert below.any() and above.any()
    assert np.all(np.isnan(res["fold"][below]))
    assert np.all(res["fold"][above] < res["K_sharp_branches"][above])


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
