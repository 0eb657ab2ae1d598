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


def test_particle_curves_are_refused_until_noise_lands():
    with pytest.raises(ValueError, match="noise"):
        get("noisy-transition").make_config(particles=True)
