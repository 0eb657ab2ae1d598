"""The multi-head and spectral-selection experiments at their tiny sizes, against their predictions."""

import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp


@pytest.mark.slow
def test_multi_head_critical_beta_and_super_additive_rates(tmp_path_factory):
    res, cfg, _ = tiny_run("multi-head", tmp_path_factory)
    # the closed form, recomputed by hand: ln(1 + n(w/c − 1)) / (a(1 − ρ0))
    assert float(res["beta_c"]) == pytest.approx(np.log(1 + cfg.n * (cfg.value / cfg.repulsion - 1))
                                                 / (cfg.score * (1 - cfg.rho0)))
    final = res["rho"][:, -1]
    below = res["beta_ratios"] < 1
    assert np.all(final[below] > 0.999) and np.all(np.abs(final[~below] + 1 / (cfg.n - 1)) < 1e-3)
    assert res["max_deviation"].max() < 1e-4  # float32 particles against the reduced ODE
    # particle hitting times against the quadrature (saves every t1/(num_saves−1))
    np.testing.assert_allclose(res["hitting_time_particles"], res["hitting_time_quadrature"], rtol=0.02)
    assert float(res["excess_quadrature"]) > 0.05 and float(res["excess_particles"]) > 0.05


@pytest.mark.slow
def test_spectral_selection_end_states(tmp_path_factory):
    res, cfg, _ = tiny_run("spectral-selection", tmp_path_factory)
    for case in ("dominant", "negative"):
        k, split = tp.theory.spectral_selection.predicted_mode(res[f"{case}_eigenvalues"])
        assert np.all(res[f"{case}_mode"] == k)
        plus = res[f"{case}_plus"]
        assert np.all((plus > 0) & (plus < cfg.n)) == split and np.all((plus == 0) | (plus == cfg.n)) != split
        assert np.all(res[f"{case}_growth"] < 0)  # each end state is a stable pure mode
    # the sweep: no run ends split where the criterion makes the balanced split unstable, and
    # every end state is a pure mode the criterion calls stable
    assert np.all(res["split_fraction"][~res["balanced_split_stable"]] == 0)
    assert np.all(res["sweep_growth"] < 0)
