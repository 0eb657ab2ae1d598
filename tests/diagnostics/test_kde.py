"""Gaussian KDE modes and the 1-D mean-shift dynamics (sphere.md §6)."""

import jax.numpy as jnp
import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.diagnostics import kde
from transformer_pde.experiments.kde_modes import kde_mode_fit
from transformer_pde.models import MeanShift


def _extrema_numpy(x, beta, h, chunk=2048):
    """Plain NumPy reference: (local maxima, local minima) of P̂ itself (not of the sign of P̂')
    on a grid of step h, evaluated in chunks of grid points."""
    x = np.asarray(x)
    t = np.arange(x.min() - 5 / np.sqrt(beta), x.max() + 5 / np.sqrt(beta), h)
    p = np.concatenate([np.exp(-beta * (t[i:i + chunk, None] - x[None, :]) ** 2 / 2).sum(1)
                        for i in range(0, len(t), chunk)])
    mid, left, right = p[1:-1], p[:-2], p[2:]
    return int(np.sum((mid > left) & (mid >= right))), int(np.sum((mid < left) & (mid <= right)))


def _modes_numpy(x, beta, h):
    return _extrema_numpy(x, beta, h)[0]


def test_two_samples_bimodal_iff_separation_exceeds_two_bandwidths():
    # equal mixture of two Gaussians of s.d. s is bimodal iff the separation exceeds 2s
    beta = 50.0
    s = beta**-0.5
    assert kde.kde_critical_points([0.0, 1.9 * s], beta) == (1, 0)
    assert kde.kde_critical_points([0.0, 2.1 * s], beta) == (2, 1)


@pytest.mark.parametrize("beta", [30.0, 300.0])
def test_modes_and_minima_match_numpy_reference(beta):
    x = np.random.default_rng(1).standard_normal(300)
    modes, minima = kde.kde_critical_points(x, beta)
    # both counts against local extrema of P̂ on a fine grid (the authors' code counts minima)
    assert (modes, minima) == _extrema_numpy(x, beta, 0.01 / np.sqrt(beta))
    assert kde.kde_critical_points(x, beta, resolution=0.025) == (modes, minima)


def test_mode_fit_recovers_law():
    b = np.array([100.0, 1000.0, 10000.0])
    fit = kde_mode_fit(b, 0.5 * np.sqrt(b * np.log(b)))
    np.testing.assert_allclose(fit["slope_beta_log_beta"], 0.5, rtol=1e-12)
    np.testing.assert_allclose(fit["const"], 0.5, rtol=1e-12)
    assert fit["slope_beta"] > 0.5


def test_mean_shift_is_gradient_of_log_kde():
    x = np.random.default_rng(2).standard_normal((40, 1))
    beta = 7.0
    v = np.asarray(MeanShift(beta).velocity(x))[:, 0]
    # β^{-1} ∂_x log P̂ at the samples, by central differences of a plain NumPy KDE
    def logp(t):
        return np.log(np.exp(-beta * (t[:, None] - x[None, :, 0]) ** 2 / 2).sum(1))
    h = 1e-5
    ref = (logp(x[:, 0] + h) - logp(x[:, 0] - h)) / (2 * h) / beta
    np.testing.assert_allclose(v, ref, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="beta"):
        MeanShift(-1.0)


def test_mean_shift_float32():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((50, 1)), jnp.float32)
    sol = tp.solve(MeanShift(100.0), x, t1=2.0, dt0=0.2)
    assert sol.final.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(sol.final)))


@pytest.mark.slow
def test_experiment_kde_modes_tiny(tmp_path_factory):
    res, cfg, _ = tiny_run("kde-modes", tmp_path_factory)
    # the counts of the first run's samples (the experiment's generator, redrawn) against NumPy
    X = np.random.default_rng(cfg.seed).standard_normal(cfg.n)
    for a, b in enumerate(cfg.betas[:2]):
        assert (res["modes"][a, 0], res["minima"][a, 0]) == _extrema_numpy(X, b, 0.02 / np.sqrt(b))
    assert res.grids["modes"]["modes"].dims == ("beta", "run")
    # √(β log β): slope 1/2 against β log β (β between n^0.75 and n^1.05 here), steeper against β
    assert abs(float(res["slope_beta_log_beta"]) - 0.5) < 0.12
    assert float(res["slope_beta"]) > float(res["slope_beta_log_beta"])
    # metastable clusters of 1-D attention: increase with β, same order as the modes
    c = res["clusters"][:, 2]
    assert np.all(np.diff(c) > 0)
    ratio = c / res["modes_dynamics"]
    assert np.all((ratio > 0.5) & (ratio < 4))
    # a plateau: the count hardly changes between t and 2t
    assert np.all(np.abs(res["clusters"][:, 3] - c) <= 0.25 * c)
